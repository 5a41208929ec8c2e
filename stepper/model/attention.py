"""Multi-head Latent Attention (MLA): the naive path of the reference modeling_deepseek.py and
the absorbed path of DeepSeek's inference code.

The query goes through a low-rank bottleneck (q_a -> RMSNorm -> q_b). Keys and values are
compressed jointly into one latent per token (kv_lora dims) plus one rotary key shared by all
heads (rope dims); the latent is normalised. Only the rotary dims carry position (decoupled RoPE).

- naive: kv_b up-projects the latent into per-head keys (nope part) and values; attention runs
  over them. The cache keeps every position's per-head keys and values.
- absorbed: kv_b's key half W_UK is folded into the query (q_nope_absorbed = q_nope W_UK) and its
  value half W_UV is applied after attention, so attention runs over the cached latents
  themselves. The cache keeps one latent and one rotary key per position: the point of MLA.

Shapes name the catalogue's dimensions (catalog/parts/*.json "dims"): B batch, T new positions, S attended
positions, H heads, d hidden, and the head and latent sizes nope, rope, qk_head, v_head, kv_lora.
Each path writes out its attention in whole arrays where they are small; a larger attention runs
over tiles of queries and keys with an online softmax (kernels.attention, tested equal to these
lines), and its scores and weights are shown as tensors made a tile at a time (stepper.tensors.tiled).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from stepper.config import Config
from stepper.errors import StepperError
from stepper.kernels import attention as kernels
from stepper.kernels.linear import linear
from stepper.model.cache import LayerCache
from stepper.model.layer_weights import LayerWeights
from stepper.model.lora_scale import lora_scaled
from stepper.model.ops import causal_mask, rms_norm, softmax
from stepper.model.options import LayerOptions
from stepper.model.output_gate import gated, q_b_input, split_gate
from stepper.model.query_scale import position_scaled, shown_query_scale
from stepper.model.rope import Rope, apply_rope, rotate_halves
from stepper.seams.swap import exercise, in_place_of
from stepper.seams.trace import Emitter

# q_a_layernorm and kv_a_layernorm: the references build these two norms with the norm's default
# eps, whatever rms_norm_eps says (docs/numerics.md); Kimi-K2-Thinking's rms_norm_eps is 1e-5.
LATENT_NORM_EPS = 1e-6


def mla_attention(x: np.ndarray, w: LayerWeights, cache: LayerCache | None, options: LayerOptions, emit: Emitter,
                  mask: np.ndarray | None = None) -> np.ndarray:
    """x [B, T, d] (after input_layernorm) -> o_proj output [B, T, d] on the options' attention path
    (naive or absorb); mask [B, T, S], additive (0 or -inf), every head alike: DeepSeek-V3.2's
    indexer's choice. w carries the config and the rotary tables."""
    cfg, rope = w.cfg, w.rope
    cache = LayerCache() if cache is None else cache
    q_nope, q_pe, gate = query_heads(x, w, cfg, emit)  # [B, H, T, nope], [B, H, T, rope], A.X-K2's [B, T, Hv]
    if cfg.kv_shared(w.layer):  # Mistral Large 4: an earlier layer's latent, its rotary key turned already
        compressed_kv, k_pe = shared_latent(cache, x.shape[1], w, emit), None  # [B, T, kv_lora]
    else:
        compressed_kv, k_pe = latent(x, w, cfg, emit)  # [B, T, kv_lora], [B, one, T, rope]
    rope = shown_query_scale(rope, w, emit)  # Mistral 4's query scale per position, Mistral Large 4's per head too
    if cfg.mla_lora_scales:  # LongCat-Flash
        q_nope, q_pe, compressed_kv = lora_scaled(q_nope, q_pe, compressed_kv, cfg, emit)
    if cfg.gate_proj:  # Hy4: the output gate has a projection of its own
        gate = emit("self_attn.gate", linear(x, w.matrix("self_attn.gate_proj.weight")))  # [B, T, Hv]
    if cfg.head_gate:  # Ling 3: one gate per head, each of its output dims alike
        gate = per_head_gate(x, w, cfg, emit)  # [B, T, Hv]
    attend = absorbed if options.attention == "absorb" else naive
    out = attend(q_nope, q_pe, compressed_kv, k_pe, w, cfg, rope, cache, emit, per_head(mask))  # [B, H, T, v_head]
    return output_projection(out, w, emit, gate)


def query_heads(x: np.ndarray, w: LayerWeights, cfg: Config,
                emit: Emitter) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """q = q_b(RMSNorm(q_a(x))) split per head into its nope and rope parts; A.X-K2's q_b reads
    RMSNorm(q_a(x)) and q_a(x) side by side and also gives each head's output gate (model.output_gate)."""
    B, T, _ = x.shape
    if cfg.q_lora_rank is None:
        q = linear(x, w.matrix("self_attn.q_proj.weight"))  # [B, T, H*qk_head]
    else:
        q_a = emit("self_attn.q_a", linear(x, w.matrix("self_attn.q_a_proj.weight")))  # [B, T, q_lora]
        q_a_norm = emit("self_attn.q_a_norm", rms_norm(q_a, w("self_attn.q_a_layernorm.weight"), LATENT_NORM_EPS))
        q = linear(q_b_input(q_a_norm, q_a, cfg), w.matrix("self_attn.q_b_proj.weight"))  # [B, T, H*qk_head (+ Hv)]
    q = q.reshape(B, T, cfg.num_attention_heads, -1).transpose(0, 2, 1, 3)  # [B, H, T, qk_head (+ v_head)]
    q, gate = split_gate(q, cfg)  # [B, H, T, qk_head], A.X-K2's [B, T, Hv]
    if gate is not None:
        gate = emit("self_attn.q_gate", gate)
    q = emit("self_attn.q", q)
    if not cfg.rope_dims(w.layer):  # a NoPE layer (Mistral Large 4): no head dim carries position
        return q, q[..., :0], gate
    q_nope = emit("self_attn.q_nope", q[..., : cfg.qk_nope_head_dim])  # [B, H, T, nope]
    q_pe = emit("self_attn.q_pe", q[..., cfg.qk_nope_head_dim :])  # [B, H, T, rope]
    return q_nope, q_pe, gate


def per_head_gate(x: np.ndarray, w: LayerWeights, cfg: Config, emit: Emitter) -> np.ndarray:
    """Ling 3's output gate: one logit per head from g_proj, repeated over the head's output dims
    (what output_projection multiplies the merged heads by the sigmoid of).  [B, T, d] -> [B, T, Hv]"""
    gate = emit("self_attn.head_gate", linear(x, w.matrix("self_attn.g_proj.weight")))  # [B, T, H]
    return np.repeat(gate, cfg.v_head_dim, axis=-1)  # [B, T, Hv]


@exercise
def latent(x: np.ndarray, w: LayerWeights, cfg: Config, emit: Emitter) -> tuple[np.ndarray, np.ndarray]:
    """The joint down-projection: one kv latent per token, normalised, plus the shared rotary key
    (none in a NoPE layer: [B, one, T, 0])."""
    B, T, _ = x.shape
    kv_a = linear(x, w.matrix("self_attn.kv_a_proj_with_mqa.weight"))  # [B, T, kv_a]
    rope_dims = cfg.rope_dims(w.layer)
    if rope_dims:
        kv_a = emit("self_attn.kv_a", kv_a)
    compressed_kv = emit("self_attn.compressed_kv", kv_a[..., : cfg.kv_lora_rank])  # [B, T, kv_lora]
    k_pe = kv_a[..., cfg.kv_lora_rank :].reshape(B, T, 1, rope_dims).transpose(0, 2, 1, 3)
    if rope_dims:
        k_pe = emit("self_attn.k_pe", k_pe)  # [B, one, T, rope]
    compressed_kv = rms_norm(compressed_kv, w("self_attn.kv_a_layernorm.weight"), cfg.latent_norm_eps)
    compressed_kv = emit("self_attn.compressed_kv_norm", compressed_kv)  # [B, T, kv_lora]
    return compressed_kv, k_pe


def shared_latent(cache: LayerCache, T: int, w: LayerWeights, emit: Emitter) -> np.ndarray:
    """The latents of the T new positions that the layer this one reads (Mistral Large 4's
    kv_source_layers) has normalised and cached this step (its rotary keys, turned, the cache gives:
    LayerCache.extend_latent).  -> [B, T, kv_lora]"""
    source = cache.kv_source
    if source is None:
        raise StepperError(f"layer {w.layer} reads the latent of layer {w.cfg.kv_source(w.layer)} (kv_source_layers): "
                           f"it runs after that layer, on one cache")
    return emit("self_attn.shared_latent", source.latent[:, -T:])


def naive(q_nope, q_pe, compressed_kv, k_pe, w, cfg, rope, cache: LayerCache, emit: Emitter, mask=None) -> np.ndarray:
    """Up-project the new latents into per-head keys and values, attend over all of them.
    -> [B, H, T, v_head], the heads' outputs before merging"""
    k_nope, value_states = up_project(compressed_kv, w, cfg, emit)  # [B, H, T, nope], [B, H, T, v_head]
    q_pe, k_pe = rotate(q_pe, k_pe, rope, emit)  # [B, H, T, rope], [B, one, T, rope]
    k_pe = cache.extend_latent(compressed_kv, k_pe)[1][:, :, -k_nope.shape[2]:]  # the new positions' (a reader's too)

    query_states = position_scaled(np.concatenate([q_nope, q_pe], axis=-1), rope)  # [B, H, T, qk_head]
    query_states = emit("self_attn.query_states", query_states)
    k_pe_per_head = np.broadcast_to(k_pe, (*k_nope.shape[:3], k_pe.shape[-1]))  # [B, H, T, rope]
    key_states = np.concatenate([k_nope, k_pe_per_head], axis=-1)  # [B, H, T, qk_head]
    key_states, value_states = cache.extend_heads(key_states, value_states)  # [B, H, S, qk_head], [B, H, S, v_head]
    key_states = emit("self_attn.key_states", key_states)
    value_states = emit("self_attn.value_states", value_states)

    # softmax(scale * query_states @ key_states^T, masked) @ value_states: each head its own keys
    mask, causal = seen_keys(mask, (*query_states.shape[:3], key_states.shape[2]))
    return attend(kernels.Operands([query_states], [key_states], value_states, rope.softmax_scale, mask,
                                   in_place_of(softmax), causal, sinks_of(w, cfg)), emit)


@exercise
def absorbed(q_nope, q_pe, compressed_kv, k_pe, w, cfg, rope, cache: LayerCache, emit: Emitter,
             mask=None) -> np.ndarray:
    """Attend over the cached latents: W_UK folded into the query, W_UV applied afterwards.
    -> [B, H, T, v_head], the heads' outputs before merging"""
    w_uk, w_uv = split_kv_b(w.float32("self_attn.kv_b_proj.weight"), cfg)  # [H, nope, kv_lora], [H, v_head, kv_lora]
    q_latent = emit("self_attn.q_nope_absorbed", np.matmul(q_nope, w_uk))  # [B, H, T, kv_lora]
    q_pe, k_pe = rotate(q_pe, k_pe, rope, emit)  # [B, H, T, rope], [B, one, T, rope]
    latents, k_pes = cache.extend_latent(compressed_kv, k_pe)  # [B, S, kv_lora], [B, one, S, rope]

    # Every head attends over the same latents and rotary keys, scores q_latent @ latents^T + q_pe @ k_pes^T,
    # and its weights average the latents themselves.
    shared = latents[:, None]  # [B, one, S, kv_lora]: keys and values alike
    queries = [position_scaled(q_latent, rope), position_scaled(q_pe, rope)]  # Mistral 4 scales both parts
    keys = [shared, k_pes]
    if not q_pe.shape[-1]:  # a NoPE layer: the latents' scores alone
        queries, keys = queries[:1], keys[:1]
    mask, causal = seen_keys(mask, (*q_latent.shape[:3], shared.shape[2]))
    out_latent = attend(kernels.Operands(queries, keys, shared, rope.softmax_scale, mask,
                                         in_place_of(softmax), causal, sinks_of(w, cfg)), emit)
    out_latent = emit("self_attn.attn_output_latent", out_latent)
    return np.matmul(out_latent, w_uv.swapaxes(-1, -2))  # [B, H, T, v_head]


def sinks_of(w: LayerWeights, cfg: Config) -> np.ndarray | None:
    """Hy4's sink logit per head [H]: one more logit in each softmax, its weight dropped (None: none)."""
    return w("self_attn.sinks") if cfg.attention_sinks else None


def split_kv_b(kv_b: np.ndarray, cfg: Config) -> tuple[np.ndarray, np.ndarray]:
    """kv_b_proj [H*nope_v, kv_lora] -> its key half W_UK [H, nope, kv_lora] and value half
    W_UV [H, v_head, kv_lora] (a NoPE layer's key half is the whole head: kv_b's rows say which)."""
    per_head = kv_b.reshape(cfg.num_attention_heads, -1, cfg.kv_lora_rank)  # [H, nope_v, kv_lora]
    nope = per_head.shape[1] - cfg.v_head_dim
    return per_head[:, :nope], per_head[:, nope:]


def up_project(compressed_kv: np.ndarray, w: LayerWeights, cfg: Config, emit: Emitter) -> tuple[np.ndarray, np.ndarray]:
    """kv_b turns each token's latent into per-head keys (nope part; a NoPE layer's whole head) and values."""
    B, T, _ = compressed_kv.shape
    nope = cfg.nope_dims(w.layer)
    kv = linear(compressed_kv, w.matrix("self_attn.kv_b_proj.weight"))  # [B, T, H*nope_v]
    kv = kv.reshape(B, T, cfg.num_attention_heads, nope + cfg.v_head_dim).transpose(0, 2, 1, 3)
    if not cfg.rope_dims(w.layer):  # a NoPE layer: its keys are shown whole (key_states)
        return kv[..., :nope], kv[..., nope:]
    kv = emit("self_attn.kv", kv)  # [B, H, T, nope_v]
    k_nope = emit("self_attn.k_nope", kv[..., :nope])  # [B, H, T, nope]
    return k_nope, kv[..., nope:]  # values [B, H, T, v_head]


def turned(x: np.ndarray, rope: Rope) -> np.ndarray:
    """x's rotary dims turned by the rope's angles: interleaved pairs, or (MiniCPM3) dim i with dim
    i + rope/2; as they are where the model has no rotary tables (Kimi Linear) or the layer no rotary
    dims (a NoPE layer's [..., T, 0]).  [..., T, rope] -> same"""
    if not rope.rotates or not x.shape[-1]:
        return x
    if rope.interleaved:
        return apply_rope(x, rope.cos, rope.sin)
    return rotate_halves(x, rope.cos, rope.sin, x.shape[-1])


def rotate(q_pe: np.ndarray, k_pe: np.ndarray | None, rope: Rope,
           emit: Emitter) -> tuple[np.ndarray, np.ndarray | None]:
    """Decoupled RoPE on the query's and the shared key's rotary dims: interleaved pairs, or
    (MiniCPM3) dim i with dim i + rope/2; none in a model without rotary tables (Kimi Linear: its
    rope dims enter the scores as projected); the query's alone where the key was turned by the
    layer whose latent this one reads (k_pe None)."""
    if not rope.rotates or not q_pe.shape[-1]:  # or a NoPE layer (Mistral Large 4)
        return q_pe, k_pe
    q_pe = emit("self_attn.q_pe_rope", turned(q_pe, rope))  # [B, H, T, rope]
    if k_pe is not None:
        k_pe = emit("self_attn.k_pe_rope", turned(k_pe, rope))  # [B, one, T, rope]
    return q_pe, k_pe


def seen_keys(mask: np.ndarray | None, shape: tuple[int, int, int, int]) -> tuple[np.ndarray | None, bool]:
    """The keys each query sees, as the tiles take them (scores of `shape`, [B, H, T, S]): (the extra
    mask, True) with stepper's own causal mask, or, where the scores run over tiles while a
    learner's causal_mask is swapped in, (its [T, S] joined to the extra mask, False): the tiles
    then keep what the learner's mask keeps, as the lines on whole arrays do, which call it
    themselves (a learner's softmax is handed to the tiles likewise: in_place_of)."""
    if in_place_of(causal_mask) is None or kernels.whole_fits(*shape):
        return mask, True
    rule = np.asarray(causal_mask(shape[2], shape[3]), dtype=bool)  # [T, S]
    if mask is None:
        return rule, False
    return (mask & rule if mask.dtype == np.bool_ else np.where(rule, mask, np.float32(-np.inf))), False


def attend(ops: kernels.Operands, emit: Emitter) -> np.ndarray:
    """softmax(scale * sum_i queries_i @ keys_i^T, masked) @ values: `held`'s lines on whole
    arrays, or, scores too many to hold, the same over tiles (kernels.attention, tested equal).
    -> [B, H, T, v_head] naive, [B, H, T, kv_lora] absorbed"""
    return kernels.held_or_tiled(ops, partial(held, ops, emit), emit, shown)


def held(ops: kernels.Operands, emit: Emitter) -> np.ndarray:
    """The attention on whole arrays: the scores [B, H, T, S], their weights, the weights times
    the values. A key or value of one head ([B, one, S, ...]: the latents) serves every head."""
    every = slice(None)
    scores = kernels.times(ops.queries[0], ops.keys[0], every)  # [B, H, T, S]
    for q, k in zip(ops.queries[1:], ops.keys[1:]):  # the absorbed path's rotary part
        scores = scores + kernels.times(q, k, every)
    weights = attention_weights(scores, ops.scale, emit, ops.mask, None if ops.sinks is None else ops.weights_of)
    return kernels.weighted(weights, ops.values, every)  # weights [B, H, T, S]


def attention_weights(scores: np.ndarray, scale: float, emit: Emitter, mask: np.ndarray | None = None,
                      weights_of: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Scale, mask the future (and what `mask`, broadcast to [B, H, T, S], drops: False, or -inf
    added), softmax over the attended positions (weights_of: the softmax with each head's sink,
    kernels.attention.Operands.weights_of).  [B, H, T, S] -> same"""
    T, S = scores.shape[-2:]
    scores = scores * np.float32(scale)
    np.copyto(scores, np.float32(-np.inf), where=~causal_mask(T, S))
    if mask is not None:
        scores = np.where(mask, scores, np.float32(-np.inf)) if mask.dtype == np.bool_ else scores + mask
    return shown(scores, weights_of or softmax, emit)


def per_head(mask: np.ndarray | None) -> np.ndarray | None:
    """The indexer's mask [B, T, S] as [B, one, T, S]: the same positions for every head."""
    return None if mask is None else mask[:, None]


def shown(scores, weights_of, emit: Emitter):
    """Show the scores and the weights made of them: whole arrays, or `Tiled` ones (made a tile
    at a time when a sink looks: kernels.attention.held_or_tiled)."""
    scores = emit("self_attn.attn_scores", scores)
    return emit("self_attn.attn_weights", weights_of(scores))


def output_projection(out: np.ndarray, w: LayerWeights, emit: Emitter, gate: np.ndarray | None = None) -> np.ndarray:
    """Merge the heads (A.X-K2, Hy4, Ling 3: times sigmoid(gate)) and project back to the hidden size.
    [B, H, T, v_head] -> [B, T, d]"""
    B, H, T, v_head = out.shape
    merged = emit("self_attn.attn_output", out.transpose(0, 2, 1, 3).reshape(B, T, H * v_head))  # [B, T, Hv]
    if gate is not None:
        merged = emit("self_attn.attn_output_gated", gated(merged, gate))  # [B, T, Hv]
    return emit("self_attn.o_proj", linear(merged, w.matrix("self_attn.o_proj.weight")))  # [B, T, d]
