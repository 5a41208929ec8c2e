"""DeepSeek-V4 (`deepseek_v4`) as a registered family: its config reader, its layer and the model
around it (families.deepseek_v4.V4Model: the hc_mult streams [B, T, n, d] flow between the
layers), one attention cache per layer, its synthetic weights and published checkpoints, its
catalogue parts (stepper/catalog/v4/) and a miniature for families.derive.

What a run may not ask of it, each refused in one line: the attention has one path (no naive or
absorbed choice), the prompt runs whole (a compressor's windows close as positions arrive, so a
chunk boundary changes nothing worth a second path; --chunk is refused rather than ignored), the
caches count positions from 0 (a compressor's windows start there), and its indexer scores in
float32 only.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources

from stepper.families.deepseek import part_files
from stepper.families.deepseek_v4 import V4Caches, V4Model
from stepper.families.deepseek_v4_checkpoint import V4Checkpoint
from stepper.families.deepseek_v4_config import MODEL_TYPE, V4Config, miniature
from stepper.families.deepseek_v4_synth import V4Synthetic
from stepper.families.deepseek_v4_weights import published_name
from stepper.families.family import Family
from stepper.model.v4_attention_cache import bounded_values, values_per_position
from stepper.model.v4_layer import v4_decoder_layer

PARTS = ("v4_residual", "hc_streams", "v4_router", "v4_attention")  # and MLA's `model` part: logits are the same tensor
FLOAT32 = 4


def read_config(raw: dict, source: str) -> V4Config:
    return V4Config.from_hf(raw, source)


def streams(cfg: V4Config) -> tuple[int | None, ...]:
    """What flows between V4's layers: [1, T, n, d] (one sequence: the hash layers route by its ids)."""
    return (1, None, cfg.hc_mult, cfg.hidden_size)


def cache_bytes(cfg: V4Config, layers: Iterable[int], positions: int, attn: str, index_scoring: str) -> int:
    """Each layer's cache over `positions`: its compressors' entries grow with them, its window and
    unfinished windows are bounded (model.v4_attention_cache)."""
    total = 0.0
    for layer in layers:
        dims = cfg.dims(layer)
        total += values_per_position(dims) * positions + bounded_values(dims)
    return int(total * FLOAT32)


def runtime_sizes(cfg: V4Config, layer: int | None, t: int, s: int) -> dict[str, int]:
    """The sizes of the catalogue's runtime dims (stepper/catalog/v4) in a step of `t` new positions
    attending `s` (the new ones included, counted from 0) on `layer` (None: a tensor outside the layers)."""
    if layer is None:
        return {}
    m = cfg.compress_ratio(layer)
    entries = s // m if m else 0  # Ec: one per closed window
    chosen = min(cfg.index_topk, entries) if cfg.layer_kind(layer) == "csa" else entries  # Kq
    slots = 2 * m if cfg.layer_kind(layer) == "csa" else m  # CSA's windows overlap their predecessor's
    return {"S_w": min(s, cfg.sliding_window - 1 + t), "Ec": entries, "Kq": chosen,
            "S_q": cfg.sliding_window + chosen, "S_sink": cfg.sliding_window + chosen + 1,
            "Wc": entries - (s - t) // m if m else 0, "slots": slots, "c": slots // m * cfg.head_dim if m else 0,
            "m": m, "Dc": cfg.head_dim, "r": s % m if m else 0}


def decode_peaks(cfg: V4Config, layer: int | None, first: int, last: int) -> tuple[int, ...]:
    """The last decode step (of those attending `first` to `last` positions) that closes one of the
    layer's compressor windows: its compressors' tensors hold one window (Wc 1), a later step's none."""
    m = cfg.compress_ratio(layer) if layer is not None else 0
    closing = last // m * m if m else 0
    return (closing,) if m and closing >= first else ()


def parts() -> tuple:
    folder = resources.files("stepper.catalog").joinpath("v4")
    return (*part_files(("model",)), *(folder.joinpath(f"{name}.json") for name in PARTS))


REFUSES = (
    ("attn", "DeepSeek-V4 has one attention path (one shared key-value head over the window and the compressed "
             + "entries), no naive or absorbed one to choose"),
    ("chunk", "DeepSeek-V4's prefill runs the whole prompt at once (chunk 0)"),
    ("start_pos", "DeepSeek-V4's caches count positions from 0 (a compressor's windows start there); for a long "
                  + "context, run one layer over a cache seeded with N positions ({layer} {cache_len})"),
    ("index_scoring", "DeepSeek-V4's indexer scores in float32 only (exact)"),
)

FAMILY = Family(
    name="deepseek_v4",
    model_types=(MODEL_TYPE,),
    read_config=read_config,
    decoder_layer=v4_decoder_layer,
    parts=parts(),
    miniature=miniature,
    model=V4Model,
    cache=V4Caches,
    synthetic=V4Synthetic,
    checkpoint=V4Checkpoint,
    stream=streams,
    cache_bytes=cache_bytes,
    runtime_sizes=runtime_sizes,
    decode_peaks=decode_peaks,
    refuses=REFUSES,
    published_name=published_name,
)
