"""`stepper bench`: how fast a full-size layer runs here, and what bounds it.

Each figure is measured in a fresh subprocess (`python -m stepper.bench SCENARIO ARGS`), so its
peak RSS is its own:

- the machine's ceilings (ceilings): memory bandwidth (a large float32 copy), float32 GEMM rate,
  the rate at which FP8 tiles are decoded and multiplied (`fp8_matmul`), and the rate at which
  FP4 tiles are decoded (`fp4_tiles`, DeepSeek-V4's experts);
- one Kimi K2 MoE layer at full size (layers; layer 1 of `kimi-k2`, 384 experts, FP8, read from a
  checkpoint written once by `stepper synth` into the work directory, checkpoints): decode one
  token over a 1024-position latent cache, and a 512-token prefill;
- the same MoE layer with its routed experts in INT4 (compressed-tensors pack-quantized, as
  Kimi-K2-Thinking stores them; attention and the shared expert BF16), the same two ways; the
  two layers in turn (layers_in_turn), decode and prefill, for their ratio with both sides in the
  same minutes (the whole checkpoints, 26 GB, do not fit the page cache at once, but what a
  512-token prompt's chosen experts need of both does); one routed expert alone, INT4 against
  FP8, for 1, 11 (a 512-token prefill's share of each expert) and 512 tokens;
- the dense layer 0 at full size, the same two ways;
- the same MoE layer shape with 16 routed experts, against transformers' DeepseekV3 in float32
  on the same weights and tokens (transformers_pair; T = 1, 32, 512, each also with stepper's
  weight cache warm: float32 weights in memory, transformers' own work, so that what decoding
  the FP8 weights adds is the difference), when torch and transformers are installed;
- with `--kda`, one full-size Kimi Linear KDA layer's attention (kda): decode one token and
  prefill 4096, with the share of the time spent in the state update;
- with `--indexer`, DeepSeek-V3.2's first layer (dense: its attention and Lightning Indexer are
  those of every layer) prefilling 4096 tokens: the indexer alone, the attention under its mask
  alone, and the whole layer;
- with `--v4`, DeepSeek-V4-Flash's CSA layer (and with `--v4-hca` its HCA layer too) decoding one
  token and prefilling 512, each against its floor (v4_layer);
- with `--long`, one layer's attention at long contexts (long_context); DeepSeek-V4's CSA decode
  over a 1,048,576-position context (v4_attention).

runner makes the default run. Timing medians use several repetitions, and the comparisons with
transformers take the two runs in turn (`figures.paired_times`); nothing here is asserted in tests.
"""
