"""transformers' Mistral Large 4 (models/mistral_large4) at a tiny size, every parameter drawn, and what it
computes at the sites stepper shows (forward hooks on its text modules), prefill and decode. transformers has
no text-only causal LM for it: the model is the wrapper, MistralLarge4ForConditionalGeneration, with a tiny
pixtral vision tower that no text prompt reaches."""

from __future__ import annotations

import numpy as np
import torch
import transformers

from tests.helpers.hf_steps import prefill_then_decode

# four layers: a dense one, then MoE ones; layer 2 NoPE (its latent kv_lora wide, its kv_b_proj nope+rope+v per
# head, no rotation in it or its indexer); every layer its own latent and indexer (no sharing); 8 experts in 2
# groups keeping 1, two chosen; four positions kept of each query's past, scored by eight index heads (a score
# ties at 0, making the top-k ambiguous, only where all eight relu's are 0); YaRN with attention_factor 1.0 as
# the checkpoint's (cos and sin unscaled, not YaRN's 0.1 ln(factor) + 1); an rms_norm_eps large enough that each
# norm's own (rms_norm_eps for the latent too, the indexer LayerNorms' 1e-6) shows in the tensors. transformers
# warns that factor 4 is not 8192 / 1024, and uses the factor given
TINY_TEXT = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
             "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 16,
             "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 12, "n_routed_experts": 8,
             "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.5,
             "first_k_dense_replace": 1, "index_topk": 4, "index_head_dim": 16, "index_n_heads": 8,
             "no_rope_layers": [1, 1, 0, 1], "kv_source_layers": [0, 1, 2, 3], "max_position_embeddings": 8192,
             "rms_norm_eps": 0.05, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
             "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 1024, "beta_fast": 32.0, "beta_slow": 1.0,
                                 "attention_factor": 1.0}}

# the wrapper needs a vision tower; this is the smallest pixtral one transformers builds
TINY_VISION = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
               "head_dim": 8, "patch_size": 4, "image_size": 16}


def random_model(text_fields: dict, seed: int) -> transformers.MistralLarge4ForConditionalGeneration:
    """MistralLarge4ForConditionalGeneration of these text fields, every parameter drawn: norms about 1, the
    indexer LayerNorms' biases, the query scalings' slopes and LeRoPE's alpha about 0 but large enough to matter,
    the query scalings' offsets about 1, the rest about 1 / sqrt(fan-in). transformers' own init leaves the
    scalings and alpha at the identity (slope 0, offset 1, alpha 0), which would hide them."""
    torch.manual_seed(seed)
    config = transformers.MistralLarge4Config(text_config=text_fields, vision_config=TINY_VISION)
    model = transformers.MistralLarge4ForConditionalGeneration(config).eval().to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "ln_pre.weight")):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith(("norm.bias", "softmax_scaling.scale", "rotary_emb.alpha")):
                p.copy_(0.3 * torch.randn_like(p))
            elif name.endswith("softmax_scaling.bias"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return model


def trace_steps(model, prompt: list[int], generated: list[int], start: int = 0) -> dict[str, np.ndarray]:
    """What the model computes over the prompt at positions start.. and then each generated token but the last,
    one at a time on its cache, by stepper's names: `prefill.layers.1.attn_output`, `decode0.logits`, ... (an
    index choice: `layers.1.topk_indices`, every row's index_topk; a query scaling: `layers.1.softmax_scaling`
    [B, H, T], `layers.1.indexer.softmax_scaling` [B, Hi, T])."""
    found: dict[str, np.ndarray] = {}
    step = ["prefill"]
    hooks = []
    text = model.model.language_model

    def keep(*named) -> None:  # (name, value) pairs; a forward hook returning None leaves the output alone
        for name, value in zip(named[::2], named[1::2]):
            found[f"{step[0]}.{name}"] = value.detach().numpy().copy()

    def factor(module, kwargs) -> torch.Tensor:
        """The scaling's per-head, per-position factor, by transformers' own forward on ones (bypassing the
        hooks): [B, H, T] for the attention's (head_dim_first), [B, T, Hi] for the indexer's."""
        ones = torch.ones_like(kwargs["query_states"])
        return module.forward(ones, kwargs["position_ids"], head_dim_first=kwargs["head_dim_first"])[..., 0]

    def scaling_hook(name: str, transpose: bool):
        def hook(module, args, kwargs, out) -> None:
            kwargs = {**dict(zip(("query_states", "position_ids", "head_dim_first"), args)), **kwargs}
            value = factor(module, kwargs)
            keep(name, value.transpose(1, 2) if transpose else value)
        return hook

    hooks.append(text.rotary_emb.register_forward_hook(
        lambda m, a, out: keep("rope_cos", out[0][0], "rope_sin", out[1][0])))
    for i, layer in enumerate(text.layers):
        attn = layer.self_attn
        hooks.append(layer.register_forward_pre_hook(lambda m, a, i=i: keep(f"layers.{i}.hidden_states", a[0])))
        hooks.append(layer.input_layernorm.register_forward_hook(
            lambda m, a, out, i=i: keep(f"layers.{i}.input_layernorm", out)))
        # self_attn returns (output, weights, topk_indices), the positions its mask keeps: its own indexer's
        # choice, or on a "shared" layer the previous layer's (the indexer's own output is the former only)
        hooks.append(attn.register_forward_hook(
            lambda m, a, out, i=i: keep(f"layers.{i}.attn_output", out[0], f"layers.{i}.topk_indices", out[2])))
        hooks.append(attn.softmax_scaling.register_forward_hook(
            scaling_hook(f"layers.{i}.softmax_scaling", False), with_kwargs=True))
        if attn.indexer is not None:
            hooks.append(attn.indexer.q_input_norm.register_forward_hook(
                lambda m, a, out, i=i: keep(f"layers.{i}.indexer.q_input_norm", out)))
            hooks.append(attn.indexer.softmax_scaling.register_forward_hook(
                scaling_hook(f"layers.{i}.indexer.softmax_scaling", True), with_kwargs=True))
        hooks.append(layer.post_attention_layernorm.register_forward_hook(
            lambda m, a, out, i=i: keep(f"layers.{i}.post_attention_layernorm", out)))
        hooks.append(layer.mlp.register_forward_hook(lambda m, a, out, i=i: keep(f"layers.{i}.mlp_output", out)))
        hooks.append(layer.register_forward_hook(lambda m, a, out, i=i: keep(f"layers.{i}.output", out[0])))
        if hasattr(layer.mlp, "experts"):  # the router's choice [N, k] as the experts receive it
            hooks.append(layer.mlp.experts.register_forward_hook(
                lambda m, a, out, i=i: keep(f"layers.{i}.mlp.gate.topk_idx", a[1],
                                            f"layers.{i}.mlp.gate.topk_weight", a[2])))
    hooks.append(text.norm.register_forward_hook(lambda m, a, out: keep("norm", out)))
    # the softcap 30 tanh(x / 30) is applied in the wrapper's forward, after lm_head
    hooks.append(model.lm_head.register_forward_hook(lambda m, a, out: keep("logits_uncapped", out)))
    prefill_then_decode(model, prompt, generated, start, keep, step, hooks)
    return found
