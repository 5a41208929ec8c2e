"""The Kimi K2 / DeepSeek-V3 decoder: MLA attention, the MoE router and experts, the dense MLP,
the decoder block and the whole-model glue; and the parts other families add to it or put in its
place (DeepSeek-V3.2's Lightning Indexer, DeepSeek-V4's compressed attention, hyper-connections
and clamped experts, Kimi Linear's KDA, LongCat-Flash's layer, the MLA variants' small changes).
Model code reads like the math, reports every named tensor through `emit` and never prints."""

from stepper.model.cache import KVCache
from stepper.model.transformer import Transformer

__all__ = ["KVCache", "Transformer"]
