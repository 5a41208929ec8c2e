"""stepper against transformers' DeepseekV3 decoder layer on the same weights and tokens, the
two timed in turn (needs torch and transformers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stepper.bench.ceilings import core_flops, fp8_rate, layer_weights
from stepper.bench.figures import Figure, median_time, paired_times
from stepper.config import Config, Fp8
from stepper.kernels import gemm, parallel
from stepper.kernels.fp8_matmul import padded_columns
from stepper.kernels.fp8_tiles import multiply_in_cache, multiply_tile, part_rows, tall_rows, tokens_in_cache
from stepper.kernels.weight_cache import CachedWeights
from stepper.model import Transformer
from stepper.seams.trace import Emitter
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.names import layer_shapes


def versus_torch(checkpoint: Path, tokens: int, pairs: int, cache_mb: int = 0) -> list[Figure]:
    """stepper (FP8 from the checkpoint) and transformers (float32 resident) on the same layer,
    timed in turn (paired_times).

    transformers runs its experts with its eager loop: what it picks by default for a model it
    loads, grouped_mm, measured slower on this CPU (16-expert layer at 512 tokens: 4.5-5.4 s
    against 3.7-4.5 s). With cache_mb, stepper keeps decoded weights (--weight-cache-mb) and is
    timed once it is warm."""
    import torch
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RotaryEmbedding

    torch.set_grad_enabled(False)
    source = Checkpoint(checkpoint)  # (load_layer below reads every tensor: the page cache is filled then)
    cfg = source.config
    raw = {k: v for k, v in cfg.to_hf().items() if k != "quantization_config"}
    raw.update(model_type="deepseek_v3", rope_interleave=True)
    hf_cfg = DeepseekV3Config(**raw)
    hf_cfg._attn_implementation = "eager"
    hf_cfg._experts_implementation = "eager"
    layer = DeepseekV3DecoderLayer(hf_cfg, 1).float().eval()
    load_layer(layer, source, layer_shapes(cfg, 1), cfg)
    rotary = DeepseekV3RotaryEmbedding(hf_cfg)
    hidden = np.random.default_rng(3).standard_normal((1, tokens, cfg.hidden_size), dtype=np.float32)
    h = torch.from_numpy(hidden)
    positions = torch.arange(tokens)[None]
    cos_sin = rotary(h, positions)
    mask = torch.full((tokens, tokens), float("-inf")).triu(1)[None, None]
    model = Transformer(CachedWeights(source, cache_mb << 20) if cache_mb else source)
    emit = Emitter()

    def ours_once():
        model.layer(1, hidden, model.rope(np.arange(tokens), emit), None, emit, "naive")

    if cache_mb:  # a weight is kept from its second use: two runs fill the cache
        ours_once()
        ours_once()
    ratio, torch_time, ours = paired_times(
        lambda: layer(h, attention_mask=mask, position_ids=positions, position_embeddings=cos_sin), ours_once, pairs)
    how = "weight cache warm" if cache_mb else "FP8"
    figures = [Figure(f"{cfg.name} layer 1, T={tokens}: stepper ({how}) / transformers (float32)", ratio, "x", None,
                      f"median of {pairs} ratios, runs taken in turn after one of each; medians: stepper {ours:.3f} s, "
                      f"transformers {torch_time:.3f} s")]
    if not cache_mb:
        floor, made = least_time(cfg, tokens, expert_tokens(model, hidden))
        figures.append(Figure(f"{cfg.name} layer 1, T={tokens}: the least time stepper's work could take", floor, "s",
                              None, f"{made}; {floor / torch_time:.2f}x transformers' time (above 1, this floor "
                                    "keeps stepper behind)"))
    return figures


def least_time(cfg: Config, tokens: int, counts: list[int]) -> tuple[float, str]:
    """The least time stepper's work on this layer could take here, from rates measured now in
    this process: its FP8 weights (the chosen experts' and the rest) decoded at one core's FP8
    rate on every core, and each product at the rate of its own GEMM (kernels.gemm, one core, every
    core) on the tiles it multiplies by the columns it gets: a routed expert the tokens the run's
    router gave it (`counts`, one per chosen expert), the rest of the layer every token.
    -> (seconds, how it was made)

    The columns are padded as stepper pads them, each expert's own: a BLAS may take them 16 at a
    time (MKL's sgemm takes one [128, 7168] tile by 4 to 16 tokens in the same time, 1.65x that by
    17 to 32), so the experts' average would understate the products; the last few multiplied
    part by part (fp8_tiles.tokens_in_cache) are timed so. A tile is what the product
    reads: with few tokens one scale block of rows, just decoded into the cache; with many,
    TALL_TILE_BYTES of rows (fp8_tiles.apply_tiles). Its rate is taken with the tile in the cache.
    (A whole [2048, 7168] weight read from memory at every product, as this took before,
    multiplies 16 tokens at half that rate on a machine whose memory is slow, and put this floor
    above what stepper's own warm layer takes.)"""
    [fp8] = fp8_rate()
    cores = parallel.cores()
    rest, per_expert = layer_weights(cfg, 1)
    rates: dict[int, float] = {}  # padded columns -> FLOP/s of one core

    def seconds(flops: float, columns: int) -> float:
        columns = padded_columns(columns, cfg.hidden_size)
        if columns not in rates:
            rates[columns] = tile_rate(cfg, columns)
        return flops / rates[columns]

    flops = [2.0 * count * per_expert for count in counts] + [2.0 * tokens * rest + core_flops(cfg, tokens, 0, "naive")]
    products = sum(seconds(f, c) for f, c in zip(flops, [*counts, tokens])) / cores
    decoded = rest + per_expert * len(counts)
    every_core = fp8.value * 1e9 * cores
    by_columns = ", ".join(f"{c}: {r / 1e9:.0f}" for c, r in sorted(rates.items()))
    how = (f"{decoded / 1e6:,.0f} M FP8 weights at {every_core / 1e9:.2f} G/s on {cores} cores at once + "
           f"{sum(flops) / 1e9:,.0f} GFLOP at {sum(flops) / products / 1e9:.0f} GFLOP/s ({gemm.description()}; "
           f"{len(counts)} experts' tokens {min(counts, default=0)}-{max(counts, default=0)}; GFLOP/s a core "
           f"on its tiles by each count of columns, padded: {by_columns})")
    return decoded / every_core + products, how


def expert_tokens(model: Transformer, hidden: np.ndarray) -> list[int]:
    """How many tokens each routed expert the layer's router chooses for `hidden` [1, T, d] gets
    (one run of layer 1, its router's top-k kept)."""
    chosen = []
    emit = Emitter([lambda event: chosen.append(np.asarray(event.array)) if event.key == "mlp.gate.topk_idx" else None])
    model.layer(1, hidden, model.rope(np.arange(hidden.shape[1]), emit), None, emit, "naive")
    picked = np.concatenate([c.ravel() for c in chosen])
    return [int(count) for count in np.bincount(picked[picked >= 0]) if count]


def tile_rate(cfg: Config, columns: int) -> float:
    """FLOP/s of one core multiplying the tile stepper's FP8 products multiply by `columns` tokens
    (tile_rows), held in the cache, as apply_tiles multiplies it (median of 9)."""
    rows = tile_rows(cfg, columns)
    tile, inputs = np.ones((rows, cfg.hidden_size), np.float32), np.ones((columns, cfg.hidden_size), np.float32)
    out = np.empty((rows, columns), np.float32)
    few = columns <= block_rows(cfg)  # as apply_tiles: the last tokens part by part, the others by the whole tile
    direct = gemm.direct_parts(cfg.hidden_size, columns) if few else None
    head = columns - (tokens_in_cache(columns, block_rows(cfg), cfg.hidden_size) if few else 0)
    step = part_rows(block_rows(cfg), cfg.hidden_size)

    def product() -> None:
        if head < columns:
            for b0 in range(0, rows, step):  # with no tokens for the whole tile, every part in one part's memory
                part = tile[b0 : b0 + step] if head else tile[: min(step, rows - b0)]
                multiply_in_cache(part, inputs[head:].T, out[b0 : b0 + step, head:])
        if head:
            multiply_tile(tile, inputs[:head].T, out[:, :head], direct)

    return 2 * tile.size * columns / median_time(product, 9)


def tile_rows(cfg: Config, columns: int) -> int:
    """The rows of the tiles stepper's FP8 products multiply by `columns` tokens (fp8_tiles)."""
    block = block_rows(cfg)
    return tall_rows(block, cfg.hidden_size) if columns > block else block  # fp8_tiles.many_tokens


def block_rows(cfg: Config) -> int:
    """The rows of one block of FP8 scales: a few tokens' tile (fp8_tiles.many_tokens)."""
    return (cfg.quantization or Fp8()).weight_block_size[0]


def load_layer(layer, source, shapes: dict[str, tuple[int, ...]], cfg: Config) -> None:
    import torch

    params = dict(layer.named_parameters())
    params.update(dict(layer.named_buffers()))
    experts = {}
    for name in shapes:
        short = name.split(".", 3)[3]
        value = torch.from_numpy(np.array(source.get(name)))  # a writable copy of the mapped bytes
        if ".experts." in short:
            _, _, e, proj, _ = short.split(".")
            experts.setdefault(int(e), {})[proj] = value
        else:
            params[short].data.copy_(value)
    for e, parts in experts.items():
        params["mlp.experts.gate_up_proj"].data[e].copy_(torch.cat([parts["gate_proj"], parts["up_proj"]]))
        params["mlp.experts.down_proj"].data[e].copy_(parts["down_proj"])
