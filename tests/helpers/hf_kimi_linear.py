"""An independent PyTorch reference for Kimi Linear: transformers' `KimiLinearForCausalLM`, loaded
by transformers itself from a checkpoint folder in the published layout (its own conversion
renames `block_sparse_moe`, stacks the three short convs and the experts), run in float32 with
eager attention, and traced by stepper's names in stepper's layouts. It shares no code with stepper.

The tensors come from forward hooks on transformers' modules, from wrappers around the module-level
functions `causal_conv1d_fn`, `causal_conv1d_update`, `chunk_kimi_delta_attention`,
`recurrent_kimi_delta_attention` and `eager_attention_forward` (restored in a `finally`), and, for
values transformers keeps only in local variables, a few torch derivations from captured tensors:

* q_unit / k_unit: transformers' own `l2norm` on the captured query and key;
* the state after each token: transformers' `recurrent_kimi_delta_attention` run one token at a
  time from the captured initial state; after each chunk: the states at the chunk ends;
* delta_t = k_t^T (S_t - diag(exp g_t) S_{t-1}) / (k_t . k_t) (the write is rank one: k_t delta_t^T);
* o_norm: the o_norm module called with a gate of 100 (sigmoid(100) is 1.0 in float32);
* the router's scores, scores_for_choice, group_scores and group_mask as its forward makes them;
* the attention scores: the eager product with -inf where the additive mask blocks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers.models.kimi_linear.modeling_kimi_linear as hf
from transformers import KimiLinearForCausalLM
from transformers.cache_utils import DynamicCache

torch.set_num_threads(1)

CHUNK = 64


def load(folder: Path) -> KimiLinearForCausalLM:
    return KimiLinearForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


def heads_first(t: torch.Tensor) -> np.ndarray:
    """[B, T, H, X] -> [B, H, T, X]"""
    return t.transpose(1, 2).detach().numpy().copy()


def trace(model: KimiLinearForCausalLM, ids: np.ndarray, decode_ids: np.ndarray,
          start: int = 0) -> dict[str, np.ndarray]:
    """Prefill `ids` [B, T] at positions start .. start+T-1 (an empty cache), then one decode step
    per column of `decode_ids` [B, n]: every tensor by its stepper name
    (`prefill.layers.0.self_attn.q_conv`, `decode0.logits`)."""
    return Tracer(model).run(ids, decode_ids, start)


FUNCTIONS = ("causal_conv1d_fn", "causal_conv1d_update", "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention",
             "eager_attention_forward")


class Tracer:
    """Hooks on transformers' modules and wrappers of its module-level functions, each writing what
    it sees under stepper's name into `out`, scoped by the phase and layer running."""

    hf = hf  # the modeling module whose functions are wrapped, and its classes that tell the layers apart
    delta_attention, moe = "KimiLinearDeltaAttention", "KimiLinearMoE"
    functions = FUNCTIONS
    merged = "self_attn.attn_output"  # what o_proj reads in an MLA layer

    def __init__(self, model: KimiLinearForCausalLM):
        self.model, self.cfg = model, model.config
        self.out: dict[str, np.ndarray] = {}
        self.phase, self.layer = "prefill", None
        self.hooks: list = []
        self.originals = {name: getattr(self.hf, name) for name in self.functions}

    def put(self, key: str, array) -> None:
        scope = self.phase + ("" if self.layer is None else f".layers.{self.layer}")
        self.out[f"{scope}.{key}"] = array.detach().numpy().copy() if isinstance(array, torch.Tensor) else array

    def hook(self, module, fn) -> None:
        self.hooks.append(module.register_forward_hook(fn))

    def output(self, module, key: str, view=lambda o: o) -> None:
        """The module's output under `key` (after `view`)."""
        self.hook(module, lambda m, a, o: self.put(key, view(o)))

    def input(self, module, key: str) -> None:
        """The module's first input under `key`."""
        self.hooks.append(module.register_forward_pre_hook(lambda m, a: self.put(key, a[0])))

    def run(self, ids: np.ndarray, decode_ids: np.ndarray, start: int = 0) -> dict[str, np.ndarray]:
        self.wrap_functions()
        try:
            for i, layer in enumerate(self.model.model.layers):
                self.layer_hooks(i, layer)
            self.outer(self.model.model.embed_tokens, "embed")
            self.outer(self.model.model.norm, "norm")
            cache = DynamicCache(config=self.cfg)
            steps = [("prefill", ids)] + [(f"decode{j}", decode_ids[:, j : j + 1]) for j in range(decode_ids.shape[1])]
            position = start
            with torch.no_grad():
                for phase, step_ids in steps:
                    self.phase, self.layer = phase, None
                    positions = torch.arange(position, position + step_ids.shape[1])[None]
                    position += step_ids.shape[1]
                    logits = self.model(torch.tensor(step_ids), position_ids=positions, cache=cache,
                                        use_cache=True).logits
                    self.layer = None
                    self.put("logits", logits)
        finally:
            for name, fn in self.originals.items():
                setattr(self.hf, name, fn)
            for h in self.hooks:
                h.remove()
        return self.out

    def outer(self, module, key: str) -> None:
        """A tensor outside the layers (the embedding, the final norm)."""
        def fn(m, a, o):
            layer, self.layer = self.layer, None
            self.put(key, o)
            self.layer = layer
        self.hook(module, fn)

    def layer_hooks(self, i: int, layer) -> None:
        def enter(module, args, kwargs):
            self.layer = i
            self.put("hidden_states", args[0] if args else kwargs["hidden_states"])

        self.hooks.append(layer.register_forward_pre_hook(enter, with_kwargs=True))
        self.output(layer.input_layernorm, "input_layernorm")
        self.input(layer.post_attention_layernorm, "attn_residual")
        self.output(layer.post_attention_layernorm, "post_attention_layernorm")
        self.output(layer.mlp, "mlp_output")
        self.output(layer, "output")
        if isinstance(layer.self_attn, getattr(self.hf, self.delta_attention)):
            self.kda_hooks(layer.self_attn)
        else:
            self.mla_hooks(layer.self_attn)
        if isinstance(layer.mlp, getattr(self.hf, self.moe)):
            self.moe_hooks(layer.mlp)
        else:
            self.output(layer.mlp.gate_proj, "mlp.gate_proj")
            self.output(layer.mlp.up_proj, "mlp.up_proj")
            self.input(layer.mlp.down_proj, "mlp.act")

    def kda_hooks(self, attn) -> None:
        for name in ("q", "k", "v"):
            self.output(getattr(attn, f"{name}_proj"), f"self_attn.{name}_proj")
        self.output(attn.forget_gate, "self_attn.forget_gate", heads_first)
        self.output(self.output_gate(attn), "self_attn.output_gate",
                    lambda o: heads_first(o.view(*o.shape[:2], -1, attn.head_dim)))

        def norm_out(m, a, o):
            hidden, gate = a
            self.put("self_attn.gated_output", heads_first(o))
            self.put("self_attn.o_norm", heads_first(m.forward(hidden, torch.full_like(gate, 100.0))))  # no hooks

        self.hook(attn.o_norm, norm_out)
        self.input(attn.o_proj, "self_attn.attn_output")
        self.output(attn.o_proj, "self_attn.o_proj")

    @staticmethod
    def output_gate(attn):
        """The module whose output is the KDA output gate's logits."""
        return attn.g_b_proj

    def mla_hooks(self, attn) -> None:
        H, qk, nope = self.cfg.num_attention_heads, attn.qk_head_dim, attn.qk_nope_head_dim

        def q_out(m, a, o):
            q = o.view(*o.shape[:2], H, qk).transpose(1, 2)
            self.put("self_attn.q", q)
            self.put("self_attn.q_nope", q[..., :nope])
            self.put("self_attn.q_pe", q[..., nope:])

        def kv_a_out(m, a, o):
            B, T = o.shape[:2]
            self.put("self_attn.kv_a", o)
            self.put("self_attn.compressed_kv", o[..., : attn.kv_lora_rank])
            self.put("self_attn.k_pe", o[..., attn.kv_lora_rank :].reshape(B, 1, T, -1))
            self.new = T

        def kv_b_out(m, a, o):  # over every cached position: the new ones are the last T
            B, _, S, _ = o.shape
            kv = o.view(B, S, H, -1).transpose(1, 2)[:, :, S - self.new :]
            self.put("self_attn.kv", kv)
            self.put("self_attn.k_nope", kv[..., :nope])

        self.hook(attn.q_proj, q_out)
        self.hook(attn.kv_a_proj_with_mqa, kv_a_out)
        self.output(attn.kv_a_layernorm, "self_attn.compressed_kv_norm")
        self.hook(attn.kv_b_proj, kv_b_out)
        self.input(attn.o_proj, self.merged)
        self.output(attn.o_proj, "self_attn.o_proj")

    def moe_hooks(self, mlp) -> None:
        def gate_out(m, a, o):  # the router's intermediates, as its forward makes them
            logits, weights, idx = o
            scores = logits.sigmoid()
            choice = scores + m.e_score_correction_bias
            group_scores = choice.view(-1, m.num_group, m.num_experts // m.num_group).topk(2, dim=-1)[0].sum(dim=-1)
            mask = torch.zeros(choice.shape[0], m.num_group)
            mask.scatter_(1, torch.topk(group_scores, k=m.topk_group, dim=-1)[1], 1)
            for key, value in (("logits", logits), ("scores", scores), ("scores_for_choice", choice),
                               ("group_scores", group_scores), ("group_mask", mask), ("topk_idx", idx),
                               ("topk_weight", weights)):
                self.put(f"mlp.gate.{key}", value)

        self.hook(mlp.gate, gate_out)
        self.hooks.append(mlp.register_forward_pre_hook(lambda m, a: setattr(self, "shape", a[0].shape)))
        self.output(mlp.experts, "mlp.routed_output", lambda o: o.view(*self.shape))
        self.output(mlp.shared_experts, "mlp.shared_output")

    def wrap_functions(self) -> None:
        self.hf.causal_conv1d_fn = self.conv(self.originals["causal_conv1d_fn"])
        self.hf.causal_conv1d_update = self.conv(self.originals["causal_conv1d_update"])
        self.hf.chunk_kimi_delta_attention = self.delta_rule(self.originals["chunk_kimi_delta_attention"])
        self.hf.recurrent_kimi_delta_attention = self.delta_rule(self.originals["recurrent_kimi_delta_attention"])
        self.hf.eager_attention_forward = self.eager(self.originals["eager_attention_forward"])

    def conv(self, fn):
        def traced(*args, **kwargs):
            mixed = fn(*args, **kwargs)  # [B, 3*H*K, T] after SiLU
            for name, part in zip("qkv", mixed.transpose(1, 2).chunk(3, dim=-1)):
                self.put(f"self_attn.{name}_conv", part)
            return mixed
        return traced

    def delta_rule(self, fn):
        def traced(query, key, value, g, beta, initial_state=None, **kwargs):
            core, final = fn(query, key, value, g=g, beta=beta, initial_state=initial_state, **kwargs)
            self.delta_rule_tensors(query, key, value, g, beta, initial_state, core, final)
            return core, final
        return traced

    def delta_rule_tensors(self, query, key, value, g, beta, initial_state, core, final) -> None:
        q, k = self.hf.l2norm(query.float(), eps=1e-6), self.hf.l2norm(key.float(), eps=1e-6)
        for name, array in (("q_unit", heads_first(q)), ("k_unit", heads_first(k)), ("beta", beta.transpose(1, 2)),
                            ("core_out", heads_first(core)), ("state", final)):
            self.put(f"self_attn.{name}", array)
        B, T, H, K = key.shape
        S = torch.zeros(B, H, K, value.shape[-1]) if initial_state is None else initial_state.clone()
        states, deltas = [], []
        for t in range(T):  # transformers' recurrent form, one token at a time
            previous = S
            _, S = self.originals["recurrent_kimi_delta_attention"](
                query[:, t : t + 1], key[:, t : t + 1], value[:, t : t + 1], g=g[:, t : t + 1], beta=beta[:, t : t + 1],
                initial_state=S, output_final_state=True, use_qk_l2norm_in_kernel=True)
            written = S - previous * g[:, t].exp()[..., None]  # [B, H, K, V]: k_t delta_t^T
            deltas.append((k[:, t][..., None] * written).sum(-2) / (k[:, t] * k[:, t]).sum(-1, keepdim=True))
            states.append(S)
        per_token = torch.stack(states, dim=2)  # [B, H, T, K, V]
        ends = list(range(CHUNK - 1, T, CHUNK)) + ([T - 1] if T % CHUNK else [])
        self.put("self_attn.delta", torch.stack(deltas, dim=2))
        self.put("self_attn.state_per_token", per_token)
        self.put("self_attn.state_per_chunk", per_token[:, :, ends])

    def eager(self, fn):
        def traced(module, query, key, value, attention_mask, scaling, **kwargs):
            output, weights = fn(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
            scores = torch.matmul(query, key.transpose(2, 3)) * scaling
            if attention_mask is not None:
                scores = scores.masked_fill((attention_mask != 0).expand_as(scores), float("-inf"))
            for name, array in (("query_states", query), ("key_states", key), ("value_states", value),
                                ("attn_scores", scores), ("attn_weights", weights)):
                self.put(f"self_attn.{name}", array)
            return output, weights
        return traced
