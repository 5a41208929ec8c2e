"""transformers' own models of the MLA families stepper reads through stepper/families, traced by
name like helpers.hf_reference traces DeepSeek-V3, whose recorder and derivations this module
reuses: importing it registers each family there (hf_reference.register) with its modeling module,
its rope function and the steps of what it adds (hooks for its own tensors, their derivations,
another router). Derivations repeat transformers' own ops on captured tensors (noted on each).

Sarvam, Youtu, GLM-4.7-Flash, A.X-K1 and Mistral 4 are loaded the way a user loads the published
checkpoint, `from_pretrained` on a folder (which `stepper synth` writes in the family's published
layout), float32, eager attention and experts; a parameter it does not load or a checkpoint tensor
it does not use is an error (beyond those the family's transformers code itself ignores, as
A.X-K1's dense layers' post_mlp_layernorm). MiniCPM3, GLM-5, A.X-K2 and LongCat-Flash are built
from their config.json dicts and weights (hf_reference.build_hf_model; LongCat-Flash, whose layer
holds two sublayers, by its own recorder and pass).

    hf_family_trace(folder, ids, start_pos=0, decode_ids=None) -> {name: array}
    hf_trace(config, weights, ids, start_pos=0, decode_ids=None) -> {name: array}
    longcat_trace(config, weights, ids, start_pos=0, decode_ids=None) -> {name: array}
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
import transformers
import transformers.models.axk1.modeling_axk1 as hf_axk1
import transformers.models.axk2.modeling_axk2 as hf_axk2
import transformers.models.glm4_moe_lite.modeling_glm4_moe_lite as hf_glm
import transformers.models.glm_moe_dsa.modeling_glm_moe_dsa as hf_glm5
import transformers.models.longcat_flash.modeling_longcat_flash as hf_longcat
import transformers.models.minicpm3.modeling_minicpm3 as hf_minicpm3
import transformers.models.mistral4.modeling_mistral4 as hf_mistral4
import transformers.models.youtu.modeling_youtu as hf_youtu
from transformers import (
    AutoModelForCausalLM,
    AXK2Config,
    AXK2ForCausalLM,
    GlmMoeDsaConfig,
    GlmMoeDsaForCausalLM,
    LongcatFlashConfig,
    LongcatFlashForCausalLM,
    MiniCPM3Config,
    MiniCPM3ForCausalLM,
)
from transformers.cache_utils import DynamicCache

from helpers import hf_reference
from helpers.hf_reference import run_hf_trace
from stepper import catalog
from stepper.families import read_config
from stepper.seams.trace import Recorder, unphased
from stepper.session import RunSpec, run

INTERLEAVED = "apply_rotary_pos_emb_interleave"


def _moe_output_norm_hooks(rec) -> None:
    """A.X-K1: the MoE's output goes through post_mlp_layernorm (its input: routed + shared)."""
    for layer in rec.model.model.layers:
        if isinstance(layer.mlp, hf_axk1.AXK1MoE):
            rec.handles.append(layer.mlp.post_mlp_layernorm.register_forward_hook(rec._out("post_mlp_layernorm")))


def _moe_output_norm(model, i: int, r: dict) -> dict[str, torch.Tensor]:
    return {"mlp.post_mlp_layernorm": r["post_mlp_layernorm"]} if "post_mlp_layernorm" in r else {}


def _softmax_top2_router(moe, r, B, T, i) -> dict[str, torch.Tensor]:
    """Mistral4TopkRouter: softmax scores, no bias; groups scored by their two best, the dropped
    groups' scores filled with 0.0 (the same ops on its returned router_logits)."""
    gate = moe.gate
    E, G, KG = gate.num_experts, gate.num_group, gate.topk_group
    router_logits, topk_weights, topk_indices = r["gate_out"]
    scores = router_logits.softmax(-1)  # [N, E]
    group_scores = scores.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)  # [N, G]
    group_idx = torch.topk(group_scores, k=KG, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
    masked = scores.masked_fill(~score_mask.bool(), 0.0)
    idx, w = hf_reference._best_first(topk_indices, topk_weights, masked)
    if not (score_mask.gather(1, idx) > 0).all():
        raise RuntimeError(f"hf_families: layer {i}: derived group mask disagrees with the gate's choice")
    return {"mlp.gate.logits": router_logits, "mlp.gate.softmax_scores": scores, "mlp.gate.scores_for_choice": scores,
            "mlp.gate.group_scores": group_scores, "mlp.gate.group_mask": group_mask, "mlp.gate.topk_idx": idx,
            "mlp.gate.topk_weight": w, "mlp.routed_output": r["experts_out"].view(B, T, -1),
            "mlp.shared_output": r["shared_output"]}


def _record_query_scale(rec, orig):
    """Mistral 4's position-dependent query scale [B, one, T, one], as its attention computes it."""
    def wrapped(position_ids, beta, original_max):
        scale = orig(position_ids, beta, original_max)
        rec.put("q_position_scale", scale[0, 0, :, 0].clone())  # [T]
        return scale
    return wrapped


def _query_scale(model, i: int, r: dict) -> dict[str, torch.Tensor]:
    return {"self_attn.q_position_scale": r["q_position_scale"]}


hf_reference.register("sarvam_mla", hf_reference.FAMILIES["deepseek_v3"])  # DeepseekV3ForCausalLM
hf_reference.register("youtu", SimpleNamespace(module=hf_youtu, moe=None, rope=INTERLEAVED, interleaved_out=False))
hf_reference.register("glm4_moe_lite", SimpleNamespace(module=hf_glm, moe=hf_glm.Glm4MoeLiteMoE, rope=INTERLEAVED,
                                                       interleaved_out=False))
hf_reference.register("axk1", SimpleNamespace(module=hf_axk1, moe=hf_axk1.AXK1MoE, rope=INTERLEAVED,
                                              interleaved_out=False,
                                              names=[("mlp.post_mlp_layernorm", "mlp.shared_output")],
                                              extend=_moe_output_norm_hooks, derive=_moe_output_norm))
hf_reference.register("mistral4", SimpleNamespace(module=hf_mistral4, moe=hf_mistral4.Mistral4MoE, rope=INTERLEAVED,
                                                  interleaved_out=False, derive_router=_softmax_top2_router,
                                                  wraps={"get_llama_4_attn_scale": _record_query_scale},
                                                  names=[("self_attn.q_position_scale",
                                                          "self_attn.compressed_kv_norm")],
                                                  derive=_query_scale))


def load(folder: Path):
    """The family's model from a checkpoint folder, float32, eager; every checkpoint tensor used and
    every parameter loaded."""
    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    model_class = getattr(transformers, architecture, None) or AutoModelForCausalLM  # Mistral 4: not in its mapping
    model, info = model_class.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True)
    kinds = ("missing_keys", "unexpected_keys", "mismatched_keys")
    left = {kind: names for kind, names in info.items() if kind in kinds}
    if any(left.values()):
        raise RuntimeError(f"hf_families: {folder} did not load cleanly: {left}")
    return model.eval()


def hf_family_trace(folder: Path, ids: np.ndarray, start_pos: int = 0,
                    decode_ids: list[np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Every named tensor of the family's transformers model on the checkpoint in `folder`
    (names as hf_reference.hf_trace gives them)."""
    trace, _ = run_hf_trace(load(folder), ids, start_pos=start_pos, decode_ids=decode_ids)
    return trace


# ---------------------------------------------------------------------------------------------
# MiniCPM3: muP scalings around DeepSeek-V2's attention, Llama's rotate_half RoPE, tied lm_head


def _minicpm3_extend(rec) -> None:
    """The ids the embedding reads and lm_head's input (the final norm divided by logits_scaling)."""
    m = rec.model

    def ids(module, args):
        rec.glob["ids"] = args[0].detach().clone()

    def head_in(module, args):
        rec.glob["norm_scaled"] = args[0].detach().clone()

    rec.handles.append(m.model.embed_tokens.register_forward_pre_hook(ids))
    rec.handles.append(m.lm_head.register_forward_pre_hook(head_in))


def _minicpm3_derive(model, i: int, r: dict) -> dict[str, torch.Tensor]:
    """Each branch times residual_scale, as MiniCPM3DecoderLayer.forward multiplies it."""
    scale = model.model.layers[i].residual_scale
    return {"attn_scaled": r["o_proj"] * scale, "mlp_scaled": r["mlp_output"] * scale}


def _minicpm3_globals(model, g: dict) -> dict[str, torch.Tensor]:
    """embed_tokens' output is already scaled: the table's rows are looked up again for `embed`."""
    return {"embed": F.embedding(g["ids"], model.model.embed_tokens.weight), "embed_scaled": g["embed"],
            "norm_scaled": g["norm_scaled"]}


hf_reference.register("minicpm3", SimpleNamespace(
    module=hf_minicpm3, config=MiniCPM3Config, model=MiniCPM3ForCausalLM, moe=None, rope="apply_rotary_pos_emb",
    interleaved_out=False, extra={}, checks={}, drop=(),
    names=[("attn_scaled", "self_attn.o_proj"), ("mlp_scaled", "mlp_output")],
    extend=_minicpm3_extend, derive=_minicpm3_derive, derive_globals=_minicpm3_globals))

# ---------------------------------------------------------------------------------------------
# GLM-5: V3.2's indexer with interleaved RoPE; "shared" layers reuse the previous layer's top-k


def _glm5_wrap_rope(rec, orig):
    """apply_rotary_pos_emb_interleave serves MLA and the indexer (which passes unsqueeze_dim=2)."""
    mla, index = rec.wrap_rope(orig), rec.wrap_index_rope(orig)

    def wrapped(q, k, cos, sin, *args, **kwargs):
        return (index if kwargs.get("unsqueeze_dim") == 2 else mla)(q, k, cos, sin, *args, **kwargs)
    return wrapped


def _glm5_extend(rec) -> None:
    """Each attention's third output: the top-k it used (its indexer's, or the one it was handed)."""
    for layer in rec.model.model.layers:
        def hook(module, args, output):
            rec.put("attention_topk", output[2].detach().clone())
        rec.handles.append(layer.self_attn.register_forward_hook(hook))


def _glm5_derive(model, i: int, r: dict) -> dict[str, torch.Tensor]:
    """A shared layer's reused positions (future ones, which the causal mask drops, as -1) and the
    mask it attends under: the additive mask eager attention is given (0 or finfo.min)."""
    if model.model.layers[i].self_attn.indexer is not None:
        return {}
    idx = r["attention_topk"].to(torch.int64)  # [B, T, Ki]
    T, S = r["attention_mask"].shape[-2:]
    last_visible = torch.arange(T).view(1, T, 1) + (S - T)
    blocked = r["attention_mask"][:, 0] < 0  # [B, T, S]
    return {"self_attn.indexer.reused_topk_idx": idx.masked_fill(idx > last_visible, -1),
            "self_attn.indexer.reused_mask": torch.zeros(blocked.shape).masked_fill(blocked, float("-inf"))}


hf_reference.register("glm_moe_dsa", SimpleNamespace(
    module=hf_glm5, config=GlmMoeDsaConfig, model=GlmMoeDsaForCausalLM, moe=hf_glm5.GlmMoeDsaMoE,
    rope=INTERLEAVED, interleaved_out=False, extra={},
    checks={"scoring_func": "sigmoid", "topk_method": "noaux_tc"}, drop=("scoring_func", "topk_method"),
    names=[("self_attn.indexer.reused_topk_idx", "input_layernorm"),
           ("self_attn.indexer.reused_mask", "self_attn.indexer.reused_topk_idx")],
    indexed=True, index_rope=None, wrap_rope=_glm5_wrap_rope, extend=_glm5_extend, derive=_glm5_derive))


# ---------------------------------------------------------------------------------------------
# A.X-K2: fused q/gate projection with a sigmoid output gate, gated RMSNorms, 0.0-filled groups


def _axk2_extend(rec) -> None:
    """Each gated norm's RMSNorm output and its gate MLP's output (before the sigmoid)."""
    for layer in rec.model.model.layers:
        for key, norm in (("ln1", layer.input_layernorm), ("ln2", layer.post_attention_layernorm)):
            if isinstance(norm, hf_axk2.AXK2GatedRMSNorm):
                rec.handles.append(norm.norm.register_forward_hook(rec._out(f"{key}_norm")))
                rec.handles.append(norm.mlp.register_forward_hook(rec._out(f"{key}_gate_in")))


def _axk2_derive(model, i: int, r: dict) -> dict[str, torch.Tensor]:
    """The gate half of q_gate_proj's output (as the attention splits it), the heads' output before
    the gate (eager attention's weights @ values, transposed and merged, its own ops), the gated
    norms' parts; the router's choice again with dropped groups at 0.0 (AXK2TopkRouter's fill)."""
    cfg, attn = model.config, model.model.layers[i].self_attn
    B, T, _ = r["hidden_states"].shape
    gate = r["q_proj_out"].view(B, T, cfg.num_attention_heads, -1)[..., attn.qk_head_dim :]  # [B, T, H, v_head]
    heads = torch.matmul(r["attn_weights"], r["value_states"]).transpose(1, 2)  # [B, T, H, v_head]
    out = {"self_attn.q_gate": gate.reshape(B, T, -1), "self_attn.attn_output": heads.reshape(B, T, -1),
           "self_attn.attn_output_gated": r["attn_output"]}
    for key, name in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
        if f"{key}_norm" in r:
            out[name] = r[f"{key}_norm"]
            out[f"{name}_gate"] = torch.sigmoid(r[f"{key}_gate_in"].float())
            out[f"{name}_gated"] = r[name]
    mlp = model.model.layers[i].mlp
    if isinstance(mlp, hf_axk2.AXK2MoE) and mlp.gate.num_group is not None:
        out.update(_axk2_groups(mlp.gate, r))
    return out


def _axk2_groups(gate, r: dict) -> dict[str, torch.Tensor]:
    """AXK2TopkRouter.forward's group rule on its returned logits, the dropped groups at 0.0."""
    logits, weights, indices = r["gate_out"]
    E, G = gate.num_experts, gate.num_group
    sfc = logits.sigmoid() + gate.e_score_correction_bias
    group_scores = sfc.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
    group_mask = torch.zeros_like(group_scores).scatter_(1, torch.topk(group_scores, k=gate.topk_group, dim=-1)[1], 1)
    masked = sfc.masked_fill(~group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool(), 0.0)
    idx, w = hf_reference._best_first(indices, weights, masked)
    return {"mlp.gate.group_mask": group_mask, "mlp.gate.topk_idx": idx, "mlp.gate.topk_weight": w}


def _axk2_rename(name: str) -> str:
    """The published name of a weight -> transformers' (conversion_mapping.py's axk2 renames)."""
    name = re.sub(r"\.W_down\.", ".mlp.fc1.", re.sub(r"\.W_up\.", ".mlp.fc2.", name))
    return name.replace("self_attn.q_b_proj.", "self_attn.q_gate_proj.")


hf_reference.register("axk2", SimpleNamespace(
    module=hf_axk2, config=AXK2Config, model=AXK2ForCausalLM, moe=hf_axk2.AXK2MoE,
    rope=INTERLEAVED, interleaved_out=False, extra={},
    checks={"scoring_func": "sigmoid", "topk_method": "noaux_tc"}, drop=("scoring_func", "topk_method"),
    names=[("input_layernorm_gate", "input_layernorm"), ("input_layernorm_gated", "input_layernorm_gate"),
           ("self_attn.q_gate", "self_attn.q_a_norm"), ("self_attn.attn_output_gated", "self_attn.attn_output"),
           ("post_attention_layernorm_gate", "post_attention_layernorm"),
           ("post_attention_layernorm_gated", "post_attention_layernorm_gate")],
    indexed=True, index_rope="apply_rotary_pos_emb", extend=_axk2_extend, derive=_axk2_derive, rename=_axk2_rename))


def hf_trace(config: dict, weights: dict, ids, start_pos: int = 0, decode_ids=None, inv_freq=None):
    """hf_reference.hf_trace on weights under their published names, renamed as transformers loads
    them (the family's `rename`, from conversion_mapping.py) where the two differ."""
    rename = getattr(hf_reference.FAMILIES[config["model_type"]], "rename", None)
    if rename is not None:
        weights = {rename(name): value for name, value in weights.items()}
    return hf_reference.hf_trace(config, weights, ids, start_pos=start_pos, decode_ids=decode_ids, inv_freq=inv_freq)


build_hf_model = hf_reference.build_hf_model


def traces(folder, raw: dict, values: dict, ids: tuple[int, ...], start_pos: int, decode: int, attn: str):
    """stepper run from the checkpoint folder, and transformers on its values: both traces, by name
    (stepper's absorbed path against transformers' naive one: only the names both have)."""
    rec = Recorder()
    result = run(RunSpec(model=str(folder), ids=ids, start_pos=start_pos, decode=decode, attn=attn), [rec])
    steps = [np.array([[t]]) for t in result.generated] or None
    mine, ref = rec.tensors(), hf_trace(raw, values, np.array([ids]), start_pos=start_pos, decode_ids=steps)
    if attn == "absorb":
        ref = {n: v for n, v in ref.items() if n in mine}
        mine = {n: v for n, v in mine.items() if n in ref}
    return mine, ref


def catalogued_names(raw: dict, names) -> tuple[set[str], set[str]]:
    """The catalogue's names a naive run of this config emits (layers and globals), and those of `names`."""
    cfg = read_config(dict(raw), "test config")
    cat = catalog.load()
    expected = {e["name"] for layer in range(cfg.num_hidden_layers) for e in cat.layer_sequence(cfg, layer, "naive")}
    expected |= set(cat.with_globals_after(("embed", "rope_cos", "rope_sin", "norm", "logits"), cfg))
    compared = {unphased(n).split(".", 2)[-1] if unphased(n).startswith("layers.") else unphased(n) for n in names}
    return expected, compared


# ---------------------------------------------------------------------------------------------
# LongCat-Flash: two attention + dense-MLP sublayers per layer, a shortcut MoE with zero experts.
# Its layer is not DeepSeek's, so it has its own hooks and pass; each sublayer is derived by
# hf_reference's _derive_layer through a view of the model holding that sublayer's modules.


class _LongcatRecorder(hf_reference._Recorder):
    """raw[2i + j]: sublayer j of layer i (the attention's own layer_idx), as hf_reference keys a layer."""

    def install(self) -> None:
        m, reg = self.model, self.handles.append
        reg(m.model.embed_tokens.register_forward_hook(self._out("embed", glob=True)))
        reg(m.model.rotary_emb.register_forward_hook(self._rotary_hook))
        reg(m.model.norm.register_forward_hook(self._out("norm", glob=True)))
        reg(m.lm_head.register_forward_hook(self._out("logits", glob=True)))
        for i, layer in enumerate(m.model.layers):
            reg(layer.register_forward_pre_hook(self._enter(2 * i, "hidden_states"), with_kwargs=True))
            reg(layer.register_forward_hook(self._out("output")))
            for j in (0, 1):
                reg(layer.input_layernorm[j].register_forward_pre_hook(self._enter(2 * i + j, "sub_input")))
                reg(layer.input_layernorm[j].register_forward_hook(self._out("input_layernorm")))
                a = layer.self_attn[j]
                for module, key in ((a.q_a_proj, "q_a"), (a.q_a_layernorm, "q_a_norm"), (a.q_b_proj, "q_proj_out"),
                                    (a.kv_a_proj_with_mqa, "kv_a"), (a.kv_a_layernorm, "compressed_kv_norm"),
                                    (a.kv_b_proj, "kv_b_out"), (a.o_proj, "o_proj")):
                    reg(module.register_forward_hook(self._out(key)))
                reg(a.kv_a_layernorm.register_forward_pre_hook(self._in("compressed_kv")))
                reg(a.o_proj.register_forward_pre_hook(self._in("attn_output")))
                reg(layer.post_attention_layernorm[j].register_forward_pre_hook(self._in("attn_residual")))
                reg(layer.post_attention_layernorm[j].register_forward_hook(self._out("post_attention_layernorm")))
                mlp = layer.mlps[j]
                reg(mlp.gate_proj.register_forward_hook(self._out("gate_proj")))
                reg(mlp.up_proj.register_forward_hook(self._out("up_proj")))
                reg(mlp.down_proj.register_forward_pre_hook(self._in("act")))
                reg(mlp.register_forward_hook(self._out("mlp_output")))
            reg(layer.mlp.router.register_forward_hook(self._out("gate_out")))
            reg(layer.mlp.experts.register_forward_hook(self._out("experts_out")))

    def _enter(self, index: int, key: str):
        def hook(module, args, kwargs=None):
            self.layer = index
            self.put(key, hf_reference._c(args[0] if args else kwargs["hidden_states"]))
        return hook


def _sublayer_view(model, i: int, j: int):
    """The model as _derive_layer reads it, layer i being LongCat's sublayer j."""
    layer = model.model.layers[i]
    sub = SimpleNamespace(self_attn=layer.self_attn[j], mlp=layer.mlps[j])
    return SimpleNamespace(config=model.config, model=SimpleNamespace(layers={i: sub}))


def _longcat_layer(model, i: int, r0: dict, r1: dict) -> dict[str, torch.Tensor]:
    """Layer i's tensors by stepper's names: each sublayer's, then the MoE's and the layer's output."""
    out = {"hidden_states": r0["hidden_states"]}
    for j, r in ((0, r0), (1, r1)):
        attn = model.model.layers[i].self_attn[j]
        r = {**r, "hidden_states": r0["hidden_states"] if j == 0 else r1["sub_input"],
             "output": r1["sub_input"] if j == 0 else r1["output"]}
        derived = hf_reference._derive_layer(_sublayer_view(model, i, j), i, r)
        # LoRA scales, as LongcatFlashMLA.forward multiplies (q_rot's scaled value is the rope's q)
        derived["self_attn.q_nope_scaled"] = derived["self_attn.q_nope"] * attn.mla_scale_q_lora
        derived["self_attn.q_pe_scaled"] = r["q_pe"]
        derived["self_attn.compressed_kv_scaled"] = r["compressed_kv_norm"] * attn.mla_scale_kv_lora
        keep = [n for n in derived if n not in ("hidden_states", "output") or (n == "output" and j == 0)]
        out.update({f"sub{j}.{n}": derived[n] for n in keep})
    out.update(_longcat_moe(model.model.layers[i].mlp, r0))
    out["output"] = r1["output"]
    return out


def _longcat_moe(moe, r: dict) -> dict[str, torch.Tensor]:
    """LongcatFlashTopkRouter.forward's ops on its returned logits (softmax, plus the bias to choose;
    one group), the chosen best first, and the zero experts' share: their input times their weight."""
    logits, weights, indices = r["gate_out"]
    scores = logits.softmax(dim=-1)
    sfc = scores + moe.router.e_score_correction_bias
    idx, w = hf_reference._best_first(indices, weights, sfc)
    x = r["post_attention_layernorm"]
    B, T, d = x.shape
    zero = idx >= moe.experts.num_routed_experts  # [N, k]
    identity = (x.reshape(B * T, 1, d) * (w * zero).unsqueeze(-1)).sum(dim=1).view(B, T, d)
    return {"mlp.gate.logits": logits, "mlp.gate.softmax_scores": scores, "mlp.gate.scores_for_choice": sfc,
            "mlp.gate.group_scores": sfc.topk(2, dim=-1)[0].sum(dim=-1, keepdim=True),
            "mlp.gate.group_mask": torch.ones(sfc.shape[0], 1), "mlp.gate.topk_idx": idx, "mlp.gate.topk_weight": w,
            "mlp.zero_expert_output": identity, "mlp.routed_output": r["experts_out"].view(B, T, d)}


def longcat_trace(config: dict, weights: dict, ids, start_pos: int = 0, decode_ids=None) -> dict:
    """transformers' LongcatFlashForCausalLM on the weights (published names: the experts one by one),
    prefill then cached decode steps, every tensor under stepper's names (`layers.i.sub{j}.` for a sublayer)."""
    zero = range(config["n_routed_experts"], config["n_routed_experts"] + config["zero_expert_num"])
    d, inter = config["hidden_size"], config["expert_ffn_hidden_size"]
    unused = {f"model.layers.{i}.mlp.experts.{e}.{p}.weight": np.zeros((inter, d), np.float32)  # transformers
              for i in range(config["num_layers"]) for e in zero
              for p in ("gate_proj", "up_proj")}  # sizes them, unread
    model = hf_reference.build_hf_model(config, {**weights, **unused})
    rec = _LongcatRecorder(model)
    module = hf_longcat
    rope, attention = module.apply_rotary_pos_emb_interleave, module.eager_attention_forward
    out = {}
    try:
        rec.install()
        module.apply_rotary_pos_emb_interleave = rec.wrap_rope(rope)
        module.eager_attention_forward = rec.wrap_attention(attention)
        steps = [np.asarray(ids)] + [np.asarray(d) for d in decode_ids or []]
        cache = DynamicCache(config=model.config) if decode_ids else None
        position = start_pos
        for k, step in enumerate(steps):
            prefix = "" if not decode_ids else "prefill." if k == 0 else f"decode{k - 1}."
            tokens = torch.from_numpy(step.astype(np.int64))
            positions = (torch.arange(tokens.shape[1]) + position).unsqueeze(0)
            rec.reset()
            with torch.no_grad():
                model(input_ids=tokens, position_ids=positions, cache=cache, use_cache=cache is not None)
            position += tokens.shape[1]
            g = rec.glob
            trace = {"embed": g["embed"], "rope_cos": g["rope_cos"][0], "rope_sin": g["rope_sin"][0]}
            for i in range(len(model.model.layers)):
                for name, t in _longcat_layer(model, i, rec.raw[2 * i], rec.raw[2 * i + 1]).items():
                    trace[f"layers.{i}.{name}"] = t
            trace.update(norm=rec.glob["norm"], logits=rec.glob["logits"])
            out.update({prefix + n: hf_reference._to_numpy(n, t) for n, t in trace.items()})
    finally:
        module.apply_rotary_pos_emb_interleave, module.eager_attention_forward = rope, attention
        rec.remove()
    return out


hf_reference.register("longcat_flash", SimpleNamespace(
    module=hf_longcat, config=LongcatFlashConfig, model=LongcatFlashForCausalLM, moe=hf_longcat.LongcatFlashMoE,
    rope=INTERLEAVED, interleaved_out=False, extra={}, checks={}, drop=()))
