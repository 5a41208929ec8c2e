"""An independent PyTorch reference for Kimi Linear: transformers' `KimiLinearForCausalLM`, loaded
by transformers itself from a checkpoint folder in the published layout (its own conversion
renames `block_sparse_moe`, stacks the three short convs and the experts), run in float32 with
eager attention, and traced by stepper's names in stepper's layouts. It shares no code with stepper.

The tensors come from forward hooks on transformers' modules, from wrappers around the module-level
functions `causal_conv1d_fn`, `causal_conv1d_update`, `chunk_kimi_delta_attention`,
`recurrent_kimi_delta_attention` and `eager_attention_forward` (restored in a `finally`), and, for
values transformers keeps only in local variables, a few torch derivations from captured tensors:

* q_l2 / k_l2: transformers' own `l2norm` on the captured query and key;
* the state after each token: transformers' `recurrent_kimi_delta_attention` run one token at a
  time from the captured initial state; after each chunk: the states at the chunk ends;
* delta_t = k_t^T (S_t - diag(exp g_t) S_{t-1}) / (k_t . k_t) (the write is rank one: k_t delta_t^T);
* o_norm: the o_norm module called with a gate of 100 (sigmoid(100) is 1.0 in float32);
* the router's scores, scores_for_choice, group_scores and group_mask as its forward makes them;
* the attention scores: the eager product with -inf where the additive mask blocks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers.models.kimi_linear.modeling_kimi_linear as hf
from transformers import KimiLinearForCausalLM
from transformers.cache_utils import DynamicCache

torch.set_num_threads(1)

CHUNK = 64


def load(folder: Path) -> KimiLinearForCausalLM:
    return KimiLinearForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


def heads_first(t: torch.Tensor) -> np.ndarray:
    """[B, T, H, X] -> [B, H, T, X]"""
    return t.transpose(1, 2).detach().numpy().copy()


def trace(model: KimiLinearForCausalLM, ids: np.ndarray, decode_ids: np.ndarray) -> dict[str, np.ndarray]:
    """Prefill `ids` [B, T], then one decode step per column of `decode_ids` [B, n]: every tensor
    by its stepper name (`prefill.layers.0.self_attn.q_conv`, `decode0.logits`)."""
    out: dict[str, np.ndarray] = {}
    state = {"phase": "prefill", "layer": None}
    cfg = model.config
    layers = model.model.layers

    def put(key: str, array) -> None:
        scope = state["phase"] + ("" if state["layer"] is None else f".layers.{state['layer']}")
        out[f"{scope}.{key}"] = array.detach().numpy().copy() if isinstance(array, torch.Tensor) else array

    hooks = []

    def hook(module, fn):
        hooks.append(module.register_forward_hook(fn))

    def layer_hooks(i: int, layer) -> None:
        def enter(module, args, kwargs):
            state["layer"] = i
            put("hidden_states", args[0] if args else kwargs["hidden_states"])

        hooks.append(layer.register_forward_pre_hook(enter, with_kwargs=True))
        hook(layer.input_layernorm, lambda m, a, o: put("input_layernorm", o))
        hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(lambda m, a: put("attn_residual", a[0])))
        hook(layer.post_attention_layernorm, lambda m, a, o: put("post_attention_layernorm", o))
        hook(layer.mlp, lambda m, a, o: put("mlp_output", o))
        hook(layer, lambda m, a, o: put("output", o))
        attn = layer.self_attn
        if isinstance(attn, hf.KimiLinearDeltaAttention):
            kda_hooks(attn)
        else:
            mla_hooks(attn)
        if isinstance(layer.mlp, hf.KimiLinearMoE):
            moe_hooks(layer.mlp)
        else:
            hook(layer.mlp.gate_proj, lambda m, a, o: put("mlp.gate_proj", o))
            hook(layer.mlp.up_proj, lambda m, a, o: put("mlp.up_proj", o))
            hooks.append(layer.mlp.down_proj.register_forward_pre_hook(lambda m, a: put("mlp.act", a[0])))

    def kda_hooks(attn) -> None:
        for name in ("q", "k", "v"):
            hook(getattr(attn, f"{name}_proj"), lambda m, a, o, name=name: put(f"self_attn.{name}_proj", o))
        hook(attn.forget_gate, lambda m, a, o: put("self_attn.forget_gate", heads_first(o)))
        B_H_T_V = []

        def gate_out(m, a, o):
            B, T = o.shape[:2]
            B_H_T_V.append(o.view(B, T, -1, attn.head_dim))
            put("self_attn.output_gate", heads_first(B_H_T_V[-1]))

        hook(attn.g_b_proj, gate_out)

        def norm_out(m, a, o):
            hidden, gate = a
            put("self_attn.gated_output", heads_first(o))
            put("self_attn.o_norm", heads_first(m.forward(hidden, torch.full_like(gate, 100.0))))  # no hooks

        hook(attn.o_norm, norm_out)
        hook(attn.o_proj, lambda m, a, o: put("self_attn.o_proj", o))

    def mla_hooks(attn) -> None:
        H, qk = cfg.num_attention_heads, attn.qk_head_dim

        def q_out(m, a, o):
            B, T = o.shape[:2]
            q = o.view(B, T, H, qk).transpose(1, 2)
            put("self_attn.q", q)
            put("self_attn.q_nope", q[..., : attn.qk_nope_head_dim])
            put("self_attn.q_pe", q[..., attn.qk_nope_head_dim :])

        def kv_a_out(m, a, o):
            B, T = o.shape[:2]
            put("self_attn.kv_a", o)
            put("self_attn.compressed_kv", o[..., : attn.kv_lora_rank])
            put("self_attn.k_pe", o[..., attn.kv_lora_rank :].reshape(B, 1, T, -1))
            state["new"] = T

        def kv_b_out(m, a, o):  # over every cached position: the new ones are the last T
            B, _, S, _ = o.shape
            kv = o.view(B, S, H, -1).transpose(1, 2)[:, :, S - state["new"] :]
            put("self_attn.kv", kv)
            put("self_attn.k_nope", kv[..., : attn.qk_nope_head_dim])

        hook(attn.q_proj, q_out)
        hook(attn.kv_a_proj_with_mqa, kv_a_out)
        hook(attn.kv_a_layernorm, lambda m, a, o: put("self_attn.compressed_kv_norm", o))
        hook(attn.kv_b_proj, kv_b_out)
        hooks.append(attn.o_proj.register_forward_pre_hook(lambda m, a: put("self_attn.attn_output", a[0])))
        hook(attn.o_proj, lambda m, a, o: put("self_attn.o_proj", o))

    def moe_hooks(mlp) -> None:
        def gate_out(m, a, o):
            logits, weights, idx = o
            put("mlp.gate.logits", logits)
            scores = logits.sigmoid()
            put("mlp.gate.scores", scores)
            choice = scores + m.e_score_correction_bias
            put("mlp.gate.scores_for_choice", choice)
            grouped = choice.view(-1, m.num_group, m.num_experts // m.num_group)
            put("mlp.gate.group_scores", grouped.topk(2, dim=-1)[0].sum(dim=-1))
            mask = torch.zeros(choice.shape[0], m.num_group)
            mask.scatter_(1, torch.topk(grouped.topk(2, dim=-1)[0].sum(-1), k=m.topk_group, dim=-1)[1], 1)
            put("mlp.gate.group_mask", mask)
            put("mlp.gate.topk_idx", idx)
            put("mlp.gate.topk_weight", weights)

        hook(mlp.gate, gate_out)
        hook(mlp.experts, lambda m, a, o: put("mlp.routed_output", o.view(*state["shape"])))
        hooks.append(mlp.register_forward_pre_hook(lambda m, a: state.update(shape=a[0].shape)))
        hook(mlp.shared_experts, lambda m, a, o: put("mlp.shared_output", o))

    originals = {n: getattr(hf, n) for n in ("causal_conv1d_fn", "causal_conv1d_update", "chunk_kimi_delta_attention",
                                             "recurrent_kimi_delta_attention", "eager_attention_forward")}

    def conv(fn):
        def traced(*args, **kwargs):
            mixed = fn(*args, **kwargs)  # [B, 3*H*K, T] after SiLU
            q, k, v = mixed.transpose(1, 2).chunk(3, dim=-1)
            put("self_attn.q_conv", q)
            put("self_attn.k_conv", k)
            put("self_attn.v_conv", v)
            return mixed
        return traced

    def delta_rule(fn):
        def traced(query, key, value, g, beta, initial_state=None, **kwargs):
            core, final = fn(query, key, value, g=g, beta=beta, initial_state=initial_state, **kwargs)
            delta_rule_tensors(query, key, value, g, beta, initial_state, core, final)
            return core, final
        return traced

    def delta_rule_tensors(query, key, value, g, beta, initial_state, core, final) -> None:
        q, k = hf.l2norm(query.float(), eps=1e-6), hf.l2norm(key.float(), eps=1e-6)
        put("self_attn.q_l2", heads_first(q))
        put("self_attn.k_l2", heads_first(k))
        put("self_attn.beta", beta.transpose(1, 2))
        put("self_attn.core_out", heads_first(core))
        put("self_attn.state", final)
        B, T, H, K = key.shape
        S = torch.zeros(B, H, K, value.shape[-1]) if initial_state is None else initial_state.clone()
        states, deltas = [], []
        for t in range(T):  # transformers' recurrent form, one token at a time
            previous = S
            _, S = originals["recurrent_kimi_delta_attention"](
                query[:, t : t + 1], key[:, t : t + 1], value[:, t : t + 1], g=g[:, t : t + 1], beta=beta[:, t : t + 1],
                initial_state=S, output_final_state=True, use_qk_l2norm_in_kernel=True)
            written = S - previous * g[:, t].exp()[..., None]  # [B, H, K, V]: k_t delta_t^T
            k_t = k[:, t]  # [B, H, K]
            deltas.append((k_t[..., None] * written).sum(-2) / (k_t * k_t).sum(-1, keepdim=True))
            states.append(S)
        per_token = torch.stack(states, dim=2)  # [B, H, T, K, V]
        put("self_attn.delta", torch.stack(deltas, dim=2))
        put("self_attn.state_per_token", per_token)
        ends = list(range(CHUNK - 1, T, CHUNK)) + ([T - 1] if T % CHUNK else [])
        put("self_attn.state_per_chunk", per_token[:, :, ends])

    def eager(fn):
        def traced(module, query, key, value, attention_mask, scaling, **kwargs):
            output, weights = fn(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
            put("self_attn.query_states", query)
            put("self_attn.key_states", key)
            put("self_attn.value_states", value)
            scores = torch.matmul(query, key.transpose(2, 3)) * scaling
            if attention_mask is not None:
                scores = scores.masked_fill((attention_mask != 0).expand_as(scores), float("-inf"))
            put("self_attn.attn_scores", scores)
            put("self_attn.attn_weights", weights)
            return output, weights
        return traced

    hf.causal_conv1d_fn = conv(originals["causal_conv1d_fn"])
    hf.causal_conv1d_update = conv(originals["causal_conv1d_update"])
    hf.chunk_kimi_delta_attention = delta_rule(originals["chunk_kimi_delta_attention"])
    hf.recurrent_kimi_delta_attention = delta_rule(originals["recurrent_kimi_delta_attention"])
    hf.eager_attention_forward = eager(originals["eager_attention_forward"])
    try:
        for i, layer in enumerate(layers):
            layer_hooks(i, layer)

        def outer(module, name):
            def fn(m, a, o):
                layer, state["layer"] = state["layer"], None
                put(name, o)
                state["layer"] = layer
            hook(module, fn)

        outer(model.model.embed_tokens, "embed")
        outer(model.model.norm, "norm")
        cache = DynamicCache(config=cfg)
        steps = [("prefill", ids)] + [(f"decode{j}", decode_ids[:, j : j + 1]) for j in range(decode_ids.shape[1])]
        with torch.no_grad():
            for phase, step_ids in steps:
                state.update(phase=phase, layer=None)
                logits = model(torch.tensor(step_ids), cache=cache, use_cache=True).logits
                state["layer"] = None
                put("logits", logits)
    finally:
        for name, fn in originals.items():
            setattr(hf, name, fn)
        for h in hooks:
            h.remove()
    return out
