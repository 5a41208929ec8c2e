"""Where the layer's weights come from, behind one small interface: `source.get(name)`.

Names are those of an HF checkpoint (`model.layers.3.self_attn.kv_a_proj_with_mqa.weight`).
`weight_shapes` lists every tensor a config needs. `SyntheticWeights` makes any of them on demand,
deterministically from (seed, name), so a routed expert is only ever made when a token chooses it.
`ArrayWeights` serves tensors already in memory (tests, the PyTorch cross-check).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Protocol

import numpy as np

from .config import Config
from .errors import StepperError


class WeightSource(Protocol):
    config: Config

    def get(self, name: str) -> np.ndarray:
        """The float32 tensor stored under an HF checkpoint name."""
        ...


def layer_prefix(layer: int) -> str:
    return f"model.layers.{layer}."


def attention_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    d, h = cfg.hidden_size, cfg.num_attention_heads
    shapes: dict[str, tuple[int, ...]] = {}
    if cfg.q_lora_rank is None:
        shapes["self_attn.q_proj.weight"] = (h * cfg.qk_head_dim, d)
    else:
        shapes["self_attn.q_a_proj.weight"] = (cfg.q_lora_rank, d)
        shapes["self_attn.q_a_layernorm.weight"] = (cfg.q_lora_rank,)
        shapes["self_attn.q_b_proj.weight"] = (h * cfg.qk_head_dim, cfg.q_lora_rank)
    shapes["self_attn.kv_a_proj_with_mqa.weight"] = (cfg.kv_lora_rank + cfg.qk_rope_head_dim, d)
    shapes["self_attn.kv_a_layernorm.weight"] = (cfg.kv_lora_rank,)
    shapes["self_attn.kv_b_proj.weight"] = (h * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
    shapes["self_attn.o_proj.weight"] = (d, h * cfg.v_head_dim)
    return shapes


def swiglu_shapes(prefix: str, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    return {
        f"{prefix}gate_proj.weight": (inter, hidden),
        f"{prefix}up_proj.weight": (inter, hidden),
        f"{prefix}down_proj.weight": (hidden, inter),
    }


def layer_shapes(cfg: Config, layer: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of one decoder layer, by full HF name, with its shape."""
    d = cfg.hidden_size
    shapes = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,), **attention_shapes(cfg)}
    if cfg.is_moe_layer(layer):
        shapes["mlp.gate.weight"] = (cfg.n_routed_experts, d)
        shapes["mlp.gate.e_score_correction_bias"] = (cfg.n_routed_experts,)
        for e in range(cfg.n_routed_experts):
            shapes.update(swiglu_shapes(f"mlp.experts.{e}.", d, cfg.moe_intermediate_size))
        shared = cfg.moe_intermediate_size * cfg.n_shared_experts
        if shared:
            shapes.update(swiglu_shapes("mlp.shared_experts.", d, shared))
    else:
        shapes.update(swiglu_shapes("mlp.", d, cfg.intermediate_size))
    return {layer_prefix(layer) + k: v for k, v in shapes.items()}


def weight_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of the whole model, by full HF name, with its shape."""
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size)}
    for layer in range(cfg.num_hidden_layers):
        shapes.update(layer_shapes(cfg, layer))
    shapes["model.norm.weight"] = (cfg.hidden_size,)
    shapes["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    return shapes


def shape_of(cfg: Config, name: str) -> tuple[int, ...]:
    """The shape of one named tensor, without listing all of a full-size model's experts."""
    if name.startswith("model.layers."):
        layer = int(name.split(".")[2])
        if 0 <= layer < cfg.num_hidden_layers:
            shapes = layer_shapes(cfg, layer)
            if name in shapes:
                return shapes[name]
    elif name in (globals_ := _global_shapes(cfg)):
        return globals_[name]
    raise StepperError(f"no tensor named '{name}' in model {cfg.name}")


def _global_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    return {
        "model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size),
        "model.norm.weight": (cfg.hidden_size,),
        "lm_head.weight": (cfg.vocab_size, cfg.hidden_size),
    }


class SyntheticWeights:
    """Deterministic weights with realistic scales, made per tensor from (seed, name).

    Linear weights [out, in] ~ N(0, 1/in), so activations keep unit scale; RMSNorm weights near 1;
    the router's e_score_correction_bias ~ N(0, 0.1^2), large enough to change some choices;
    embeddings ~ N(0, 1).
    """

    def __init__(self, config: Config, seed: int = 0):
        self.config = config
        self.seed = seed

    def get(self, name: str) -> np.ndarray:
        shape = shape_of(self.config, name)
        z = self._normal(name, shape)
        if name.endswith("norm.weight"):
            return np.float32(1) + np.float32(0.1) * z
        if name.endswith("e_score_correction_bias"):
            return np.float32(0.1) * z
        if name == "model.embed_tokens.weight":
            return z
        return z * np.float32(1 / np.sqrt(shape[-1]))

    def _normal(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        digest = hashlib.sha256(name.encode()).digest()
        words = np.frombuffer(digest[:16], dtype=np.uint32).tolist()
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, *words]))
        return rng.standard_normal(shape, dtype=np.float32)


class ArrayWeights:
    """Weights already in memory, checked against the config's shapes when read."""

    def __init__(self, config: Config, arrays: Mapping[str, np.ndarray], source: str = "weights"):
        self.config = config
        self.arrays = arrays
        self.source = source

    def get(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            raise StepperError(f"{self.source}: tensor '{name}' is missing")
        array = np.asarray(self.arrays[name], dtype=np.float32)
        expected = shape_of(self.config, name)
        if array.shape != expected:
            raise StepperError(f"{self.source}: tensor '{name}' has shape {list(array.shape)}, expected {list(expected)}")
        return array
