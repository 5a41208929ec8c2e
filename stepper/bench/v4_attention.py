"""Bench: a decode step of DeepSeek-V4-Flash's CSA attention over a 1,048,576-position context.

One full-size CSA layer (hidden 4096, 64 heads of 512, the indexer's 64 heads of 128, top-512,
window 128, m = 4) with random BF16 projection weights, its cache seeded for the context
(model.v4_synthetic_cache), then decode steps: the seeding time, the median step time, the
process's peak resident memory (weights, cache and the step together), the cache's bytes, and
the float32 GEMM rate measured in the same process (the floor the step's products run at).
Run alone, in its own process, so that the peak is the scenario's:

    python -m stepper.bench.v4_attention [CONTEXT] [STEPS]   -> one JSON list of figures
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from stepper.bench.ceilings import gemm_rate
from stepper.bench.figures import Figure, peak_rss_mb
from stepper.config import Yarn
from stepper.families.deepseek_v4_config import cost_line
from stepper.kernels import parallel
from stepper.model.compressed_attention import AttentionDims, attention, weight_shapes
from stepper.model.layer_weights import LayerWeights
from stepper.model.v4_synthetic_cache import seeded_cache
from stepper.seams.trace import Emitter
from stepper.weights.stored import Bf16Matrix

CONTEXT = 1 << 20
# V4-Flash's attention sizes (config.json of deepseek-ai/DeepSeek-V4-Flash; its compressed layers' YaRN)
FLASH_CSA = AttentionDims(hidden_size=4096, num_heads=64, head_dim=512, rope_dim=64, q_lora_rank=1024, o_groups=8,
                          o_lora_rank=1024, sliding_window=128, compress_ratio=4, index_n_heads=64,
                          index_head_dim=128, index_topk=512, eps=1e-6, rope_theta=160000.0,
                          yarn=Yarn(factor=16.0, original_max_position_embeddings=65536))


class RandomLayer:
    """Random weights of one attention layer: projections as BF16 (as the published compressor and
    indexer ones are; the FP8 ones are smaller still), norms 1, the rest float32."""

    config = None  # the attention takes its sizes as AttentionDims

    def __init__(self, dims: AttentionDims, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.arrays: dict[str, np.ndarray | Bf16Matrix] = {}
        for name, shape in weight_shapes(dims).items():
            if len(shape) == 2 and name.endswith(".weight"):  # a projection (position_bias is not)
                values = rng.standard_normal(shape, dtype=np.float32) * np.float32(shape[1] ** -0.5)
                self.arrays["model.layers.0." + name] = Bf16Matrix((values.view(np.uint32) >> 16).astype(np.uint16))
            else:
                ones = name.endswith("norm.weight")
                self.arrays["model.layers.0." + name] = np.ones(shape, np.float32) if ones else \
                    rng.standard_normal(shape, dtype=np.float32)

    def get(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def matrix(self, name: str) -> np.ndarray | Bf16Matrix:
        return self.arrays[name]


def long_decode(context: int = CONTEXT, steps: int = 3, dims: AttentionDims = FLASH_CSA) -> list[Figure]:
    parallel.single_threaded_blas()  # as the command line runs
    w = LayerWeights(RandomLayer(dims), 0)
    rng = np.random.default_rng(1)
    sample = rng.standard_normal((1, 16, dims.hidden_size), dtype=np.float32)
    start = time.perf_counter()
    cache = seeded_cache(sample, w, dims, context, seed=0)
    seeded = time.perf_counter() - start
    times = []
    for _ in range(steps):
        x = rng.standard_normal((1, 1, dims.hidden_size), dtype=np.float32)
        start = time.perf_counter()
        attention(x, w, dims, cache, Emitter())
        times.append(time.perf_counter() - start)
    name = f"V4-Flash CSA attention, decode over {context:,} positions"
    return [
        Figure(f"{name}: seeding the cache", seeded, "s"),
        Figure(f"{name}: one step", float(np.median(times)), "s", peak_rss_mb(),
               f"median of {steps} steps; peak includes the BF16 weights and the seeded cache"),
        Figure(f"{name}: cache held", cache.nbytes() / 2**20, "MiB", note=cost_line(dims)),
        Figure("float32 GEMM rate in the same process", gemm_rate() / 1e9, "GFLOP/s"),
    ]


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    print(json.dumps([f.__dict__ for f in long_decode(*args)]))
