"""The MLA families grown from DeepSeek-V3, traced by transformers' own models of each family.

helpers.hf_reference traces DeepseekV3ForCausalLM (and V2, V3.2) by hooks on its modules; the
families of issue 33 keep those modules' names, so this module registers each family with it
(its modeling module, config and model classes, its rope function) plus what the family adds:
`extend` installs hooks for the family's own tensors, `derive` and `derive_globals` name them.
Importing this module registers the families; `hf_trace` and `build_hf_model` then take their
config.json dicts. Derivations repeat transformers' own ops on captured tensors (noted on each).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
import transformers.models.glm_moe_dsa.modeling_glm_moe_dsa as hf_glm5
import transformers.models.minicpm3.modeling_minicpm3 as hf_minicpm3
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM, MiniCPM3Config, MiniCPM3ForCausalLM

from helpers import hf_reference
from helpers.hf_reference import FAMILIES, LAYER_NAMES_FAMILIES

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


FAMILIES["minicpm3"] = SimpleNamespace(
    module=hf_minicpm3, config=MiniCPM3Config, model=MiniCPM3ForCausalLM, moe=None, rope="apply_rotary_pos_emb",
    interleaved_out=False, extra={}, checks={}, drop=(),
    extend=_minicpm3_extend, derive=_minicpm3_derive, derive_globals=_minicpm3_globals)
LAYER_NAMES_FAMILIES += [("attn_scaled", "self_attn.o_proj"), ("mlp_scaled", "mlp_output")]

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


FAMILIES["glm_moe_dsa"] = SimpleNamespace(
    module=hf_glm5, config=GlmMoeDsaConfig, model=GlmMoeDsaForCausalLM, moe=hf_glm5.GlmMoeDsaMoE,
    rope="apply_rotary_pos_emb_interleave", interleaved_out=False, extra={},
    checks={"scoring_func": "sigmoid", "topk_method": "noaux_tc"}, drop=("scoring_func", "topk_method"),
    indexed=True, index_rope=None, wrap_rope=_glm5_wrap_rope, extend=_glm5_extend, derive=_glm5_derive)
LAYER_NAMES_FAMILIES += [("self_attn.indexer.reused_topk_idx", "input_layernorm"),
                         ("self_attn.indexer.reused_mask", "self_attn.indexer.reused_topk_idx")]

hf_trace = hf_reference.hf_trace
build_hf_model = hf_reference.build_hf_model
