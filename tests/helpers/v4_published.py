"""A tiny DeepSeek-V4 checkpoint in the published layout, written by the tests that read it: names
without `model.`, FP8 e4m3 linears with F8_E8M0 `.scale` [ceil(out/128), ceil(in/128)], FP4
routed experts as I8 [out, in/2] with F8_E8M0 scales per 32 inputs, BF16 norms and projections,
F32 hc_* / ape / attn_sink / gate.bias, I64 tid2eid, an `mtp.0.*` block, and shards
model-000NN-of-000MM.safetensors with (or without) the index.

The arrays are made by stepper.weights.published_store (as `synth` makes them); `write_tiny_v4`
returns each tensor's values, the quantized ones decoded by ml_dtypes, independently of
stepper.fp4, so a test can compare what stepper reads, or break one tensor and see it refused."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np

from stepper.weights import deepseek_v4_names as v4
from stepper.weights.published_store import safetensors_dtype, stored_arrays
from stepper.weights.safetensors_writer import Entry, write_safetensors

CONFIG = {
    "model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"],
    "vocab_size": 40, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2, "head_dim": 32,
    "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16, "n_routed_experts": 2, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "hc_mult": 2, "compress_ratios": [0, 4, 128, 0],
    "num_hash_layers": 1, "index_n_heads": 2, "index_head_dim": 16, "expert_dtype": "fp4",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                            "weight_block_size": [128, 128]},
    # the rest a run reads (and inspect checks as a run does): tiny-v4's
    "num_nextn_predict_layers": 1, "qk_rope_head_dim": 8, "sliding_window": 8, "index_topk": 4,
    "max_position_embeddings": 4096, "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 256, "beta_fast": 32,
                     "beta_slow": 1},
    "rms_norm_eps": 1e-06, "hc_eps": 1e-06, "hc_sinkhorn_iters": 20, "swiglu_limit": 10.0,
    "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
    "num_key_value_heads": 1, "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
    "bos_token_id": 0, "eos_token_id": 1,
}


def fp4_values(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """FP4 bytes and E8M0 scales decoded by ml_dtypes: low nibble first, each code one float4_e2m1fn."""
    raw = packed.view(np.uint8)
    codes = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(raw.shape[0], -1)  # [out, in]
    values = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    return values * np.repeat(scales.astype(np.float32), 32, axis=1)


def fp8_values(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    spread = np.repeat(np.repeat(scales.astype(np.float32), 128, 0), 128, 1)[: codes.shape[0], : codes.shape[1]]
    return codes.astype(np.float32) * spread


def stored_tensors(cfg: dict, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(stored arrays by name, float32 values by weight name) for every tensor of the config, and mtp.0.*."""
    rng = np.random.default_rng(seed)
    wanted = dict(v4.global_tensors(cfg))
    for layer in range(cfg["num_hidden_layers"]):
        wanted.update({v4.layer_prefix(layer) + k: t for k, t in v4.layer_tensors(cfg, layer).items()})
    wanted["mtp.0.attn.wq_a.weight"] = v4.Tensor((cfg["q_lora_rank"], cfg["hidden_size"]), v4.LINEAR)
    wanted["mtp.0.norm.weight"] = v4.Tensor((cfg["hidden_size"],), v4.FLOAT)
    stored, values = {}, {}
    for name, tensor in wanted.items():
        if tensor.kind == v4.INDEX:
            first = rng.integers(0, cfg["n_routed_experts"], tensor.shape)[:, :1]  # drawn as before: the rest alike
            w = (first + np.arange(tensor.shape[1])) % cfg["n_routed_experts"]  # k distinct experts a token
        else:
            w = (rng.standard_normal(tensor.shape) * 0.1).astype(np.float32)
        arrays = stored_arrays(name, tensor, w)
        stored.update(arrays)
        scale = arrays.get(name.removesuffix(".weight") + ".scale")
        if tensor.kind == v4.EXPERT:
            values[name] = fp4_values(arrays[name], scale)
        elif tensor.kind == v4.LINEAR:
            values[name] = fp8_values(arrays[name], scale)
        else:
            values[name] = arrays[name] if tensor.kind == v4.INDEX else arrays[name].astype(np.float32)
    return stored, values


def write_shards(folder: Path, stored: dict[str, np.ndarray], shards: int, index: bool = True,
                 cfg: dict | None = None) -> None:
    """The arrays in `shards` files named model-000NN-of-000MM.safetensors, round robin (a weight's
    scale lands in the next shard), the config, and the index unless index=False."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg or CONFIG))
    names = list(stored)
    files = {f"model-{n + 1:05d}-of-{shards:05d}.safetensors": names[n::shards] for n in range(shards)}
    for file, members in files.items():
        entries = [Entry(name, safetensors_dtype(stored[name]), stored[name].shape, lambda a=stored[name]: a)
                   for name in members]
        write_safetensors(folder / file, entries)
    if index:
        weight_map = {name: file for file, members in files.items() for name in members}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def write_tiny_v4(folder: Path, shards: int = 3, index: bool = True, seed: int = 0, cfg: dict | None = None,
                  changed: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The tiny checkpoint in `folder` (tensors in `changed` stored as given instead); returns the values."""
    stored, values = stored_tensors(cfg or CONFIG, seed)
    stored.update(changed or {})
    write_shards(folder, stored, shards, index, cfg)
    return values
