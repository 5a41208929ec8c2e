"""The machine's ceilings and the floors made of them: memory bandwidth, the float32 GEMM rate,
the rates at which FP8 and FP4 tiles are decoded, the machine's description; and a layer's
floor, the least time its weights and products could take at this run's rates."""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass

import numpy as np

from stepper.bench.figures import Figure, median_time, side_by_side
from stepper.config import Config
from stepper.fp4 import quantize_fp4
from stepper.fp8 import quantize
from stepper.kernels import cpu_caches, fp4_tiles, fp8_tiles, gemm, int4_tiles, parallel
from stepper.kernels.fp8_matmul import linear_fp8
from stepper.weights.names import layer_shapes
from stepper.weights.stored import Fp4Matrix, Fp8Matrix

GEMM_CEILING = "float32 GEMM 2048^3, every core, stepper's split and BLAS"


FP8_CEILING = "FP8 tile decode + matvec, 2048x7168, one core"


FP8_EVERY_CORE = "FP8 tile decode + matvec, 2048x7168, every core at once"


FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile",
            "amx_bf16", "asimd", "sve")  # the CPU flags the products' speed depends on, where the CPU has them


def machine() -> str:
    """The CPU, its cores, its L2, the features the products use, Python, NumPy and the BLAS."""
    cpu = gemm.cpu_info("model name") or platform.processor() or platform.machine()
    flags = set((gemm.cpu_info("flags") or gemm.cpu_info("Features")).split())
    features = " ".join(f for f in FEATURES if f in flags) or "not reported"
    return (f"{cpu}, {os.cpu_count()} cores, L2 {cpu_caches.l2_bytes() >> 10} KiB per core; CPU features: {features}; "
            f"Python {platform.python_version()}, NumPy {np.__version__}, BLAS: {parallel.blas_description()}; "
            f"the weights' products: {gemm.description()}; {fp4_subnormals()}; {fp8_parts()}")


def fp4_subnormals() -> str:
    """Whether FP4 tiles are normalized here (fp4_tiles.subnormals_slow): their 0.5s kept out of subnormals."""
    if fp4_tiles.subnormals_slow():
        return "FP4 tiles normalized (float32 subnormals measured slow here)"
    return "FP4 tiles by the bit trick alone (float32 subnormals measured fast enough here)"


def fp8_parts() -> str:
    """How FP8 blocks [128, 7168] are decoded here: whole, or in parts of the L2 (fp8_tiles.part_rows)."""
    rows = fp8_tiles.part_rows(*fp8_tiles.PROBE_BLOCK)
    if rows == fp8_tiles.PROBE_BLOCK[0]:
        return "FP8 blocks [128, 7168] decoded whole (parts of half the L2 measured no faster here)"
    return f"FP8 blocks [128, 7168] decoded in parts of {rows} rows, half the L2 (measured faster here)"


@dataclass(frozen=True)
class Ceilings:
    """This run's rates that the floors are made of."""

    fp8: float  # FP8 weights decoded and multiplied per second, every core at once
    gemm: float  # float32 FLOP/s, every core, as stepper splits its products and with its BLAS
    cores: int

    @classmethod
    def of(cls, figures: list[Figure]) -> Ceilings:
        rate = {f.name: f.value for f in figures}
        return cls(rate[FP8_EVERY_CORE] * 1e9, rate[GEMM_CEILING] * 1e9, parallel.cores())


def ceilings() -> list[Figure]:
    a, b = np.empty(2**27, np.float32), np.ones(2**27, np.float32)  # 512 MiB each
    copy = median_time(lambda: np.copyto(a, b), 5)
    m, out = np.ones((2048, 2048), np.float32), np.empty((2048, 2048), np.float32)
    numpy_threads = median_time(lambda: m @ m, 5)
    parallel.single_threaded_blas()  # from here on, as stepper runs: its own split, BLAS on one thread
    one = median_time(lambda: gemm.matmul(m, m, out), 5)
    [one_core] = fp8_rate()
    together = side_by_side("fp8_rate", parallel.cores())
    return [
        Figure("memory bandwidth (float32 copy, read + write)", 2 * a.nbytes / copy / 1e9, "GB/s"),
        Figure("float32 GEMM 2048^3, NumPy's BLAS on its own threads", 2 * 2048**3 / numpy_threads / 1e9, "GFLOP/s"),
        Figure(GEMM_CEILING, gemm_rate() / 1e9, "GFLOP/s"),
        Figure("float32 GEMM 2048^3, stepper's BLAS on one core", 2 * 2048**3 / one / 1e9, "GFLOP/s"),
        one_core,
        Figure(FP8_EVERY_CORE, sum(f.value for f in together), "G weights/s",
               note=f"one process per core at once ({len(together)}), each "
                    f"{', '.join(f'{f.value:.2f}' for f in together)}: "
                    f"{sum(f.value for f in together) / one_core.value:.2f}x one core alone"),
        fp4_decode_rate(),
    ]


def fp8_rate() -> list[Figure]:
    """FP8 tiles decoded and multiplied by one token, [2048, 7168], in this process alone."""
    codes, scales = quantize(np.random.default_rng(0).standard_normal((2048, 7168), dtype=np.float32))
    w = Fp8Matrix.of(codes, scales)
    x = np.ones((1, 7168), np.float32)
    decode = median_time(lambda: linear_fp8(x, w), 7)
    return [Figure(FP8_CEILING, codes.size / decode / 1e9, "G weights/s",
                   note="weights in memory, so no helper process: the rate of one core")]


def fp4_decode_rate(out_dim: int = 2048, in_dim: int = 4096) -> Figure:
    """FP4 weights decoded per second on one core: a V4-Flash expert's w1 [2048, 4096], tile by tile
    into one reused buffer as a few tokens' FP4 products decode it (the floor under an FP4 product)."""
    w = Fp4Matrix.of(*quantize_fp4(np.random.default_rng(0).standard_normal((out_dim, in_dim), dtype=np.float32)))
    tiles = fp4_tiles.row_tiles(w, 1)
    height = max(end - start for start, end in tiles)
    places = np.empty((int4_tiles.planes(w), height, in_dim // int4_tiles.planes(w)), np.float32)
    decode = median_time(lambda: [fp4_tiles.decode_planes(w, start, end, places[:, : end - start])
                                  for start, end in tiles], 7)
    return Figure(f"FP4 tile decode, {out_dim}x{in_dim}, one core", out_dim * in_dim / decode / 1e9, "G weights/s",
                  note="e2m1 nibbles put into float32 bits, in INT4's planes, times each group's power-of-two scale")


def gemm_rate() -> float:
    """float32 GEMM FLOP/s with stepper's own split and BLAS (kernels.gemm): one 2048^3 product per
    core, side by side."""
    m = np.ones((2048, 2048), np.float32)
    cores = parallel.cores()
    outs = [np.empty_like(m) for _ in range(cores)]
    once = median_time(lambda: parallel.split(list(range(cores)), lambda share: [gemm.matmul(m, m, outs[i])
                                                                                 for i in share]), 3)
    return cores * 2 * 2048**3 / once


def layer_floor(cfg: Config, layer: int, tokens: int, cache: int, ceil: Ceilings) -> tuple[float, str]:
    """The least time a layer step could take here: every FP8 weight it uses decoded once at the
    FP8 rate measured with every core at once (two vCPUs need not give twice one's rate), and its
    products (2 x tokens x the weights each token uses, and the attention core over the cache) at
    the measured GEMM rate, every core. A prefill uses the
    experts its tokens choose: n x (1 - (1 - k/n)^T) of n routed experts, k per token, on average.
    -> (seconds, how it was made)"""
    rest, per_expert = layer_weights(cfg, layer)
    if per_expert:
        n, k = cfg.n_routed_experts, cfg.num_experts_per_tok
        decoded = rest + per_expert * n * (1 - (1 - k / n) ** tokens)
        per_token = rest + per_expert * k
    else:
        decoded = per_token = rest
    attn = "absorb" if cache else "naive"
    flops = 2.0 * tokens * per_token + core_flops(cfg, tokens, cache, attn)
    seconds = decoded / ceil.fp8 + flops / ceil.gemm
    how = (f"{decoded / 1e6:,.0f} M FP8 weights at {ceil.fp8 / 1e9:.2f} G/s on {ceil.cores} cores at once "
           f"+ {flops / 1e9:,.0f} GFLOP at {ceil.gemm / 1e9:.0f} GFLOP/s")
    return seconds, how


def layer_weights(cfg: Config, layer: int) -> tuple[int, float]:
    """The FP8 weights of a layer's matrices: (those every token uses, those of one routed expert;
    0 in a dense layer). The router's weight stays float32 and is not counted."""
    matrices = {name: math.prod(shape) for name, shape in layer_shapes(cfg, layer).items()
                if len(shape) == 2 and ".gate.weight" not in name}
    routed = sum(v for name, v in matrices.items() if ".mlp.experts." in name)
    moe = cfg.is_moe_layer(layer) and cfg.n_routed_experts
    return sum(matrices.values()) - routed, routed / cfg.n_routed_experts if moe else 0


def core_flops(cfg: Config, tokens: int, cache: int, attn: str) -> float:
    """Multiply-adds x 2 of the attention core: the scores and the weighted values over the keys
    each query may attend (cache + t + 1 for query t)."""
    attended = tokens * cache + tokens * (tokens + 1) / 2  # summed over the queries
    per_key = (cfg.qk_head_dim + cfg.v_head_dim if attn == "naive"
               else 2 * cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    return 2.0 * cfg.num_attention_heads * attended * per_key
