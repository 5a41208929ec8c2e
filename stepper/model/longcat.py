"""LongCat-Flash's layer: two attention sublayers and two dense-MLP sublayers in a row, and a MoE
beside them (the "shortcut"), which reads the first sublayer's post-attention norm and whose
output is added at the layer's end:

    h1 = x + attn_0(norm(x));        m = norm(h1)
    moe_out = MoE(m)                  (zero experts return their input)
    h2 = h1 + mlp_0(m)
    h3 = h2 + attn_1(norm(h2))
    out = h3 + mlp_1(norm(h3)) + moe_out

Each sublayer's tensors are named under `sub0.` / `sub1.` with the names of a DeepSeek layer
(`layers.3.sub1.self_attn.q`), its weights are transformers' `<module>.0.` / `<module>.1.`, and
the second attention keeps its own cache (LayerCache.second). Shapes: B batch, T positions, d hidden.
"""

from __future__ import annotations

import numpy as np

from stepper.model.cache import LayerCache
from stepper.model.layer import attention_block, ffn_output, layer_input, layer_output, mla_step
from stepper.model.layer_weights import LayerWeights
from stepper.model.mlp import dense_mlp
from stepper.model.moe import moe
from stepper.model.options import LayerOptions
from stepper.seams.trace import Emitter

SUBLAYER_MODULES = {  # a sublayer's module -> transformers' list of the two
    "self_attn": "self_attn", "input_layernorm": "input_layernorm",
    "post_attention_layernorm": "post_attention_layernorm", "mlp": "mlps",
}


class SublayerWeights:
    """Sublayer j's view of a LongCat layer's weights: `self_attn.q_a_proj.weight` is
    `self_attn.j.q_a_proj.weight`, `mlp.gate_proj.weight` is `mlps.j.gate_proj.weight`; the
    config and rotary tables are the layer's."""

    def __init__(self, w: LayerWeights, j: int):
        self.w, self.j, self.layer, self.cfg, self.rope = w, j, w.layer, w.cfg, w.rope

    def name(self, name: str) -> str:
        module, _, rest = name.partition(".")
        return f"{SUBLAYER_MODULES[module]}.{self.j}.{rest}"

    def __call__(self, name: str) -> np.ndarray:
        return self.w(self.name(name))

    def matrix(self, name: str):
        return self.w.matrix(self.name(name))

    def float32(self, name: str) -> np.ndarray:
        return self.w.float32(self.name(name))


def longcat_layer(hidden: np.ndarray, w: LayerWeights, cache: LayerCache | None, options: LayerOptions,
                  emit: Emitter) -> np.ndarray:
    """[B, T, d] residual stream in -> [B, T, d] out; w carries the config and the rotary tables."""
    hidden = layer_input(hidden, emit)
    cache = LayerCache() if cache is None else cache
    cache.second = LayerCache() if cache.second is None else cache.second
    first, second = SublayerWeights(w, 0), SublayerWeights(w, 1)
    sub0, sub1 = emit.sublayer(0), emit.sublayer(1)
    hidden, x = attention_block(hidden, first, sub0, mla_step(first, cache, options, sub0))  # [B, T, d] twice
    shortcut = moe(x, w, options, emit)  # [B, T, d], the MoE beside the sublayers
    hidden = layer_output(sub0, hidden, ffn_output(dense_mlp(x, first, sub0), first, sub0))
    hidden, x = attention_block(hidden, second, sub1, mla_step(second, cache.second, options, sub1))
    return layer_output(emit, hidden, ffn_output(dense_mlp(x, second, sub1), second, sub1), shortcut)
