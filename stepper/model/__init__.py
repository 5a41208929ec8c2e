"""The Kimi K2 / DeepSeek-V3 decoder: MLA attention, the MoE router and experts, the dense MLP,
the decoder block and the whole-model glue. Model code reads like the math, reports every named
tensor through `emit` and never prints."""

from stepper.model.cache import KVCache
from stepper.model.transformer import Transformer

__all__ = ["KVCache", "Transformer"]
