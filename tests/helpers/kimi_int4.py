"""An INT4 checkpoint laid out as Kimi-K2-Thinking, written without stepper's writer or quantizer.

The weights are drawn with torch; the routed experts are quantized here in torch (symmetric,
one scale per 32 inputs, scale = largest |w| / 7.5 rounded to BF16, codes round(w / scale)
clamped to -8..7) and packed with compressed-tensors' own `pack_to_int32`; the files are written
with safetensors' torch writer, in shards with an index, and config.json carries the
quantization_config of Kimi-K2-Thinking's config.json. Everything else is BF16 but the router's
bias (F32), as in the real checkpoint.

`write_kimi_int4` returns the weights a reader must compute: each expert's exact dequantization
(code x scale, in float64, then float32: exact), the rest as stored.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from safetensors.torch import save_file

# one thread: these models are tiny, and a second OpenMP thread on a busy 2-core machine makes
# each small op wait tens of milliseconds for it (a trace took 2.4 s instead of 0.02 s)
torch.set_num_threads(1)

# Kimi-K2-Thinking's config.json, quantization_config (as published)
KIMI_K2_THINKING_QUANTIZATION = {
    "config_groups": {
        "group_0": {
            "input_activations": None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": None, "block_structure": None, "dynamic": False, "group_size": 32, "num_bits": 4,
                "observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": True, "type": "int",
            },
        }
    },
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}
EXPERT = re.compile(r"model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight")


def quantize_group32(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 [out, in] -> (int8 codes -8..7 [out, in], BF16 scales [out, ceil(in/32)])."""
    out_dim, in_dim = w.shape
    groups = -(-in_dim // 32)
    padded = torch.nn.functional.pad(w, (0, groups * 32 - in_dim)).reshape(out_dim, groups, 32)
    scale = (padded.abs().amax(dim=2) / 7.5).to(torch.bfloat16)  # [out, groups]
    per_input = scale.float().repeat_interleave(32, dim=1)[:, :in_dim]
    codes = torch.round(w / per_input).clamp(-8, 7).to(torch.int8)
    return codes, scale


def write_kimi_int4(folder: Path, config: dict, shapes: dict[str, tuple[int, ...]], seed: int = 0,
                    latent_gain: float = 1.0) -> dict[str, np.ndarray]:
    """Write the checkpoint into `folder` (made here); return every weight as a reader must see it.
    latent_gain scales q_a_proj and kv_a_proj_with_mqa (and so the latents the two latent norms see)."""
    folder.mkdir()
    generator = torch.Generator().manual_seed(seed)
    shards: dict[str, dict[str, torch.Tensor]] = {}
    exact: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        shard = f"model-{layer_of(name) + 2:05d}-of-{99:05d}.safetensors"
        tensors = shards.setdefault(shard, {})
        w = torch.randn(shape, generator=generator, dtype=torch.float32)
        if name.endswith("norm.weight"):
            w = 1 + 0.1 * w
        elif name.endswith("e_score_correction_bias"):
            w = 0.1 * w
        elif len(shape) == 2 and "embed_tokens" not in name:
            w = w / shape[1] ** 0.5
        if name.endswith(("q_a_proj.weight", "kv_a_proj_with_mqa.weight")):
            w = w * latent_gain  # small latents, as trained models have them: eps then matters
        if EXPERT.fullmatch(name):
            codes, scale = quantize_group32(w)
            tensors[name + "_packed"] = pack_to_int32(codes, 4)
            tensors[name + "_scale"] = scale
            tensors[name + "_shape"] = torch.tensor(shape, dtype=torch.int64)
            per_input = scale.double().repeat_interleave(32, dim=1)[:, : shape[1]]
            exact[name] = (codes.double() * per_input).float().numpy()
        elif name.endswith("e_score_correction_bias"):
            tensors[name] = w
            exact[name] = w.numpy()
        else:
            tensors[name] = w.to(torch.bfloat16)
            exact[name] = tensors[name].float().numpy()
    weight_map = {}
    for shard, tensors in shards.items():
        save_file(tensors, str(folder / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": KIMI_K2_THINKING_QUANTIZATION}))
    return exact


def layer_of(name: str) -> int:
    """The layer a tensor belongs to, -1 for the embedding, norm and lm_head."""
    m = re.match(r"model\.layers\.(\d+)\.", name)
    return int(m[1]) if m else -1
