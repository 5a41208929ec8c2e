"""transformers' Hy4 (models/hy_v4) at a tiny size, every parameter drawn, and what it computes
at the sites stepper shows (forward hooks on its modules), prefill and decode, for
tests/model/test_hy_v4_crosscheck.py."""

from __future__ import annotations

import numpy as np
import torch
import transformers

from tests.helpers.hf_steps import prefill_then_decode

# four layers: a dense one with its own indexer, a MoE one with its own, two MoE ones reusing it in turn ("shared",
# transformers' pattern); three streams; four positions kept of each query's past, scored by eight index heads (a
# score ties at 0, making the top-k ambiguous, only where all eight relu's are 0); a clamp that bites on these
# weights; an eps large enough that each norm's own (rms_norm_eps, or the latents' 1e-6) shows in the tensors
TINY_HY = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
           "num_hidden_layers": 4, "num_attention_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 16,
           "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 12, "n_routed_experts": 8,
           "num_experts_per_tok": 2, "routed_scaling_factor": 2.5, "index_topk": 4, "index_head_dim": 16,
           "index_n_heads": 8, "hc_mult": 3, "hc_magnitude": 1.5, "hc_eps": 1e-3, "swiglu_limit": 0.6,
           "max_position_embeddings": 8192, "rms_norm_eps": 0.05, "pad_token_id": 0, "bos_token_id": 1,
           "eos_token_id": 2, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


def random_model(fields: dict, seed: int) -> transformers.HYV4ForCausalLM:
    """HYV4ForCausalLM of these fields, every parameter drawn: norms about 1, the router's bias and the
    hyper-connections' scales and bases large enough to matter, the sinks about 0."""
    torch.manual_seed(seed)
    model = transformers.HYV4ForCausalLM(transformers.HYV4Config(**fields)).eval().to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight")):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith(("hc_scale", ".scale", ".base", "hc_base", "sinks", "norm.bias")):
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return model


def trace_steps(model, prompt: list[int], generated: list[int], start: int = 0) -> dict[str, np.ndarray]:
    """What the model computes over the prompt at positions start.. and then each generated token but
    the last, one at a time on its cache, by stepper's names: `prefill.layers.1.attn_hc.post`,
    `decode0.logits`, ... (an index choice: `layers.1.topk_indices`, every row's index_topk)."""
    found: dict[str, np.ndarray] = {}
    step = ["prefill"]
    hooks = []

    def keep(*named) -> None:  # (name, value) pairs; a forward hook returning None leaves the output alone
        for name, value in zip(named[::2], named[1::2]):
            found[f"{step[0]}.{name}"] = value.detach().numpy().copy()

    for i, layer in enumerate(model.model.layers):
        for site in ("attn_hc", "ffn_hc"):
            hooks.append(getattr(layer, site).register_forward_hook(
                lambda m, a, out, i=i, site=site: keep(f"layers.{i}.{site}.post", out[0],
                                                  f"layers.{i}.{site}.collapsed", out[1])))
        hooks.append(layer.input_layernorm.register_forward_hook(
            lambda m, a, out, i=i: keep(f"layers.{i}.attn_norm", out)))
        hooks.append(layer.post_attention_layernorm.register_forward_hook(
            lambda m, a, out, i=i: keep(f"layers.{i}.ffn_norm", out)))
        hooks.append(layer.self_attn.register_forward_hook(
            lambda m, a, out, i=i: keep(f"layers.{i}.attn_output", out[0], f"layers.{i}.topk_indices", out[2])))
        hooks.append(layer.mlp.register_forward_hook(lambda m, a, out, i=i: keep(f"layers.{i}.ffn_output", out)))
        hooks.append(layer.register_forward_hook(lambda m, a, out, i=i: keep(f"layers.{i}.ffn_streams", out[0])))
        if hasattr(layer.mlp, "experts"):
            hooks.append(layer.mlp.experts.register_forward_hook(
                lambda m, a, out, i=i: keep(f"layers.{i}.mlp.gate.topk_idx", a[1],
                                       f"layers.{i}.mlp.gate.topk_weight", a[2])))
    hooks.append(model.model.hc_head.register_forward_hook(lambda m, a, out: keep("hc_head.collapsed", out)))
    hooks.append(model.model.norm.register_forward_hook(lambda m, a, out: keep("final_norm", out)))
    prefill_then_decode(model, prompt, generated, start, keep, step, hooks)
    return found
