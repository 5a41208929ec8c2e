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

KIMI_LINEAR_48B = {  # moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json (the fields stepper reads or writes)
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
    "bos_token_id": 163584,
    "eos_token_id": 163586,
    "pad_token_id": 163839,
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
        # the special tokens where the published model has them, counted from the end of the vocabulary
        "bos_token_id": 744, "eos_token_id": 746, "pad_token_id": 999,
        "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3], "num_heads": 4, "head_dim": 32,
                               "short_conv_kernel_size": 4},
    },
    "kimi-linear-48b-a3b": KIMI_LINEAR_48B,
})


# The other MLA families (stepper/families), each in its published config.json: `tiny-<family>` and the
# full size. Sarvam-105B's gives no n_group (families/sarvam_mla.py); Youtu's lm_head is its embedding,
# its pad row zeroed; GLM-4.7-Flash's values are wider than its keys' nope part; A.X-K1 routes without a
# bias and normalises its MoE's output; Mistral 4 routes by softmax and scales its queries past 4096.
# The special tokens' ids of a full-size preset are its published config's (here and below: the defaults of
# the family's transformers configuration, which it documents as the published checkpoint's, where the
# preset does not copy the config.json itself; GLM-4.7-Flash's documents GLM-4.5, so it gives none); a tiny
# preset's sit as many places from the end of its 1,000-token vocabulary as the published ones do, or
# where they are (ids below 1,000), so that transformers finds them inside it.
PRESETS.update({
    "sarvam-105b": {"architectures": ["SarvamMLAForCausalLM"], "model_type": "sarvam_mla", "hidden_act": "silu",
        "attention_bias": False, "tie_word_embeddings": False, "rope_theta": 10000.0, "_name_or_path": "sarvam-105b",
        "vocab_size": 262144, "hidden_size": 4096, "intermediate_size": 16384, "moe_intermediate_size": 2048,
        "num_hidden_layers": 32, "num_attention_heads": 64, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
        "q_lora_rank": None, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
        "num_experts_per_tok": 8, "first_k_dense_replace": 1, "norm_topk_prob": True,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-06, "num_experts": 128, "num_shared_experts": 1,
        "num_key_value_heads": 64, "head_dim": 576, "q_head_dim": 192, "bos_token_id": 0, "eos_token_id": 1,
        "rope_scaling": {"type": "deepseek_yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}},
    "tiny-sarvam": {"architectures": ["SarvamMLAForCausalLM"], "model_type": "sarvam_mla", "hidden_act": "silu",
        "attention_bias": False, "tie_word_embeddings": False, "rope_theta": 10000.0, "_name_or_path": "tiny-sarvam",
        "vocab_size": 1000, "hidden_size": 320, "intermediate_size": 544, "moe_intermediate_size": 96,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": None,
        "kv_lora_rank": 128, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "head_dim": 144,
        "q_head_dim": 48, "num_experts": 16, "num_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 1,
        "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 1,
        "rms_norm_eps": 1e-06, "max_position_embeddings": 16384, "bos_token_id": 0, "eos_token_id": 1,
        "rope_scaling": {"type": "deepseek_yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}},
    "youtu-llm-2b": {"architectures": ["YoutuForCausalLM"], "model_type": "youtu", "hidden_act": "silu",
        "attention_bias": False, "rope_interleave": True, "_name_or_path": "youtu-llm-2b", "vocab_size": 128256,
        "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 32, "num_attention_heads": 16,
        "num_key_value_heads": 16, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "qk_nope_head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True, "qk_head_dim": 192, "bos_token_id": 128000, "eos_token_id": 128001,
        "rope_parameters": {"rope_theta": 1600000, "rope_type": "default"}},
    "tiny-youtu": {"architectures": ["YoutuForCausalLM"], "model_type": "youtu", "hidden_act": "silu",
        "attention_bias": False, "rope_interleave": True, "_name_or_path": "tiny-youtu", "vocab_size": 1000,
        "hidden_size": 320, "intermediate_size": 544, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 4, "q_lora_rank": 192, "kv_lora_rank": 128, "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16, "v_head_dim": 32, "max_position_embeddings": 131072, "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True, "bos_token_id": 744, "eos_token_id": 745, "pad_token_id": 999,
        "rope_parameters": {"rope_theta": 1600000.0, "rope_type": "default"}},
    "glm-4.7-flash": {"architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite",
        "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
        "partial_rotary_factor": 1.0, "topk_method": "noaux_tc", "rope_scaling": None, "dtype": "bfloat16",
        "_name_or_path": "glm-4.7-flash", "vocab_size": 154880, "hidden_size": 2048, "intermediate_size": 10240,
        "moe_intermediate_size": 1536, "num_hidden_layers": 47, "num_attention_heads": 20, "num_key_value_heads": 20,
        "n_shared_experts": 1, "n_routed_experts": 64, "routed_scaling_factor": 1.8, "kv_lora_rank": 512,
        "q_lora_rank": 768, "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192, "n_group": 1,
        "topk_group": 1, "num_experts_per_tok": 4, "norm_topk_prob": True, "max_position_embeddings": 202752,
        "rms_norm_eps": 1e-05, "first_k_dense_replace": 1, "num_nextn_predict_layers": 1, "rope_theta": 1000000.0},
    "tiny-glm4-flash": {"architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite",
        "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
        "partial_rotary_factor": 1.0, "topk_method": "noaux_tc", "rope_scaling": None, "dtype": "bfloat16",
        "_name_or_path": "tiny-glm4-flash", "vocab_size": 1000, "hidden_size": 320, "intermediate_size": 544,
        "moe_intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
        "q_lora_rank": 192, "kv_lora_rank": 128, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 48,
        "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 1, "topk_group": 1,
        "routed_scaling_factor": 1.8, "norm_topk_prob": True, "first_k_dense_replace": 1, "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0, "max_position_embeddings": 202752},
    "a.x-k1": {"architectures": ["AXK1ForCausalLM"], "model_type": "axk1", "hidden_act": "silu",
        "attention_bias": False, "tie_word_embeddings": False, "rope_theta": 10000.0, "_name_or_path": "a.x-k1",
        "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64, "n_shared_experts": 1,
        "n_routed_experts": 192, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
        "num_experts_per_tok": 8, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "norm_topk_prob": True,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "bos_token_id": 163691, "eos_token_id": 163691},
    "tiny-axk1": {"architectures": ["AXK1ForCausalLM"], "model_type": "axk1", "hidden_act": "silu",
        "attention_bias": False, "tie_word_embeddings": False, "rope_theta": 10000.0, "_name_or_path": "tiny-axk1",
        "vocab_size": 1000, "hidden_size": 320, "intermediate_size": 544, "moe_intermediate_size": 96,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 192,
        "kv_lora_rank": 128, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 32,
        "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
        "norm_topk_prob": True, "first_k_dense_replace": 1, "moe_layer_freq": 1, "rms_norm_eps": 1e-06,
        "max_position_embeddings": 32768, "bos_token_id": 851, "eos_token_id": 851},
    "mistral-small-4": {"architectures": ["Mistral4ForCausalLM"], "model_type": "mistral4", "hidden_act": "silu",
        "attention_bias": False, "tie_word_embeddings": False, "rope_interleave": True,
        "_name_or_path": "mistral-small-4", "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 12288,
        "moe_intermediate_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 32,
        "n_shared_experts": 1, "n_routed_experts": 128, "routed_scaling_factor": 1.0, "kv_lora_rank": 256,
        "q_lora_rank": 1024, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 64, "n_group": 1,
        "topk_group": 1, "num_experts_per_tok": 4, "first_k_dense_replace": 0, "norm_topk_prob": True,
        "max_position_embeddings": 1048576, "rms_norm_eps": 1e-06, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 11,
        "rope_parameters": {"type": "yarn", "rope_theta": 10000.0, "factor": 128.0,
            "original_max_position_embeddings": 8192, "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0,
            "mscale": 1.0, "llama_4_scaling_beta": 0.1}},
    "tiny-mistral4": {"architectures": ["Mistral4ForCausalLM"], "model_type": "mistral4", "hidden_act": "silu",
        "attention_bias": False, "tie_word_embeddings": False, "rope_interleave": True,
        "_name_or_path": "tiny-mistral4", "vocab_size": 1000, "hidden_size": 320, "intermediate_size": 544,
        "moe_intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
        "q_lora_rank": 192, "kv_lora_rank": 128, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
        "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
        "routed_scaling_factor": 1.0, "norm_topk_prob": True, "first_k_dense_replace": 1, "rms_norm_eps": 1e-06,
        "max_position_embeddings": 32768, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 11,
        "rope_parameters": {"type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
            "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0,
            "mscale": 1.0, "llama_4_scaling_beta": 0.1}},
})
# MiniCPM3 (stepper/families/minicpm3.py): openbmb/MiniCPM3-4B's config.json, and a tiny sibling
_MINICPM3_FACTORS = [1.0591234137867171, 1.1241891283591912, 1.2596935748670968, 1.5380380402321725,
                     2.093982484148734, 3.1446935121267696, 4.937952647693647, 7.524541999994549, 10.475458000005451,
                     13.062047352306353, 14.85530648787323, 15.906017515851266, 16.461961959767827,
                     16.740306425132907, 16.87581087164081, 16.940876586213285]
PRESETS["minicpm3-4b"] = {
    "_name_or_path": "minicpm3-4b", "architectures": ["MiniCPM3ForCausalLM"], "model_type": "minicpm3",
    "bos_token_id": 1, "eos_token_id": [2, 73440], "hidden_act": "silu", "initializer_range": 0.1,
    "hidden_size": 2560, "num_hidden_layers": 62, "intermediate_size": 6400, "max_position_embeddings": 32768,
    "num_attention_heads": 40, "num_key_value_heads": 40, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
    "q_lora_rank": 768, "kv_lora_rank": 256, "rms_norm_eps": 1e-05,
    "rope_scaling": {"type": "longrope", "long_factor": _MINICPM3_FACTORS, "short_factor": _MINICPM3_FACTORS,
                     "original_max_position_embeddings": 32768},
    "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 73448, "scale_emb": 12, "dim_model_base": 256,
    "scale_depth": 1.4,
}
PRESETS["tiny-minicpm3"] = {  # long factors unlike the short ones, and an original length a decode can pass
    **PRESETS["minicpm3-4b"], "_name_or_path": "tiny-minicpm3", "vocab_size": 1000, "hidden_size": 128,
    "intermediate_size": 192, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "q_lora_rank": 64, "kv_lora_rank": 48, "dim_model_base": 32,
    "max_position_embeddings": 8192, "eos_token_id": [2, 992],
    "rope_scaling": {"type": "longrope", "short_factor": _MINICPM3_FACTORS[::2], "long_factor": _MINICPM3_FACTORS[1::2],
                     "original_max_position_embeddings": 4096},
}


# GLM-5 (stepper/families/glm_moe_dsa.py): zai-org/GLM-5's config.json (BF16), field for field, as
# copies of it in public code give it (huggingface.co/zai-org/GLM-5/blob/main/config.json, which
# jd-opensource/xllm's models/llm/glm5.h cites for its defaults; two verbatim copies in training and
# quantisation scripts agree on every field, rope_parameters.rope_theta 1000000 included). Its
# head_dim (64) is not read: transformers computes the heads from the MLA fields.
# GLM-5-FP8's quantization_config was not found (docs/mla-families.md).
PRESETS["glm-5"] = {
    "_name_or_path": "glm-5", "architectures": ["GlmMoeDsaForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "dtype": "bfloat16", "eos_token_id": [154820, 154827, 154829], "ep_size": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "head_dim": 64, "hidden_size": 6144, "index_head_dim": 128,
    "index_n_heads": 32, "index_topk": 2048, "indexer_rope_interleave": True, "initializer_range": 0.02,
    "intermediate_size": 12288, "kv_lora_rank": 512, "max_position_embeddings": 202752, "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "model_type": "glm_moe_dsa", "n_group": 1, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 78,
    "num_key_value_heads": 64, "num_nextn_predict_layers": 1, "pad_token_id": 154820, "pretraining_tp": 1,
    "q_lora_rank": 2048, "qk_head_dim": 256, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05,
    "rope_interleave": True, "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
    "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False, "topk_group": 1,
    "topk_method": "noaux_tc", "transformers_version": "5.0.2.dev0", "use_cache": True, "v_head_dim": 256,
    "vocab_size": 154880,
}
# tiny-glm5 is GLM-5's config.json with smaller sizes: BF16, plain RoPE of theta 1e6 on interleaved
# pairs in the attention and the indexer, one expert group, rms_norm_eps 1e-5 (none of tiny-v32's
# YaRN or FP8). Two choices are not GLM-5's, for coverage: one dense layer of three (GLM-5: 3 of
# 78) so that two layers route; and `indexer_types` full, full, shared (GLM-5 derives all full), so
# that layer 2 reuses layer 1's choice of 4 positions of a 7-token prompt.
PRESETS["tiny-glm5"] = {  # smaller than tiny-v32: its fixture ships its weights
    **PRESETS["glm-5"], "eos_token_id": [940, 947, 949], "pad_token_id": 940,
    "_name_or_path": "tiny-glm5", "vocab_size": 1000, "hidden_size": 128, "intermediate_size": 256,
    "moe_intermediate_size": 64, "num_hidden_layers": 3, "first_k_dense_replace": 1, "num_attention_heads": 4,
    "num_key_value_heads": 4, "q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
    "qk_head_dim": 48, "head_dim": 16, "v_head_dim": 48, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "index_n_heads": 4, "index_head_dim": 32, "index_topk": 4, "indexer_types": ["full", "full", "shared"],
}


# A.X-K2 (stepper/families/axk2.py): the sizes of transformers' AXK2Config, whose defaults are
# skt/A.X-K2's (A.X-K2-Light: no expert groups), BF16; and a tiny sibling with expert groups (so
# the 0.0 fill of dropped groups is at work) and an indexer keeping 4 positions
PRESETS["a.x-k2"] = {
    **{k: v for k, v in PRESETS["deepseek-v3.2"].items()
       if k not in ("rope_scaling", "quantization_config", "n_group", "topk_group")},
    "_name_or_path": "a.x-k2", "architectures": ["AXK2ForCausalLM"], "model_type": "axk2",
    "vocab_size": 163840, "hidden_size": 2048, "intermediate_size": 5120, "moe_intermediate_size": 512,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 32, "n_shared_experts": 1,
    "n_routed_experts": 128, "routed_scaling_factor": 2.5, "kv_lora_rank": 128, "q_lora_rank": 384,
    "qk_rope_head_dim": 32, "v_head_dim": 64, "qk_nope_head_dim": 64, "num_experts_per_tok": 8,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "first_k_dense_replace": 1, "index_topk": 2048,
    "index_head_dim": 128, "index_n_heads": 16, "gated_norm_rank": 16, "rope_theta": 10000.0,
    "bos_token_id": 163691, "eos_token_id": 163691,
}
PRESETS["tiny-axk2"] = {
    **{k: v for k, v in PRESETS["tiny-v32"].items() if k != "quantization_config"}, "_name_or_path": "tiny-axk2",
    "architectures": ["AXK2ForCausalLM"], "model_type": "axk2", "v_head_dim": 48, "gated_norm_rank": 8,
    "bos_token_id": 851, "eos_token_id": 851,
}


# LongCat-Flash (stepper/families/longcat_flash.py): the sizes of transformers' LongcatFlashConfig,
# whose defaults are meituan-longcat/LongCat-Flash-Chat's, BF16; and a tiny sibling (8 experts and
# 4 zero experts, 3 chosen, so zero experts are chosen on a short prompt)
PRESETS["longcat-flash"] = {
    "_name_or_path": "longcat-flash", "architectures": ["LongcatFlashForCausalLM"], "model_type": "longcat_flash",
    "vocab_size": 131072, "hidden_size": 6144, "num_layers": 28, "num_attention_heads": 64, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "ffn_hidden_size": 12288, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "moe_topk": 12,
    "n_routed_experts": 512, "zero_expert_num": 256, "expert_ffn_hidden_size": 2048, "routed_scaling_factor": 6.0,
    "rope_theta": 10000000.0, "zero_expert_type": "identity", "mla_scale_q_lora": True, "mla_scale_kv_lora": True,
    "router_bias": False, "attention_method": "MLA", "tie_word_embeddings": False, "head_dim": 64,
    "bos_token_id": 1, "eos_token_id": 2,
}
PRESETS["tiny-longcat"] = {
    **PRESETS["longcat-flash"], "_name_or_path": "tiny-longcat", "vocab_size": 1000, "hidden_size": 256,
    "num_layers": 2, "num_attention_heads": 4, "ffn_hidden_size": 352, "q_lora_rank": 96, "kv_lora_rank": 64,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "moe_topk": 3, "n_routed_experts": 8,
    "zero_expert_num": 4, "expert_ffn_hidden_size": 96, "routed_scaling_factor": 2.0, "rope_theta": 10000.0,
    "head_dim": 16,
}


# Hy4 (stepper/families/hy_v4.py), in transformers' HYV4Config fields: `tiny-hy4`, a dense layer and two
# MoE layers (the last reusing the index choice of the one before, transformers' pattern for three
# layers), four streams, a sink per head, 8 index heads keeping 4 positions of a 7-token prompt, the
# routed experts' clamp at 10 as published, rope_theta 1e7, BF16
PRESETS["tiny-hy4"] = {
    "_name_or_path": "tiny-hy4", "architectures": ["HYV4ForCausalLM"], "model_type": "hy_v4", "vocab_size": 1000,
    "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
    "v_head_dim": 48, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "routed_scaling_factor": 2.827, "index_n_heads": 8, "index_head_dim": 32, "index_topk": 4, "hc_mult": 4,
    "hc_magnitude": 2.0, "hc_eps": 1e-6, "swiglu_limit": 10.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 262144,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7}, "mlp_layer_types": ["dense", "sparse", "sparse"],
    "indexer_types": ["full", "full", "shared"], "layer_types": ["indexed_attention"] * 3, "hidden_act": "silu",
    "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 990, "eos_token_id": 991,
    "pad_token_id": 992,
}


# Ling 3 (stepper/families/bailing_hybrid.py), in transformers' BailingHybridConfig fields: `tiny-ling3`,
# Ling's pattern in four layers (KDA, MLA, KDA, MLA: layer_group_size 2 where Ling-3.0-Flash has 6), a
# dense first layer then MoE layers of 16 experts in 4 groups, the safe forget gate at -5 and rope_theta
# 6e6 as transformers' defaults have them
PRESETS["tiny-ling3"] = {
    "_name_or_path": "tiny-ling3", "architectures": ["BailingHybridForCausalLM"], "model_type": "bailing_hybrid",
    "vocab_size": 1000, "hidden_size": 160, "intermediate_size": 272, "moe_intermediate_size": 48,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": None,
    "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "head_dim": 32,
    "num_experts": 16, "num_shared_experts": 1, "num_experts_per_token": 4, "num_expert_group": 4, "topk_group": 2,
    "routed_scaling_factor": 2.5, "moe_renormalize": True, "first_k_dense_replace": 1, "layer_group_size": 2,
    "short_conv_kernel_size": 4, "kda_safe_gate": True, "kda_lower_bound": -5.0, "rms_norm_eps": 1e-6,
    "model_max_length": 262144, "rope_parameters": {"rope_type": "default", "rope_theta": 6000000.0},
    "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False, "eos_token_id": 991,
    "pad_token_id": 992,
}


# Mistral Large 4 (stepper/families/mistral_large4.py), the wrapper's config.json as transformers writes it:
# `tiny-mistral-large4`, a dense layer then three MoE layers of 8 experts in 2 groups, the third layer
# reusing the second's index choice ("shared") and reading the first's latent (kv_source_layers), the fourth
# a NoPE layer (transformers' default, every fourth),
# 8 index heads keeping 4 positions, YaRN as transformers' defaults have it (factor 2048 from 512 positions,
# attention_factor 1), the logits capped at 30
PRESETS["tiny-mistral-large4"] = {
    "_name_or_path": "tiny-mistral-large4", "architectures": ["MistralLarge4ForConditionalGeneration"],
    "model_type": "mistral_large4", "tie_word_embeddings": False, "text_config": {
        "model_type": "mistral_large4_text", "vocab_size": 1000, "hidden_size": 128, "intermediate_size": 256,
        "moe_intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
        "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 48, "n_routed_experts": 8,
        "n_group": 2, "topk_group": 1, "num_experts_per_tok": 2, "n_shared_experts": 1, "routed_scaling_factor": 1.5,
        "first_k_dense_replace": 1, "index_n_heads": 8, "index_head_dim": 32, "index_topk": 4,
        "indexer_types": ["full", "full", "shared", "full"], "kv_source_layers": [0, 1, 0, 3],
        "rms_norm_eps": 1e-5, "max_position_embeddings": 1048576,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2048.0,
                            "original_max_position_embeddings": 512, "beta_fast": 32.0, "beta_slow": 1.0,
                            "attention_factor": 1.0},
        "final_logit_softcapping": 30.0, "hidden_act": "silu", "bos_token_id": 990, "eos_token_id": 991,
        "pad_token_id": 992},
    "vision_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                      "head_dim": 8, "patch_size": 4, "image_size": 16},
}


def preset(name: str) -> Config:
    """The named preset's config, read by its family (stepper.families); an unknown name is a
    StepperError listing the known ones."""
    if name not in PRESETS:
        raise StepperError(f"unknown model '{name}': expected one of {', '.join(PRESETS)} or a checkpoint directory")
    return families.read_config(PRESETS[name], f"preset {name}")



# DeepSeek-V4 (`deepseek_v4`), read by its own config class (stepper.families.deepseek_v4_config):
# the published config.json of V4-Flash and V4-Pro (FP8 e4m3 with E8M0 `.scale` blocks, FP4
# experts), and `tiny-v4`, shaped like them: sliding, CSA (ratio 4) and HCA layers (ratio 16 here,
# 128 published: a prompt of a few dozen positions closes HCA windows), two hash-routed layers,
# four streams. Sizes keep FP4's groups of 32 whole (hidden 64, expert width 32).
_V4_FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "scale_fmt": "ue8m0",
           "weight_block_size": [128, 128]}
_V4_SHARED = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "attention_bias": False,
    "bos_token_id": 0, "eos_token_id": 1, "expert_dtype": "fp4", "hc_eps": 1e-06, "hc_mult": 4,
    "hc_sinkhorn_iters": 20, "head_dim": 512, "hidden_act": "silu", "index_head_dim": 128, "index_n_heads": 64,
    "max_position_embeddings": 1048576, "n_shared_experts": 1, "norm_topk_prob": True, "num_experts_per_tok": 6,
    "num_hash_layers": 3, "num_key_value_heads": 1, "num_nextn_predict_layers": 1, "o_lora_rank": 1024,
    "qk_rope_head_dim": 64, "quantization_config": _V4_FP8, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 65536,
                     "type": "yarn"},
    "rope_theta": 10000, "scoring_func": "sqrtsoftplus", "sliding_window": 128, "swiglu_limit": 10.0,
    "tie_word_embeddings": False, "topk_method": "noaux_tc", "vocab_size": 129280, "compress_rope_theta": 160000,
}
V4_PRESETS: dict[str, dict[str, Any]] = {
    "deepseek-v4-flash": {
        **_V4_SHARED, "_name_or_path": "deepseek-v4-flash", "hidden_size": 4096, "num_hidden_layers": 43,
        "num_attention_heads": 64, "q_lora_rank": 1024, "o_groups": 8, "index_topk": 512, "n_routed_experts": 256,
        "moe_intermediate_size": 2048, "routed_scaling_factor": 1.5,
        "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],  # 43 layers, then the MTP block's
    },
    "deepseek-v4-pro": {
        **_V4_SHARED, "_name_or_path": "deepseek-v4-pro", "hidden_size": 7168, "num_hidden_layers": 61,
        "num_attention_heads": 128, "q_lora_rank": 1536, "o_groups": 16, "index_topk": 1024, "n_routed_experts": 384,
        "moe_intermediate_size": 3072, "routed_scaling_factor": 2.5,
        "compress_ratios": [128, 128] + [4, 128] * 29 + [4, 0],  # 61 layers, then the MTP block's
    },
}
V4_PRESETS["tiny-v4"] = {
    **_V4_SHARED, "_name_or_path": "tiny-v4", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "head_dim": 32, "qk_rope_head_dim": 8, "q_lora_rank": 32, "o_groups": 2,
    "o_lora_rank": 16, "sliding_window": 8, "index_n_heads": 2, "index_head_dim": 16, "index_topk": 4,
    "n_routed_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 32, "routed_scaling_factor": 1.5,
    "num_hash_layers": 2, "max_position_embeddings": 4096,
    "rope_scaling": {**_V4_SHARED["rope_scaling"], "factor": 4, "original_max_position_embeddings": 256},
    "compress_ratios": [0, 4, 16, 4, 0],
}
# tiny-v4 with 8 indexer heads (the fixture tiny-v4-windows): with 2, a query's scores often tie at 0
# (each head's relu 0 for several entries), and which entries it keeps is then any implementation's choice.
V4_PRESETS["tiny-v4-indexer"] = {**V4_PRESETS["tiny-v4"], "_name_or_path": "tiny-v4-indexer", "index_n_heads": 8}
