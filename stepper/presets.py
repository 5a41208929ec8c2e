"""Named models, written as the config.json an HF checkpoint of each would carry.

`kimi-k2` and `deepseek-v3` are the published full-size configurations. `tiny` is shaped like
Kimi K2 (one expert group, YaRN with factor 32 and theta 50000, a dense first layer, a shared
expert) but small enough to run in well under a second; several of its sizes are deliberately not
multiples of 128, so FP8 blocks are partial. `tiny-v3` is its DeepSeek-V3-shaped sibling: grouped
routing (4 groups, keep 2) and DeepSeek-V3's rope settings. `tiny-int4` is `tiny` stored as
Kimi-K2-Thinking is: routed experts in INT4 (compressed-tensors pack-quantized, groups of 32), the
rest BF16, and rms_norm_eps 1e-5.

Kimi Linear (`kimi_linear`, read by stepper.families.kimi_linear): `kimi-linear-48b-a3b` as
published (27 layers, KDA but for layers 4, 8, ..., 24 and 27, which are MLA without RoPE) and
`tiny-kimi-linear`, three KDA layers and one MLA layer of 4 heads.

The other MLA families: `deepseek-v2-lite` and `deepseek-v2` (softmax router, greedy or
group-limited greedy choice, no bias, BF16 weights, YaRN mscale 0.707) with `tiny-v2` shaped like
V2-Lite (one q_proj, two shared experts); `deepseek-v3.2` and `tiny-v32`, DeepSeek-V3 plus the
Lightning Indexer (`tiny-v32`: 8 index heads of 32 dims keep 4 positions per query, fewer than a default prompt).
"""

from __future__ import annotations

from typing import Any

from stepper import families
from stepper.config import Config
from stepper.errors import StepperError

_FP8 = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "weight_block_size": [128, 128],
}

_KIMI_K2_THINKING_INT4 = {  # Kimi-K2-Thinking's quantization_config
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32,
                    "dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax",
                    "observer_kwargs": {}},
        "input_activations": None,
        "output_activations": None,
    }},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None,
}

_KIMI_YARN = {
    "type": "yarn",
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 1.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}

_DEEPSEEK_YARN = {
    "type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}

_SHARED = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_act": "silu",
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "moe_layer_freq": 1,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        **_SHARED,
        "_name_or_path": "tiny",
        "model_type": "kimi_k2",
        "vocab_size": 1000,
        "hidden_size": 320,
        "intermediate_size": 544,
        "moe_intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 192,
        "kv_lora_rank": 128,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "n_routed_experts": 32,
        "n_shared_experts": 1,
        "num_experts_per_tok": 4,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 2.827,
        "first_k_dense_replace": 1,
        "rope_theta": 50000.0,
        "max_position_embeddings": 131072,
        "rope_scaling": _KIMI_YARN,
        "quantization_config": _FP8,
    },
    "tiny-v3": {
        **_SHARED,
        "_name_or_path": "tiny-v3",
        "model_type": "deepseek_v3",
        "vocab_size": 1000,
        "hidden_size": 320,
        "intermediate_size": 544,
        "moe_intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 192,
        "kv_lora_rank": 128,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "n_routed_experts": 32,
        "n_shared_experts": 1,
        "num_experts_per_tok": 4,
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "rope_theta": 10000.0,
        "max_position_embeddings": 163840,
        "rope_scaling": _DEEPSEEK_YARN,
        "quantization_config": _FP8,
    },
    "kimi-k2": {
        **_SHARED,
        "_name_or_path": "kimi-k2",
        "model_type": "kimi_k2",
        "vocab_size": 163840,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 384,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 2.827,
        "first_k_dense_replace": 1,
        "rope_theta": 50000.0,
        "max_position_embeddings": 131072,
        "rope_scaling": _KIMI_YARN,
        "quantization_config": _FP8,
    },
    "deepseek-v3": {
        **_SHARED,
        "_name_or_path": "deepseek-v3",
        "model_type": "deepseek_v3",
        "vocab_size": 129280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "n_group": 8,
        "topk_group": 4,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 3,
        "rope_theta": 10000.0,
        "max_position_embeddings": 163840,
        "rope_scaling": _DEEPSEEK_YARN,
        "quantization_config": _FP8,
    },
}

PRESETS["tiny-int4"] = {**PRESETS["tiny"], "_name_or_path": "tiny-int4", "rms_norm_eps": 1e-5,
                        "quantization_config": _KIMI_K2_THINKING_INT4}


_V2_YARN = {**_DEEPSEEK_YARN, "mscale": 0.707, "mscale_all_dim": 0.707}

_V2 = {  # DeepSeek-V2's router and weights: softmax scores, no bias, BF16 (no quantization_config)
    **{k: v for k, v in _SHARED.items() if k not in ("scoring_func", "topk_method", "norm_topk_prob")},
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "scoring_func": "softmax",
    "norm_topk_prob": False,
    "n_shared_experts": 2,
    "first_k_dense_replace": 1,
    "rope_theta": 10000.0,
    "max_position_embeddings": 163840,
    "rope_scaling": _V2_YARN,
    "vocab_size": 102400,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_experts_per_tok": 6,
}

PRESETS.update({
    "tiny-v2": {
        **_V2,
        "_name_or_path": "tiny-v2",
        "topk_method": "greedy",
        "vocab_size": 1000,
        "hidden_size": 320,
        "intermediate_size": 544,
        "moe_intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": None,
        "kv_lora_rank": 128,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "n_routed_experts": 16,
        "num_experts_per_tok": 4,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
    },
    "deepseek-v2-lite": {
        **_V2,
        "_name_or_path": "deepseek-v2-lite",
        "topk_method": "greedy",
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "moe_intermediate_size": 1408,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "q_lora_rank": None,
        "n_routed_experts": 64,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
    },
    "deepseek-v2": {
        **_V2,
        "_name_or_path": "deepseek-v2",
        "topk_method": "group_limited_greedy",
        "hidden_size": 5120,
        "intermediate_size": 12288,
        "moe_intermediate_size": 1536,
        "num_hidden_layers": 60,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "q_lora_rank": 1536,
        "n_routed_experts": 160,
        "n_group": 8,
        "topk_group": 3,
        "routed_scaling_factor": 16.0,
    },
    "tiny-v32": {
        **PRESETS["tiny-v3"],
        "_name_or_path": "tiny-v32",
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "index_n_heads": 8,
        "index_head_dim": 32,
        "index_topk": 4,
    },
    "deepseek-v3.2": {
        **PRESETS["deepseek-v3"],
        "_name_or_path": "deepseek-v3.2",
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": 2048,
    },
})

KIMI_LINEAR_48B = {  # moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json (the fields stepper reads)
    "_name_or_path": "kimi-linear-48b-a3b",
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "vocab_size": 163840,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "moe_intermediate_size": 1024,
    "num_hidden_layers": 27,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 72,  # published, unused (transformers sets head_dim to qk_rope_head_dim)
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "mla_use_nope": True,
    "num_experts": 256,
    "num_experts_per_token": 8,
    "num_shared_experts": 1,
    "num_expert_group": 1,
    "topk_group": 1,
    "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid",
    "routed_scaling_factor": 2.446,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "model_max_length": 1048576,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "linear_attn_config": {
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        "num_heads": 32,
        "head_dim": 128,
        "short_conv_kernel_size": 4,
    },
}

PRESETS.update({
    # Kimi Linear's 3:1 pattern in four layers: KDA, KDA, KDA, MLA without RoPE; a dense first layer, then MoE
    "tiny-kimi-linear": {
        **KIMI_LINEAR_48B,
        "_name_or_path": "tiny-kimi-linear",
        "vocab_size": 1000,
        "hidden_size": 160,
        "intermediate_size": 272,
        "moe_intermediate_size": 48,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "num_experts": 16,
        "num_experts_per_token": 4,
        "model_max_length": 131072,
        "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3], "num_heads": 4, "head_dim": 32,
                               "short_conv_kernel_size": 4},
    },
    "kimi-linear-48b-a3b": KIMI_LINEAR_48B,
})


def preset(name: str) -> Config:
    """The named preset's config, read by its family (stepper.families); an unknown name is a
    StepperError listing the known ones."""
    if name not in PRESETS:
        raise StepperError(f"unknown model '{name}': expected one of {', '.join(PRESETS)} or a checkpoint directory")
    return families.read_config(PRESETS[name], f"preset {name}")
