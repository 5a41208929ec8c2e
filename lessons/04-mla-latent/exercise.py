"""Lesson 4 (mla-latent): the joint KV down-projection, split into the latent and the shared rotary key.

Finish `latent` below, then:

    stepper lesson check mla-latent    compares every tensor of the runs with stepper's
    stepper run --use stepper-lessons/mla-latent.py --only '*k_pe*'
                                       runs the whole model with your latent

Keep the name, the signature and the emit(...) calls: the interpreter calls latent(x, w, cfg, emit),
and the check compares the tensors you emit with the golden ones, in order.
"""


from stepper.kernels.linear import linear


def latent(x, w, cfg, emit):
    """x [B, T, D] (after input_layernorm) -> (compressed_kv_norm [B, T, C], k_pe [B, 1, T, R]).

    w(name) is a float32 weight of this layer (w.matrix(name) the same weight, maybe still FP8, to multiply with);
    cfg the config (cfg.kv_lora_rank = C, cfg.qk_rope_head_dim = R); the latent's norm uses eps
    stepper.model.attention.LATENT_NORM_EPS (1e-6, as the references do, whatever cfg.rms_norm_eps says);
    emit(name, array) reports a named tensor.
    """
    B, T, _ = x.shape
    kv_a = linear(x, w.matrix("self_attn.kv_a_proj_with_mqa.weight"))  # [B, T, C + R]
    emit("self_attn.kv_a", kv_a)

    # compressed_kv = ...                                  [B, T, C]: the first C numbers of each token
    # emit("self_attn.compressed_kv", compressed_kv)
    # k_pe = ...                                           [B, 1, T, R]: the last R numbers, one head axis of size 1
    # emit("self_attn.k_pe", k_pe)
    # compressed_kv = ...                                  RMSNorm with self_attn.kv_a_layernorm.weight
    # emit("self_attn.compressed_kv_norm", compressed_kv)
    # return compressed_kv, k_pe
    raise NotImplementedError("split kv_a into the latent and the shared rotary key, then normalise the latent")
