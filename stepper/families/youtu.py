"""Youtu-LLM (`youtu`, tencent/Youtu-LLM-2B): DeepSeek-V3's attention with a dense SwiGLU MLP in
every layer and the embedding reused as lm_head.

transformers (models/youtu/modular_youtu.py) takes DeepseekV3Attention, Qwen3's MLP
(gate_proj, up_proj, down_proj) and Llama's decoder layer; its config removes every MoE field and
defaults tie_word_embeddings to true, so the checkpoint has no lm_head.weight. When it loads the
model, YoutuPreTrainedModel zeroes the pad token's embedding row: YoutuModel reads that row as
zeros, and with the embedding as lm_head that token's logit is 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from stepper.config import Config
from stepper.families import mla_fields
from stepper.families.family import around
from stepper.model.layer import decoder_layer
from stepper.model.transformer import Transformer
from stepper.untrusted import said

MODEL_TYPE = "youtu"
ROUTER = (("sigmoid",), ("noaux_tc",))  # never used: no layer has experts
DEFAULTS: dict[str, Any] = {  # YoutuConfig's
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 32,
    "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
}
MOE_FIELDS = ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
              "first_k_dense_replace", "n_group", "topk_group", "routed_scaling_factor")


def to_mla(f) -> tuple[dict[str, Any], dict[str, Any]]:
    """Youtu's config.json in DeepseekV3's names; tie_word_embeddings becomes stepper's own field."""
    raw = mla_fields.with_defaults(dict(f.raw), DEFAULTS)
    mla_fields.check_interleaved(f, raw)
    mla_fields.refuse_present(f, raw, MOE_FIELDS, "every Youtu layer has a dense MLP (YoutuMLP), no experts")
    tied = raw.pop("tie_word_embeddings")
    if not isinstance(tied, bool):
        raise f.fail("tie_word_embeddings", f"must be true or false, got {said(tied)}")
    fields = mla_fields.typed(f, raw)
    head = fields.int("qk_nope_head_dim") + fields.int("qk_rope_head_dim")
    if raw.get("qk_head_dim") not in (None, head):  # Youtu-LLM's config.json writes it out
        raise f.fail("qk_head_dim",
                     f"must be qk_nope_head_dim + qk_rope_head_dim ({head}), got {said(raw['qk_head_dim'])}")
    # YoutuPreTrainedModel zeroes the pad token's embedding row when loading (the MLA reader checks the id;
    # torch's embedding counts a negative one from the end)
    pad = raw.get("pad_token_id")
    pad_row = pad % fields.int("vocab_size") if isinstance(pad, int) and not isinstance(pad, bool) else pad
    return raw, {"tie_word_embeddings": tied, "zeroed_pad_row": pad_row}


def published(cfg) -> dict[str, Any]:
    """The config.json of a Youtu checkpoint: no MoE field, tie_word_embeddings as the model has it."""
    out = mla_fields.published_fields(cfg, MODEL_TYPE, "YoutuForCausalLM",
                                      drop=(*MOE_FIELDS, "norm_topk_prob", "moe_layer_freq"))
    return {**out, "tie_word_embeddings": cfg.tie_word_embeddings}


@dataclasses.dataclass(frozen=True)
class YoutuConfig(Config):
    """MLA's config (the fields Youtu sets among them), written back as Youtu's config.json."""

    def to_hf(self) -> dict[str, Any]:
        return published(self)


read_config = mla_fields.reader(MODEL_TYPE, ROUTER, to_mla, YoutuConfig)


class YoutuModel(Transformer):
    """MLA's model whose embedding has the pad token's row zeroed (config.zeroed_pad_row)."""

    def embed(self, ids: np.ndarray) -> np.ndarray:
        """ids [B, T] -> [B, T, d], the pad token's row as zeros."""
        rows = super().embed(ids)  # [B, T, d]
        pad = self.config.zeroed_pad_row
        return rows if pad is None else np.where((ids == pad)[..., None], np.float32(0), rows)

    def logits(self, normed: np.ndarray) -> np.ndarray:
        """lm_head on the final norm, [B, T, d] -> [B, T, V]: with the embedding as lm_head, the
        zeroed row gives the pad token a logit of 0."""
        logits = super().logits(normed)  # [B, T, V]
        if self.config.zeroed_pad_row is not None and self.config.tie_word_embeddings:
            logits[..., self.config.zeroed_pad_row] = 0
        return logits


FAMILY = mla_fields.family("youtu", (MODEL_TYPE,), read_config, model=around(YoutuModel, decoder_layer))
