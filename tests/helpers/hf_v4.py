"""transformers' DeepseekV4ForCausalLM as the reference for DeepSeek-V4: a tiny published config,
the transformers config of the same model, a float32 model with random weights (every parameter
that its init leaves at zero or one given random values, so each one matters), those weights by
stepper's names, and a trace of the named tensors by forward hooks.

Hooks see module outputs only; a tensor inside a module (hc_pre's pre and mixes, the comb matrix
before Sinkhorn) is recomputed in torch from the module's own parameters, line by line as the
module's forward computes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tests.helpers.compare import RTOL, compare, rel_err

# A tiny V4: a sliding layer, a CSA layer (ratio 4, the indexer) and an HCA layer (ratio 8, so a
# short prompt closes several windows), the first two layers hash-routed; then the MTP block's entry.
TINY_V4: dict[str, Any] = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "_name_or_path": "tiny-v4-test",
    "vocab_size": 96,
    "hidden_size": 64,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "q_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 32,
                     "beta_slow": 1},
    "max_position_embeddings": 128,
    "sliding_window": 8,
    "o_groups": 2,
    "o_lora_rank": 16,
    "index_n_heads": 8,  # with 2, every head's relu is often 0 and ties at score 0 make the top-k ambiguous
    "index_head_dim": 16,
    "index_topk": 3,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "num_hash_layers": 2,
    "swiglu_limit": 1.0,
    "compress_ratios": [0, 4, 8, 4, 0],
    "num_nextn_predict_layers": 1,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                            "weight_block_size": [128, 128]},
    "expert_dtype": "fp4",
}

HCA_RATE = "heavily_compressed_attention"
CSA_RATE = "compressed_sparse_attention"


def hf_config(published: dict[str, Any]):
    """transformers' config of the model a published config.json describes (HCA layers must share
    one ratio: transformers keeps one per layer type)."""
    from transformers import DeepseekV4Config

    layers = published["num_hidden_layers"]
    ratios = published["compress_ratios"][:layers]
    hca = {r for r in ratios if r not in (0, 4)}
    assert len(hca) <= 1, "transformers keeps one HCA ratio"
    kinds = {0: "sliding_attention", 4: CSA_RATE}
    yarn = published.get("rope_scaling")
    rope = None if yarn is None else {"rope_type": "yarn", **{k: v for k, v in yarn.items() if k != "type"}}
    fields = {k: v for k, v in published.items()
              if k not in ("architectures", "model_type", "_name_or_path", "compress_ratios", "num_hash_layers",
                           "qk_rope_head_dim", "rope_scaling", "quantization_config", "expert_dtype",
                           "norm_topk_prob", "hidden_act", "scoring_func")}
    config = DeepseekV4Config(
        **fields,
        layer_types=[kinds.get(r, HCA_RATE) for r in ratios],
        compress_rates={CSA_RATE: 4, HCA_RATE: next(iter(hca), 128)},
        mlp_layer_types=["hash_moe" if i < published["num_hash_layers"] else "moe" for i in range(layers)],
        partial_rotary_factor=published["qk_rope_head_dim"] / published["head_dim"],
        rope_parameters=rope,
    )
    config._attn_implementation = "eager"
    return config


def random_model(published: dict[str, Any], seed: int = 0):
    """A float32 DeepseekV4ForCausalLM whose every parameter and buffer is random: the
    hyper-connections' base and scale, sinks, position biases, router bias and tid2eid too."""
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(hf_config(published)).float().eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight")):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=generator))
            elif name.endswith((".scale", "hc_scale")):
                p.copy_(0.5 + torch.rand(p.shape, generator=generator))
            elif p.dim() >= 2 and not name.endswith(("position_bias", "embed_tokens.weight")):
                p.copy_(torch.randn(p.shape, generator=generator) / p.shape[-1] ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * (0.1 if name.endswith(".base") else 1))
        experts = published["n_routed_experts"]
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                b.copy_(torch.stack([torch.randperm(experts, generator=generator)[: b.shape[1]]
                                     for _ in range(b.shape[0])]))
            elif name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=generator))
    return model


def stepper_arrays(model, published: dict[str, Any]) -> dict[str, np.ndarray]:
    """The model's weights by stepper's names: the routed experts split one by one, gate (w1) and
    up (w3) from the packed gate_up_proj."""
    inter = published["moe_intermediate_size"]
    out: dict[str, np.ndarray] = {}
    for name, t in list(model.state_dict().items()):
        a = t.detach().cpu().numpy()
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name.removesuffix("gate_up_proj")
            for e in range(a.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = a[e, :inter].copy()
                out[f"{prefix}{e}.up_proj.weight"] = a[e, inter:].copy()
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name.removesuffix("down_proj")
            for e in range(a.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = a[e].copy()
        elif "rotary_emb" not in name:
            out[name] = a.copy()
    return out


def load_arrays(model, arrays: dict[str, np.ndarray], published: dict[str, Any]) -> None:
    """stepper_arrays' inverse: set the model's weights from stepper's names (a checkpoint's tensors
    dequantized), the experts packed back."""
    state = model.state_dict()
    layers = published["num_hidden_layers"]
    for i in range(layers):
        prefix = f"model.layers.{i}.mlp.experts."
        e = published["n_routed_experts"]
        state[prefix + "gate_up_proj"] = torch.from_numpy(np.stack([
            np.concatenate([arrays[f"{prefix}{j}.gate_proj.weight"], arrays[f"{prefix}{j}.up_proj.weight"]])
            for j in range(e)]))
        state[prefix + "down_proj"] = torch.from_numpy(np.stack([arrays[f"{prefix}{j}.down_proj.weight"]
                                                                 for j in range(e)]))
    for name, a in arrays.items():
        if ".mlp.experts." not in name:
            state[name] = torch.from_numpy(np.asarray(a)).to(state[name].dtype)
    model.load_state_dict(state)


class Trace:
    """Named tensors of one transformers forward, by stepper's names (layer-scoped `layers.{i}.`)."""

    def __init__(self, model):
        self.model = model
        self.tensors: dict[str, np.ndarray] = {}
        self.handles = []

    def __enter__(self) -> Trace:  # noqa: PYI034
        inner = self.model.model
        self._hook(inner.hc_head, self.head)
        self._hook(inner.norm, lambda m, a, o: self.put("final_norm", o))
        self._hook(self.model.lm_head, lambda m, a, o: self.put("logits", o))
        for i, layer in enumerate(inner.layers):
            s = f"layers.{i}."
            self._hook(layer, lambda m, a, o, s=s: self.put(s + "ffn_streams", o, s + "streams", a[0]))
            if i == 0:  # its input: the embedding in every stream
                self._hook(layer, lambda m, a, o: self.put("embed_streams", a[0]))
            for module, site in (("attn_hc", "hc_attn"), ("ffn_hc", "hc_ffn")):
                self._hook(getattr(layer, module), lambda m, a, o, s=s, site=site: self.hc(m, a, o, s + site))
            self._hook(layer.input_layernorm, lambda m, a, o, s=s: self.put(s + "attn_norm", o))
            self._hook(layer.self_attn, lambda m, a, o, s=s: self.put(s + "attn_output", o[0]))
            self._hook(layer.post_attention_layernorm, lambda m, a, o, s=s: self.put(s + "ffn_norm", o))
            self._hook(layer.mlp.gate, lambda m, a, o, s=s: self.gate(m, o, s))
            self._hook(layer.mlp.experts, lambda m, a, o, s=s: self.put(s + "ffn.routed_output", o))
            self._hook(layer.mlp.shared_experts, lambda m, a, o, s=s: self.put(s + "ffn.shared_output", o))
            self._hook(layer.mlp, lambda m, a, o, s=s: self.put(s + "ffn_output", o))
            compressor = layer.self_attn.compressor
            if compressor is not None:  # its output: every entry made so far, and the mask over them
                # [B, 1, E, D]: one kv head
                self._hook(compressor, lambda m, a, o, s=s: self.put(s + "attn.entries", o[0][:, 0]))
            if getattr(compressor, "indexer", None) is not None:  # the entries each query keeps, -1 for none
                self._hook(compressor.indexer, lambda m, a, o, s=s: self.keep(s + "attn.indexer.chosen", o))
        return self

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()

    def _hook(self, module, fn) -> None:
        self.handles.append(module.register_forward_hook(fn))

    def put(self, name: str, t: torch.Tensor, *more) -> None:
        """Keep t as name (and each further name, tensor pair); None, so a hook changes nothing."""
        self.tensors[name] = t.detach().float().cpu().numpy().copy()
        if more:
            self.put(*more)

    def keep(self, name: str, t: torch.Tensor) -> None:
        """Keep integer choices as they are."""
        self.tensors[name] = t.detach().cpu().numpy().copy()

    def hc(self, m, args, out, site: str) -> None:
        """post, comb and collapsed from the module; mixes, pre and comb before Sinkhorn made as
        its forward makes them."""
        post, comb, collapsed = out
        streams = args[0]
        n = m.hc_mult
        mixes = F.linear(m.input_norm(streams.flatten(2).float()), m.fn.float())
        pre_w, _, comb_w = mixes.split([n, n, n * n], dim=-1)
        pre_b, _, comb_b = m.base.split([n, n, n * n])
        pre = torch.sigmoid(pre_w * m.scale[0] + pre_b) + m.hc_eps
        soft = torch.softmax(comb_w.view(*comb_w.shape[:-1], n, n) * m.scale[2] + comb_b.view(n, n), dim=-1) + m.hc_eps
        for key, t in (("mixes", mixes), ("pre", pre), ("post", post), ("comb_softmax", soft), ("comb", comb),
                       ("collapsed", collapsed)):
            self.put(f"{site}.{key}", t)
        if site.endswith("hc_ffn"):  # its input: the streams after attention
            self.put(site.removesuffix("hc_ffn") + "attn_streams", streams)

    def head(self, m, args, out) -> None:
        streams = args[0]
        mixes = F.linear(m.input_norm(streams.flatten(2).float()), m.hc_fn.float())
        self.put("hc_head.mixes", mixes)
        self.put("hc_head.pre", torch.sigmoid(mixes * m.hc_scale.float() + m.hc_base.float()) + m.eps)
        self.put("hc_head.collapsed", out)

    def gate(self, m, out, s: str) -> None:
        logits, weights, indices = out
        self.put(s + "ffn.gate.logits", logits)
        self.put(s + "ffn.gate.scores", F.softplus(logits).sqrt())
        self.put(s + "ffn.gate.weights", weights)
        self.keep(s + ("ffn.gate.hash_idx" if hasattr(m, "tid2eid") else "ffn.gate.topk_idx"), indices)


def trace(model, ids: np.ndarray, cache=None, positions: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Run the model on ids [B, T] (continuing `cache` when given) and return its named tensors."""
    with Trace(model) as t, torch.no_grad():
        kwargs = {} if positions is None else {"position_ids": torch.from_numpy(positions)[None]}
        model(input_ids=torch.from_numpy(ids), cache=cache, use_cache=cache is not None, **kwargs)
    return t.tensors


def both_runs(published: dict[str, Any], folder, prompt_len: int, steps: int, settle_ties: bool = False):
    """stepper and transformers on the same weights: a checkpoint of `published` written by stepper
    synth to `folder` (seed 7), read back by stepper, exactly dequantized into transformers' model
    (seed 1 for the rest), a seeded prompt of `prompt_len` ids, then `steps` greedy decode steps
    fed to both. -> stepper's tensors, transformers' (trace_steps), stepper's run result, and the
    rows whose tied picks transformers took from stepper (with `settle_ties`)."""
    from stepper.families.deepseek_v4_checkpoint import V4Checkpoint
    from stepper.families.deepseek_v4_config import V4Config
    from stepper.families.deepseek_v4_synth import synth_v4_checkpoint
    from stepper.families.deepseek_v4_weights import weight_shapes
    from stepper.seams.trace import Recorder
    from stepper.session import RunSpec, run

    cfg = V4Config.from_hf(published, "tiny")
    checkpoint = V4Checkpoint(synth_v4_checkpoint(cfg, folder, seed=7))
    model = random_model(published, seed=1)
    load_arrays(model, {name: np.array(checkpoint.get(name)) for name in weight_shapes(cfg)}, published)
    prompt = [int(i) for i in np.random.default_rng(2).integers(0, cfg.vocab_size, prompt_len)]
    recorder = Recorder()
    result = run(RunSpec(model=str(folder), ids=tuple(prompt), decode=steps), [recorder], checkpoint)
    mine = recorder.tensors()
    ref, settled = trace_steps(model, prompt, result.generated, mine if settle_ties else None)
    return mine, ref, result, settled


def trace_steps(model, prompt: list[int], generated: list[int],
                mine: dict | None = None) -> tuple[dict[str, np.ndarray], list[tuple[int, int]]]:
    """transformers' named tensors of a prefill of `prompt` then one decode step per generated
    token, with one cache, each name prefixed by its phase (prefill., decode0., ...); given
    stepper's tensors `mine`, its indexer takes stepper's picks where the two tie (`Ties`), and
    the (layer, position) of each such row is returned with the tensors."""
    from transformers import DynamicCache

    ref, cache, position = {}, DynamicCache(config=model.config), 0
    feed = [np.array([prompt])] + [np.array([[token]]) for token in generated]
    ties = Ties(model, mine or {})
    for step, ids in enumerate(feed):
        ties.phase = "prefill" if step == 0 else f"decode{step - 1}"
        positions = np.arange(position, position + ids.shape[1])
        ref |= {f"{ties.phase}.{k}": v for k, v in trace(model, ids, cache, positions).items()}
        position += ids.shape[1]
    ties.remove()
    return ref, ties.settled


class Ties:
    """transformers' indexers keeping stepper's picks (`mine`, by phase) in a row where the two
    pick different entries of equal score: a top-k over tied scores (a long prompt's rows where few
    entries score above 0, the rest relu's exact 0) is any implementation's choice, and the layers
    after it are compared on the same entries. A row whose picks differ otherwise is left as
    transformers made it, so the comparison of the choices fails on it. `settled`: (layer,
    position) of each row taken."""

    def __init__(self, model, mine: dict[str, np.ndarray]):
        self.mine, self.phase, self.scores, self.handles = mine, "", None, []
        self.settled: list[tuple[int, int]] = []
        for i, layer in enumerate(model.model.layers):
            indexer = getattr(layer.self_attn.compressor, "indexer", None)
            if indexer is not None and mine:
                self.handles += [indexer.scorer.register_forward_hook(lambda m, a, o: setattr(self, "scores", o)),
                                 indexer.register_forward_hook(lambda m, a, o, i=i: self.settle(m, i, a[2], o))]

    def settle(self, indexer, layer: int, positions: torch.Tensor, picks: torch.Tensor) -> torch.Tensor:
        theirs, scores = picks.numpy(), self.scores.numpy()  # [B, S, k]; [B, S, E] before the causal mask
        mine = self.mine[f"{self.phase}.layers.{layer}.attn.indexer.chosen"]
        ready = ((positions + 1) // indexer.compress_rate).numpy()  # [B, S]: the entries each query may pick
        out = theirs.copy()
        for b, t in zip(*np.nonzero((np.sort(mine, -1) != np.sort(theirs, -1)).any(-1))):
            a, c = mine[b, t][mine[b, t] >= 0], theirs[b, t][theirs[b, t] >= 0]
            if len(a) == len(c) and (a < ready[b, t]).all() and \
                    np.array_equal(np.sort(scores[b, t, a]), np.sort(scores[b, t, c])):
                out[b, t] = mine[b, t]
                self.settled.append((layer, int(positions[b, t])))
        return torch.from_numpy(out)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def v4_compare(name: str, mine: dict, ref: dict) -> str | None:
    """None if stepper's tensor `name` matches transformers', else what differs: choices (experts,
    the indexer's entries) as sets per row (transformers' top-k is unsorted), the experts' weights
    in the order of their experts, every other tensor by relative error (tests.helpers.compare)."""
    if name.endswith(("_idx", "indexer.chosen")):
        same = np.array_equal(np.sort(mine[name], axis=-1), np.sort(ref[name], axis=-1))
        return None if same else "different choices"
    if name.endswith("ffn.gate.weights"):
        stem = name.removesuffix("weights")
        idx = next(stem + k for k in ("topk_idx", "hash_idx") if stem + k in mine)
        a = np.take_along_axis(mine[name], np.argsort(mine[idx], axis=1), axis=1)
        b = np.take_along_axis(ref[name], np.argsort(ref[idx], axis=1), axis=1)
        err = rel_err(a, b)
        return None if err <= RTOL else f"relative error {err:.2e}"
    return compare(name, mine, ref)
