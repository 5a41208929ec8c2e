"""The MLA family of 2025: DeepSeek-V2 / V2-Lite, DeepSeek-V3 / R1, Kimi K2 (and the kimi_k25
wrapper of a K2 text model), DeepSeek-V3.2 with its Lightning Indexer. One config class
(stepper.config.Config), one decoder layer (model.layer), HF's weight names (weights.names)."""

from __future__ import annotations

import dataclasses
from importlib import resources

from stepper.config import TOKEN_ID_FIELDS, Config, read_mla_config
from stepper.families.family import Family
from stepper.model.layer import decoder_layer

# the catalogue lists (and finds) its parts in this order
PARTS = ("model", "residual", "mla_attention", "mlp", "router", "router_sigmoid", "router_noaux_tc", "router_groups",
         "moe", "router_softmax", "router_group_limited", "indexer", "index_fp8")


def part_files(names: tuple[str, ...]) -> tuple:
    """The shipped catalogue part files of these names (stepper/catalog/parts/NAME.json)."""
    folder = resources.files("stepper.catalog").joinpath("parts")
    return tuple(folder.joinpath(f"{name}.json") for name in names)


def miniature(cfg: Config, layer: int) -> Config:
    """A one-layer config of tiny sizes whose layer 0 takes every branch `layer` of cfg takes: a
    q latent or none, MoE or dense, the router's scoring and selection with its groups, shared
    experts or none, the indexer or none. Unquantized (storage changes no name or order)."""
    moe = cfg.is_moe_layer(layer)
    experts = 2 * cfg.n_group if moe else 0  # two per group: noaux_tc sums each group's two best
    return dataclasses.replace(
        cfg, name=f"miniature of {cfg.name}", vocab_size=16, hidden_size=16, intermediate_size=8,
        moe_intermediate_size=4,
        num_hidden_layers=1, num_attention_heads=2, q_lora_rank=None if cfg.q_lora_rank is None else 8, kv_lora_rank=8,
        qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4, n_routed_experts=experts,
        n_shared_experts=min(cfg.n_shared_experts, 1), num_experts_per_tok=min(cfg.num_experts_per_tok, 2),
        first_k_dense_replace=0, moe_layer_freq=1, rope_scaling=None, quantization=None, int4=None, wrapper=None,
        index_n_heads=None if not cfg.has_indexer else 2, index_head_dim=None if not cfg.has_indexer else 8,
        index_topk=None if not cfg.has_indexer else 4,  # more than the positions: its kept positions grow with them
        **dict.fromkeys(TOKEN_ID_FIELDS),  # the model's ids may lie outside the miniature's vocabulary
    )


FAMILY = Family(
    name="deepseek",
    model_types=("deepseek_v3", "kimi_k2", "deepseek_v2", "deepseek_v32", "kimi_k25"),
    read_config=read_mla_config,
    decoder_layer=decoder_layer,
    parts=part_files(PARTS),
    miniature=miniature,
)
