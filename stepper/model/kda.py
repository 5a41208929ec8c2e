"""Kimi Delta Attention (KDA): Kimi Linear's attention, whose memory is one fixed-size state per
head instead of a cache that grows with every position.

For each token (shapes: B batch, T new positions, Hk heads, K key dims, Kv value dims, HK = Hk * K,
d hidden, W conv taps; Kimi Linear has K = Kv = `linear_head_dim`):

1. q, k, v = q_proj(x), k_proj(x), v_proj(x), each through its own causal depthwise convolution
   of W taps (the last tap on the token itself; the W - 1 inputs before it are the conv's own
   small state across calls), then SiLU.
2. q and k are L2-normalised per head, eps inside the root: x / sqrt(sum x^2 + 1e-6); q * K^-0.5.
3. The forget gate, per head and key channel, in log space:
   g = -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias)  (<= 0: a decay factor exp(g) in (0, 1]);
   Ling 3 (bailing_hybrid) projects with one f_proj and bounds it ("safe gate"):
   g = lower_bound * sigmoid(exp(A_log) * (f_proj(x) + dt_bias))  (in (lower_bound, 0)).
   The write strength, per head: beta = sigmoid(b_proj(x)).
4. Per head a state S [K, Kv] (zero before the first token), token by token (the gated delta rule):
     S     <- diag(exp(g_t)) S                      decay each key channel's row
     delta  = beta_t (v_t - S^T k_t)                 what the state should recall at k_t, minus what it does
     S     <- S + k_t delta^T                        write the correction at k_t
     o_t    = S^T q_t                                read with the query
5. o is RMS-normalised per head (o_norm), times sigmoid(g_b(g_a(x))) (Ling 3: sigmoid(g_proj(x))),
   merged and o_proj'ed.

Step 4 runs token by token here (`gated_delta_rule`, the reference); `stepper.kernels.kda_chunked` does
the same a chunk of tokens at a time with matrix products (the form long prompts use), tested
equal. A decode step carries the conv inputs and S (`KdaCache`), so it equals a re-run of the
longer prompt.
"""

from __future__ import annotations

import numpy as np

from stepper.kernels import kda_chunked
from stepper.kernels.linear import linear
from stepper.model.attention import output_projection
from stepper.model.cache import KdaCache
from stepper.model.layer_weights import LayerWeights
from stepper.model.ops import rms_norm, sigmoid, silu
from stepper.model.options import DeltaRule, LayerOptions
from stepper.seams.swap import bypasses, exercise
from stepper.seams.trace import Emitter
from stepper.tensors.tiled import Tiled

L2_EPS = 1e-6  # inside the root of q's and k's L2 norm (the reference's l2norm)


def kda_attention(x: np.ndarray, w: LayerWeights, cache: KdaCache | None, options: LayerOptions,
                  emit: Emitter) -> np.ndarray:
    """x [B, T, d] (after input_layernorm) -> o_proj output [B, T, d]. w carries the config
    (linear_num_heads, linear_head_dim, rms_norm_eps); `cache` (extended in place) the conv inputs
    and S before x; the options say how the state update runs (delta_rule)."""
    cfg = w.cfg
    cache = KdaCache() if cache is None else cache
    if x.shape[1] > 1:  # a prefill (or one of its chunks) may be replayed; a decode step never is
        cache.remember()
    q, k, v = convolved_heads(x, w, cfg, cache, emit)  # [B, Hk, T, K], [B, Hk, T, K], [B, Hk, T, Kv]
    q = emit("self_attn.q_unit", l2_normalise(q)) * np.float32(cfg.linear_head_dim**-0.5)  # [B, Hk, T, K]
    k = emit("self_attn.k_unit", l2_normalise(k))  # [B, Hk, T, K]
    g = emit("self_attn.forget_gate", forget_gate(x, w, cfg))  # [B, Hk, T, K]
    beta = emit("self_attn.beta", heads_last(sigmoid(linear(x, w.matrix("self_attn.b_proj.weight")))))  # [B, Hk, T]
    out = delta_rule(q, k, v, g, beta, cache, emit, options.delta_rule)  # [B, Hk, T, Kv]
    return gated_output(out, x, w, cfg, emit)


def convolved_heads(x: np.ndarray, w: LayerWeights, cfg, cache: KdaCache, emit: Emitter) -> list[np.ndarray]:
    """q, k, v: projected, each through its causal short conv and SiLU, split per head.
    -> [B, Hk, T, K] each (Kv = K)"""
    q = emit("self_attn.q_proj", linear(x, w.matrix("self_attn.q_proj.weight")))  # [B, T, HK]
    q = emit("self_attn.q_conv", silu(conv("q", q, w, cache)))  # [B, T, HK]
    k = emit("self_attn.k_proj", linear(x, w.matrix("self_attn.k_proj.weight")))  # [B, T, HK]
    k = emit("self_attn.k_conv", silu(conv("k", k, w, cache)))  # [B, T, HK]
    v = emit("self_attn.v_proj", linear(x, w.matrix("self_attn.v_proj.weight")))  # [B, T, HK]
    v = emit("self_attn.v_conv", silu(conv("v", v, w, cache)))  # [B, T, HK]
    B, T, _ = x.shape
    return [a.reshape(B, T, cfg.linear_num_heads, cfg.linear_head_dim).transpose(0, 2, 1, 3) for a in (q, k, v)]


def conv(name: str, projected: np.ndarray, w: LayerWeights, cache: KdaCache) -> np.ndarray:
    """The short conv of q, k or v, continuing from the inputs the cache kept (which it replaces).
    [B, T, HK] -> [B, T, HK]"""
    out, cache.conv[name] = short_conv(projected, w(f"self_attn.{name}_conv1d.weight"), cache.conv.get(name))
    return out


def short_conv(x: np.ndarray, weight: np.ndarray, past: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Causal depthwise convolution: out_t = sum_j weight[:, 0, j] * input_{t - (W-1) + j}, the
    inputs before the first being `past` (zeros at the start).
    x [B, T, HK], weight [HK, 1, W], past: B x (W-1) x HK -> out [B, T, HK] and the last W - 1 inputs"""
    B, T, C = x.shape
    W = weight.shape[-1]
    past = np.zeros((B, W - 1, C), np.float32) if past is None else past
    padded = np.concatenate([past, x], axis=1)  # B x (W-1+T) x HK
    taps = weight[:, 0, :]  # [HK, W]
    out = np.zeros_like(x)
    for j in range(W):
        out += padded[:, j : j + T] * taps[:, j]  # [B, T, HK]
    return out, padded[:, padded.shape[1] - (W - 1) :].copy()  # a copy: a view would keep all of `padded`


def l2_normalise(x: np.ndarray) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps) over the last axis.  [..., K] -> [..., K]"""
    return x / np.sqrt(np.sum(np.square(x), axis=-1, keepdims=True) + np.float32(L2_EPS))


def forget_gate(x: np.ndarray, w: LayerWeights, cfg) -> np.ndarray:
    """g = -exp(A_log) * softplus(f(x) + dt_bias), per head and key channel, <= 0; with a lower
    bound (Ling 3's safe gate), g = lower_bound * sigmoid(exp(A_log) * (f(x) + dt_bias)).
    [B, T, d] -> [B, Hk, T, K]"""
    B, T, _ = x.shape
    H, K = cfg.linear_num_heads, cfg.linear_head_dim
    raw = gate_projection(x, w, cfg, "f") + w("self_attn.dt_bias")  # [B, T, HK]
    raw = raw.reshape(B, T, H, K)  # [B, T, Hk, K]
    rate = np.exp(w("self_attn.A_log").reshape(H))[:, None]  # [Hk, 1], one decay rate per head
    bound = cfg.kda_lower_bound
    g = -rate * softplus(raw) if bound is None else np.float32(bound) * sigmoid(rate * raw)  # [B, T, Hk, K]
    return g.transpose(0, 2, 1, 3)  # [B, Hk, T, K]


def gate_projection(x: np.ndarray, w: LayerWeights, cfg, gate: str) -> np.ndarray:
    """The forget gate's ("f") or output gate's ("g") projection: Kimi's rank-K bottleneck
    {gate}_b({gate}_a(x)), or Ling 3's one {gate}_proj(x).  [B, T, d] -> [B, T, HK]"""
    if cfg.kda_full_gates:
        return linear(x, w.matrix(f"self_attn.{gate}_proj.weight"))
    low = linear(x, w.matrix(f"self_attn.{gate}_a_proj.weight"))  # [B, T, K]: a rank-K bottleneck
    return linear(low, w.matrix(f"self_attn.{gate}_b_proj.weight"))


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), without overflow."""
    return np.logaddexp(np.float32(0), x)


def heads_last(x: np.ndarray) -> np.ndarray:
    """[B, T, Hk] -> [B, Hk, T]"""
    return x.transpose(0, 2, 1)


def delta_rule(q, k, v, g, beta, cache: KdaCache, emit: Emitter, rule: DeltaRule) -> np.ndarray:
    """Step 4 over the T new tokens from the cached state, which it replaces by the state after them:
    token by token ("recurrent"), a chunk at a time ("chunked"), or "auto": token by token for a
    step of at most one chunk, chunked for a longer one (the forms agree within round-off).
    q, k [B, Hk, T, K], v [B, Hk, T, Kv], g [B, Hk, T, K], beta [B, Hk, T] -> o [B, Hk, T, Kv]"""
    B, H, T, K = k.shape
    state = np.zeros((B, H, K, v.shape[-1]), np.float32) if cache.state is None else cache.state  # [B, Hk, K, Kv]
    recurrent = rule == "recurrent" or (rule == "auto" and T <= kda_chunked.CHUNK)
    out, delta, last = (token_by_token if recurrent else in_chunks)(q, k, v, g, beta, state, emit)
    emit.shown("self_attn.delta", delta)  # [B, Hk, T, Kv]
    cache.state = emit("self_attn.state", last)  # [B, Hk, K, Kv]
    cache.length += T
    return emit("self_attn.core_out", out)  # [B, Hk, T, Kv]


@exercise
def gated_delta_rule(q, k, v, g, beta, state, keep_states: bool = False):
    """The gated delta rule token by token.
    q, k [B, Hk, T, K], v [B, Hk, T, Kv], g [B, Hk, T, K], beta [B, Hk, T], state [B, Hk, K, Kv]
    -> o [B, Hk, T, Kv], delta [B, Hk, T, Kv], the last state [B, Hk, K, Kv], every state [B, Hk, T, K, Kv] or None"""
    T = q.shape[2]
    out, delta = np.empty_like(v), np.empty_like(v)
    states = []
    for t in range(T):
        state = np.exp(g[:, :, t])[..., None] * state  # [B, Hk, K, Kv]: row i times exp(g_t[i])
        recalled = (k[:, :, t, None, :] @ state)[:, :, 0]  # [B, Hk, Kv]: S^T k_t
        delta[:, :, t] = beta[:, :, t, None] * (v[:, :, t] - recalled)  # [B, Hk, Kv]
        state = state + k[:, :, t, :, None] * delta[:, :, t, None, :]  # [B, Hk, K, Kv]: + k_t delta_t^T
        out[:, :, t] = (q[:, :, t, None, :] @ state)[:, :, 0]  # [B, Hk, Kv]: S^T q_t
        if keep_states:
            states.append(state)
    return out, delta, state, np.stack(states, axis=2) if keep_states else None


def token_by_token(q, k, v, g, beta, state, emit: Emitter):
    """The recurrence, with the same states shown when a sink looks as in_chunks shows: the rule's
    after every chunk, and after every token made when read from those (the rule's own are let go).
    -> o, delta [B, Hk, T, Kv], the last state [B, Hk, K, Kv]"""
    keep = emit.wants_key("self_attn.state_per_token") or emit.wants_key("self_attn.state_per_chunk")
    out, delta, last, states = gated_delta_rule(q, k, v, g, beta, state, keep)
    per_chunk = states[:, :, chunk_ends(q.shape[2])] if keep else None  # [B, Hk, chunks, K, Kv], a copy
    show_states(emit, lambda: replayed(k, g, delta, state, per_chunk), lambda: per_chunk)
    return out, delta, last


@bypasses(gated_delta_rule, readable=token_by_token)  # a learner's rule runs token by token
def in_chunks(q, k, v, g, beta, state, emit: Emitter):
    """The chunked form (kernels.kda_chunked), with the same states shown when a sink looks: after
    every chunk from the kernel, after every token made when read from the state before its chunk.
    -> o, delta [B, Hk, T, Kv], the last state [B, Hk, K, Kv]"""
    keep = emit.wants_key("self_attn.state_per_chunk") or emit.wants_key("self_attn.state_per_token")
    out, delta, last, per_chunk = kda_chunked.chunked(q, k, v, g, beta, state, keep_states=keep)
    show_states(emit, lambda: replayed(k, g, delta, state, per_chunk), lambda: per_chunk)
    return out, delta, last


def show_states(emit: Emitter, every_token, every_chunk) -> None:
    """The states after every token and after every chunk, each made (by the function given) only
    when a sink looks at it: a long prompt's are too large to make for nothing."""
    if emit.wants_key("self_attn.state_per_token"):
        emit.shown("self_attn.state_per_token", every_token())  # [B, Hk, T, K, Kv]
    if emit.wants_key("self_attn.state_per_chunk"):
        emit.shown("self_attn.state_per_chunk", every_chunk())  # [B, Hk, chunks, K, Kv]


def replayed(k, g, delta, first, after_chunks) -> Tiled:
    """The state after every token, made when read a tile of heads and tokens at a time: each
    token's from the state before its chunk (`first`, then the state after each chunk),
    replaying the writes S_t = diag(exp(g_t)) S_(t-1) + k_t delta_t^T up to it, at most a chunk of
    them, so what it holds is one state per chunk, never one per token.
    k, g [B, Hk, T, K], delta [B, Hk, T, Kv], first [B, Hk, K, Kv], after_chunks [B, Hk, chunks, K, Kv]
    -> [B, Hk, T, K, Kv]"""
    B, H, T, K = k.shape
    V = delta.shape[-1]

    def tile(heads: slice, tokens: slice) -> np.ndarray:  # -> [B, Hk, T, K, Kv] at those heads and tokens
        out = np.empty((B, len(range(H)[heads]), len(range(T)[tokens]), K, V), np.float32)
        for t in range(tokens.start // kda_chunked.CHUNK * kda_chunked.CHUNK, tokens.stop):
            chunk, at = divmod(t, kda_chunked.CHUNK)
            if at == 0:
                S = (first if chunk == 0 else after_chunks[:, :, chunk - 1])[:, heads]  # [B, Hk, K, Kv] at those heads
            S = np.exp(g[:, heads, t])[..., None] * S + k[:, heads, t, :, None] * delta[:, heads, t, None, :]
            if t >= tokens.start:
                out[:, :, t - tokens.start] = S
        return out

    return Tiled((B, H, T, K, V), tile, source=f"the state before each chunk, replaying at most "
                                               f"{kda_chunked.CHUNK} writes a token")


def chunk_ends(T: int) -> list[int]:
    """The last token of each chunk of the chunked form (the last chunk may be shorter)."""
    return [min(start + kda_chunked.CHUNK, T) - 1 for start in range(0, T, kda_chunked.CHUNK)]


def gated_output(out: np.ndarray, x: np.ndarray, w: LayerWeights, cfg, emit: Emitter) -> np.ndarray:
    """RMSNorm(o) per head times sigmoid of the output gate's projection (gate_projection), heads
    merged (self_attn.attn_output), then o_proj.  out [B, Hk, T, Kv], x [B, T, d] -> [B, T, d]"""
    B, H, T, V = out.shape
    normed = emit("self_attn.o_norm", rms_norm(out, w("self_attn.o_norm.weight"), cfg.rms_norm_eps))  # [B, Hk, T, Kv]
    gate = gate_projection(x, w, cfg, "g")  # [B, T, HK]
    gate = emit("self_attn.output_gate", gate.reshape(B, T, H, V).transpose(0, 2, 1, 3))  # [B, Hk, T, Kv]
    gated = emit("self_attn.gated_output", normed * sigmoid(gate))  # [B, Hk, T, Kv]
    return output_projection(gated, w, emit)  # heads merged (attn_output), then o_proj: [B, T, d]
