"""transformers' own models of the MLA families stepper reads through stepper/families (Sarvam,
Youtu, GLM-4.7-Flash, A.X-K1, Mistral 4), traced by name like helpers.hf_reference traces
DeepSeek-V3, whose recorder and derivations this module reuses: each family is registered there
with the hooks and derivations of what it adds.

The model is loaded the way a user loads the published checkpoint, `from_pretrained` on a folder
(which `stepper synth` writes in the family's published layout), float32, eager attention and
experts; a parameter it does not load or a checkpoint tensor it does not use is an error (beyond
those the family's transformers code itself ignores, as A.X-K1's dense layers' post_mlp_layernorm).

    hf_family_trace(folder, ids, start_pos=0, decode_ids=None) -> {name: array}
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import transformers
import transformers.models.axk1.modeling_axk1 as hf_axk1
import transformers.models.glm4_moe_lite.modeling_glm4_moe_lite as hf_glm
import transformers.models.mistral4.modeling_mistral4 as hf_mistral4
import transformers.models.youtu.modeling_youtu as hf_youtu
from transformers import AutoModelForCausalLM

from helpers import hf_reference
from helpers.hf_reference import run_hf_trace

INTERLEAVED = "apply_rotary_pos_emb_interleave"


def _moe_output_norm_hooks(rec, layer, reg) -> None:
    """A.X-K1: the MoE's output goes through post_mlp_layernorm (its input: routed + shared)."""
    if isinstance(layer.mlp, hf_axk1.AXK1MoE):
        reg(layer.mlp.post_mlp_layernorm.register_forward_hook(rec._out("post_mlp_layernorm")))


def _moe_output_norm(layer, r, B, T) -> dict[str, torch.Tensor]:
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


def _query_scale(layer, r, B, T) -> dict[str, torch.Tensor]:
    return {"self_attn.q_position_scale": r["q_position_scale"]}


hf_reference.register("sarvam_mla", hf_reference.FAMILIES["deepseek_v3"])  # DeepseekV3ForCausalLM
hf_reference.register("youtu", SimpleNamespace(module=hf_youtu, moe=None, rope=INTERLEAVED, interleaved_out=False))
hf_reference.register("glm4_moe_lite", SimpleNamespace(module=hf_glm, moe=hf_glm.Glm4MoeLiteMoE, rope=INTERLEAVED,
                                                       interleaved_out=False))
hf_reference.register("axk1", SimpleNamespace(module=hf_axk1, moe=hf_axk1.AXK1MoE, rope=INTERLEAVED,
                                              interleaved_out=False,
                                              names=[("mlp.post_mlp_layernorm", "mlp.shared_output")],
                                              install=_moe_output_norm_hooks, derive=_moe_output_norm))
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
