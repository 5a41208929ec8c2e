"""An independent PyTorch reference for DeepSeek-V4's attention: transformers' DeepseekV4Model,
traced per attention layer.

A tiny `DeepseekV4Config` (random weights, every parameter drawn: sinks and position biases too)
is run in float32 with its own cache over a prompt and then decode steps. What the attention
modules really materialise is captured with hooks (projections, norms, the compressor's and the
indexer's modules, the indexer's picks, the grouped output) and a temporary wrapper around the
module-level `eager_attention_forward` (the turned queries, the keys with the compressed entries,
the mask, the weights after the sink was dropped, the output before it is turned back). It shares
no code with stepper.

    trace(config, steps, seed) -> (weights {name: array}, [per step: {layer: {name: array}}])
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import transformers.models.deepseek_v4.modeling_deepseek_v4 as hf_v4
from transformers import DeepseekV4Config
from transformers.cache_utils import DynamicCache


def tiny_config(**overrides) -> DeepseekV4Config:
    """Three layers, sliding / CSA / HCA; tiny sizes; YaRN on the compressed layers."""
    fields = dict(  # noqa: C408 (keyword arguments of the config)
        vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
        head_dim=16, qk_rope_head_dim=8, q_lora_rank=24, num_experts_per_tok=2, n_routed_experts=4,
        o_groups=2, o_lora_rank=12, sliding_window=8, index_n_heads=8, index_head_dim=8, index_topk=3,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
        mlp_layer_types=["moe"] * 3, rope_theta=10000.0, compress_rope_theta=160000.0, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64,
                         "beta_fast": 32, "beta_slow": 1},
        max_position_embeddings=1024,
    )
    fields.update(overrides)
    config = DeepseekV4Config(**fields)
    config._attn_implementation = "eager"
    return config


def build(config: DeepseekV4Config, seed: int) -> hf_v4.DeepseekV4Model:
    torch.manual_seed(seed)
    model = hf_v4.DeepseekV4Model(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "position_bias" in name or name.endswith("sinks"):
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    return model


@contextlib.contextmanager
def recording_attention(store: dict):
    """Wrap transformers' eager attention: keep its inputs and outputs per layer."""
    original = hf_v4.eager_attention_forward

    def recorded(module, query, key, value, attention_mask, scaling, **kwargs):
        out, weights = original(module, query, key, value, attention_mask, scaling, **kwargs)
        store.setdefault(module.layer_idx, {}).update(
            q_rope=query, keys=key[:, 0], mask=attention_mask, weights=weights, output=out.transpose(1, 2))
        return out, weights

    hf_v4.eager_attention_forward = recorded
    try:
        yield
    finally:
        hf_v4.eager_attention_forward = original


def hooks(model: hf_v4.DeepseekV4Model, store: dict) -> list:
    """Forward hooks on every attention's modules; each writes store[layer][name]."""
    handles = []

    def keep(layer: int, name: str, what: str = "output"):
        def hook(_module, args, output):
            value = args[0] if what == "input" else (output[0] if isinstance(output, tuple) else output)
            store.setdefault(layer, {})[name] = value
        return hook

    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        handles.append(attn.register_forward_pre_hook(lambda _m, args, i=i: store.setdefault(i, {}).update(x=args[0])))
        named = {"q_a": attn.q_a_proj, "q_a_norm": attn.q_a_norm, "q_b": attn.q_b_proj, "q": attn.q_b_norm,
                 "kv_proj": attn.kv_proj, "kv": attn.kv_norm, "o_groups": attn.o_a_proj, "o": attn.o_b_proj}
        for name, module in named.items():
            handles.append(module.register_forward_hook(keep(i, name)))
        handles.append(attn.o_a_proj.register_forward_hook(keep(i, "output_turned_back", "input")))
        comp = attn.compressor
        if comp is None:
            continue
        for prefix, c in (("compressor", comp), ("indexer.compressor", getattr(comp, "indexer", None))):
            if c is None:
                continue
            handles.append(c.kv_proj.register_forward_hook(keep(i, f"{prefix}.kv")))
            handles.append(c.gate_proj.register_forward_hook(keep(i, f"{prefix}.gate")))
            handles.append(c.kv_norm.register_forward_hook(keep(i, f"{prefix}.pooled", "input")))
            handles.append(c.kv_norm.register_forward_hook(keep(i, f"{prefix}.normed")))
        handles.append(comp.register_forward_hook(keep(i, "entries")))
        if hasattr(comp, "indexer"):
            handles.append(comp.indexer.register_forward_hook(keep(i, "indexer.chosen")))
            handles.append(comp.indexer.q_b_proj.register_forward_hook(keep(i, "indexer.q_b")))
            handles.append(comp.indexer.scorer.weights_proj.register_forward_hook(keep(i, "indexer.weights_proj")))
            handles.append(comp.indexer.scorer.register_forward_hook(keep(i, "indexer.raw_scores")))
            handles.append(comp.indexer.scorer.register_forward_pre_hook(
                lambda _m, args, i=i: store[i].update({"indexer.q": args[0], "indexer.keys": args[1]})))
    return handles


def trace(config: DeepseekV4Config, steps: list[np.ndarray], seed: int = 0):
    """Run the prompt steps[0] and each decode step after it through one cache; return the
    weights (numpy, transformers' names) and per step {layer: {name: numpy array}}."""
    model = build(config, seed)
    weights = {name: p.detach().numpy().copy() for name, p in model.named_parameters()}
    cache = DynamicCache(config=config)
    traced = []
    for ids in steps:
        store: dict = {}
        handles = hooks(model, store)
        try:
            with recording_attention(store), torch.no_grad():
                model(input_ids=torch.as_tensor(ids), cache=cache, use_cache=True)
        finally:
            for h in handles:
                h.remove()
        traced.append({layer: {k: v.detach().numpy().copy() for k, v in named.items() if v is not None}
                       for layer, named in store.items()})
    return weights, traced
