"""Lesson 6 (absorption): Multi-head Latent Attention over the cached latents, W_UK and W_UV absorbed.

Finish `absorbed` below, then:

    stepper lesson check absorption    compares every tensor of the runs (prefill and decode steps) with stepper's
    stepper run --use stepper-lessons/absorption.py --attn absorb
                                       runs the whole model with your absorbed attention

Keep the name, the signature and the emit(...) calls: the interpreter calls
absorbed(q_nope, q_pe, compressed_kv, k_pe, w, cfg, rope, cache, emit, mask).
"""


from stepper.model.attention import split_kv_b


def absorbed(q_nope, q_pe, compressed_kv, k_pe, w, cfg, rope, cache, emit, mask=None):
    """Attention over the cached latents.  -> [B, H, T, V] (the heads' outputs, before merging)

    q_nope [B, H, T, P]            queries without position
    q_pe [B, H, T, R]              queries' rotary part, before RoPE
    compressed_kv [B, T, C]        the new positions' normalised latents
    k_pe [B, 1, T, R]              the new positions' shared rotary key, before RoPE
    w(name)                        a float32 weight of this layer; cfg the config
    rope                           rope.cos, rope.sin and rope.softmax_scale of this step
    cache                          cache.extend_latent(latents, k_pe) appends and returns all S positions
    emit(name, array)              reports a named tensor
    mask                           None here; DeepSeek-V3.2's indexer's [B, T, S] choice: pass it on to attention_weights
    """
    w_uk, w_uv = split_kv_b(w("self_attn.kv_b_proj.weight"), cfg)  # [H, P, C], [H, V, C]

    # q_latent = ...                                       [B, H, T, C]: q_nope through each head's W_UK
    # emit("self_attn.q_nope_absorbed", q_latent)
    # q_pe, k_pe = rotate(q_pe, k_pe, rope, emit)          RoPE on the rotary parts (emits q_pe_rope, k_pe_rope)
    # latents, k_pes = cache.extend_latent(compressed_kv, k_pe)   [B, S, C], [B, 1, S, R]: every attended position
    # scores = ...                                         [B, H, T, S]: q_latent . latents + q_pe . k_pes
    # weights = attention_weights(scores, rope.softmax_scale, emit, mask)   scale, causal mask, softmax (emits both)
    # out_latent = ...                                     [B, H, T, C]: the weights average the latents
    # emit("self_attn.attn_output_latent", out_latent)
    # return ...                                           [B, H, T, V]: out_latent through each head's W_UV
    raise NotImplementedError("fold W_UK into the query, attend over the latents, apply W_UV afterwards")
