"""transformers' Ling 3 (models/bailing_hybrid) at a tiny size, every parameter drawn, saved by its
save_pretrained (Ling's published names: `model.word_embeddings`, `attention.*`, `attention.dense`,
`mlp.gate.expert_bias`, each expert's projections, the three short convs apart), reloaded, and
traced by stepper's names in stepper's layouts: Kimi Linear's tracer (tests/helpers/hf_kimi_linear.py)
on Ling's modules, with the MLA layers' rotation (a wrapper of `apply_rotary_pos_emb_interleave`),
the rotary tables (the rotary module's output) and the per-head output gate (`g_proj`'s output,
and what o_proj reads). It shares no code with stepper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers
import transformers.models.bailing_hybrid.modeling_bailing_hybrid as hf

from tests.helpers import hf_kimi_linear

# four layers: KDA (dense MLP), MLA (MoE), KDA (MoE), MLA (MoE); 8 experts in 4 groups keeping 2, two chosen;
# an rms_norm_eps large enough that each norm's own (rms_norm_eps, or the latent's 1e-6) shows in the tensors;
# the KDA heads' dims (head_dim 12) unlike the rotary dims (8), which transformers' saved head_dim becomes; a
# forget gate bounded at -3, not the default -5
TINY_LING = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
             "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 8,
             "num_experts_per_token": 2, "num_shared_experts": 1, "num_expert_group": 4, "topk_group": 2,
             "first_k_dense_replace": 1, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
             "v_head_dim": 12, "head_dim": 12, "layer_group_size": 2, "kda_lower_bound": -3.0, "rms_norm_eps": 0.05,
             "routed_scaling_factor": 2.5, "model_max_length": 8192, "pad_token_id": 0, "eos_token_id": 1,
             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


def random_model(fields: dict, seed: int) -> transformers.BailingHybridForCausalLM:
    """BailingHybridForCausalLM of these fields, every parameter drawn: norms about 1, the router's
    bias large enough to matter, A_log about log 4 and dt_bias about 0 (a forget gate well inside its
    bound), the rest about 1 / sqrt(fan-in)."""
    torch.manual_seed(seed)
    model = transformers.BailingHybridForCausalLM(transformers.BailingHybridConfig(**fields)).eval().to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight")):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith(("A_log", "dt_bias")):
                p.copy_(0.5 * torch.randn_like(p) + (1.4 if name.endswith("A_log") else 0.0))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    return model


def saved(folder: Path, fields: dict, seed: int) -> Path:
    """The model of `random_model`, as its save_pretrained writes it."""
    random_model(fields, seed).save_pretrained(folder)
    return folder


def load(folder: Path) -> transformers.BailingHybridForCausalLM:
    return transformers.BailingHybridForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                                 attn_implementation="eager").eval()


def trace(model, ids: np.ndarray, decode_ids: np.ndarray, start: int = 0) -> dict[str, np.ndarray]:
    """Prefill `ids` [B, T] at positions start .. start+T-1, then one decode step per column of
    `decode_ids` [B, n]: every tensor by its stepper name (`prefill.layers.1.self_attn.head_gate`)."""
    return Tracer(model).run(ids, decode_ids, start)


class Tracer(hf_kimi_linear.Tracer):
    """Kimi Linear's tracer on Ling's modules, with what Ling's MLA adds."""

    hf = hf
    delta_attention, moe = "BailingHybridDeltaAttention", "BailingHybridMoE"
    functions = (*hf_kimi_linear.FUNCTIONS, "apply_rotary_pos_emb_interleave")
    merged = "self_attn.attn_output_gated"  # o_proj reads the heads' outputs after their gates

    @staticmethod
    def output_gate(attn):
        return attn.g_proj

    def run(self, ids: np.ndarray, decode_ids: np.ndarray, start: int = 0) -> dict[str, np.ndarray]:
        rotary = self.model.model.rotary_emb.register_forward_hook(self.tables)
        try:
            return super().run(ids, decode_ids, start)
        finally:
            rotary.remove()

    def tables(self, module, args, out) -> None:
        """The rotary tables [T, rope] (every row of the batch alike), outside the layers."""
        cos, sin = out
        layer, self.layer = self.layer, None
        self.put("rope_cos", cos[0])
        self.put("rope_sin", sin[0])
        self.layer = layer

    def mla_hooks(self, attn) -> None:
        super().mla_hooks(attn)
        self.output(attn.g_proj, "self_attn.head_gate")

    def wrap_functions(self) -> None:
        super().wrap_functions()
        self.hf.apply_rotary_pos_emb_interleave = self.rotation(self.originals["apply_rotary_pos_emb_interleave"])

    def rotation(self, fn):
        def traced(q, k, *args, **kwargs):
            q_rot, k_rot = fn(q, k, *args, **kwargs)
            self.put("self_attn.q_pe_rope", q_rot)
            self.put("self_attn.k_pe_rope", k_rot)
            return q_rot, k_rot
        return traced

    def eager(self, fn):
        traced_eager = super().eager(fn)

        def traced(module, query, *args, **kwargs):
            output, weights = traced_eager(module, query, *args, **kwargs)  # output [B, T, H, v_head]
            self.put("self_attn.attn_output", output.reshape(*output.shape[:2], -1))
            return output, weights
        return traced
