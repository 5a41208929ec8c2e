"""`stepper bench`'s way of timing two things against each other (no time is asserted: a clock
that only the timed functions move stands in for the real one)."""

import dataclasses

import numpy as np
import pytest

from stepper.bench import ceilings, checkpoints, layers, long_context, runner, v4_layer
from stepper.bench import figures as figs


def test_paired_times_run_each_once_untimed_then_in_turn_swapping_the_order(monkeypatch):
    clock, calls = [0.0], []
    monkeypatch.setattr(figs.time, "perf_counter", lambda: clock[0])

    def runs(name, seconds):
        def run():
            calls.append(name)
            clock[0] += seconds.pop(0)
        return run

    first = runs("first", [9.0, 1.0, 2.0, 4.0, 1.0, 2.0])  # the untimed run first
    second = runs("second", [9.0, 3.0, 2.0, 8.0, 2.0, 5.0])
    ratio, first_median, second_median = figs.paired_times(first, second, 5)
    assert calls == ["first", "second", "first", "second", "second", "first", "first", "second", "second", "first",
                     "first", "second"]
    # pairs (first, second): (1, 3), (2, 2), (4, 8), (1, 2), (2, 5): ratios 3, 1, 2, 2, 2.5
    assert (ratio, first_median, second_median) == (2.0, 2.0, 3.0)


def test_bench_checkpoints_are_the_checkpoint_folders_of_the_workdir(tmp_path):
    for name in ("b-layers1-1-seed0", "a-layers0-0-seed0"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors.index.json").write_text("{}")
    (tmp_path / "half-written").mkdir()  # no index: not a checkpoint (yet)
    (tmp_path / "notes.txt").write_text("")
    assert checkpoints.bench_checkpoints(tmp_path) == [tmp_path / "a-layers0-0-seed0", tmp_path / "b-layers1-1-seed0"]


def test_the_attention_core_flops_count_the_keys_each_query_attends():
    from stepper.presets import preset

    cfg = preset("tiny")  # 4 heads, kv_lora 128, rope 16, qk_head 48, v_head 32
    # 3 queries after 2 cached positions attend 3, 4 and 5 keys: 12 (query, key) pairs
    assert ceilings.core_flops(cfg, 3, 2, "absorb") == 2 * 4 * 12 * (128 + 16 + 128)
    assert ceilings.core_flops(cfg, 3, 2, "naive") == 2 * 4 * 12 * (cfg.qk_head_dim + cfg.v_head_dim)


def test_the_long_context_scenario_runs_on_a_small_config(monkeypatch):
    from stepper.kernels import attention

    monkeypatch.setattr(attention, "WHOLE_SCORES", 0)  # the tiled path, as at full size
    monkeypatch.setattr(long_context, "gemm_rate", lambda: 1e9)
    [prefill] = long_context.attention_run("tiny", tokens=200, cache=0, attn="absorb", shown=True, repeat=1)
    assert prefill.name == "tiny attention (absorb): prefill 200 tokens" and prefill.unit == "s" and prefill.value > 0
    assert prefill.peak_rss_mb > 0 and "every tensor shown" in prefill.note
    # the attention core timed where it runs: a silent prefill's (a shown one's output is made with its weights)
    [silent] = long_context.attention_run("tiny", tokens=200, cache=0, attn="absorb", shown=False, repeat=1)
    assert "of the float32 GEMM rate here (1.0 GFLOP/s, every core)" in silent.note
    [decode] = long_context.attention_run("tiny", tokens=1, cache=3000, attn="naive", shown=False, repeat=2)
    assert decode.name == "tiny attention (naive): decode 1 token over 3000 cached positions"
    names = []
    monkeypatch.setattr(long_context, "in_subprocess", lambda name, **kw: names.append((name, kw)) or [])
    long_context.long_context("kimi-k2", lambda _: None)
    assert [(kw["tokens"], kw["cache"], kw["attn"], kw["shown"]) for _, kw in names] == [
        (4096, 0, "naive", False), (4096, 0, "naive", True), (16384, 0, "naive", False), (32768, 0, "naive", False),
        (32768, 0, "absorb", True), (1, 8192, "absorb", True), (1, 32768, "absorb", True), (1, 131072, "absorb", True)]


def test_int4_experts_against_fp8_on_a_small_config(tmp_path):
    """The INT4 scenario's code on tiny (the coordinator runs it at full size): its checkpoint
    holds INT4 experts, and the two layers are timed in turn, decode and prefill."""
    from stepper.weights.checkpoint import Checkpoint
    from stepper.weights.stored import Int4Matrix

    said = []
    fp8_folder = checkpoints.ensure_checkpoint(tmp_path, checkpoints.bench_config("tiny", None), range(1, 2))
    fp8 = layers.moe_figures(fp8_folder, said.append, " (FP8)", repeats=(2, 2))
    fp8 = [dataclasses.replace(f, floor=0.5 + i, floor_note=f"floor {i}") for i, f in enumerate(fp8)]
    figures = layers.int4_versus_fp8(tmp_path, "tiny", said.append, fp8, repeats=(2, 2), pairs=(2, 2))
    assert [f.unit for f in figures] == ["s", "s", "x", "x", "x", "x", "x"]
    decode, prefill, decode_ratio, prefill_ratio, *experts = figures
    assert decode_ratio.name == ("tiny-layers1-1-seed0 layer 1, decode 1 token, 1024-position cache, in turn: "
                                 "INT4 experts / FP8 experts")
    assert prefill_ratio.name == ("tiny-layers1-1-seed0 layer 1, prefill 512 tokens (64.0 per expert), in turn: "
                                  "INT4 experts / FP8 experts")  # tiny: 32 experts, 4 per token
    assert all(r.note.startswith("median of 2 ratios, taken in turn") for r in (decode_ratio, prefill_ratio))
    assert any("in turn: decode 1 token, prefill 512 tokens" in line for line in said)
    assert [f.name.partition(" layer 1, ")[2] for f in experts] == [
        f"one routed expert, {n} token(s): INT4 / FP8" for n in (1, 11, 512)]
    assert "decode 1 token" in decode.name and "prefill 512 tokens" in prefill.name
    assert (decode.floor, prefill.floor) == (0.5, 1.5)  # the INT4 layer's times held to the FP8 layer's floors
    assert prefill.floor_note == "the FP8 layer's, INT4 held to FP8: floor 1"
    int4_folder = next(p for p in tmp_path.iterdir() if "int4" in p.name)
    assert isinstance(Checkpoint(int4_folder).matrix("model.layers.1.mlp.experts.0.up_proj.weight"), Int4Matrix)
    assert not isinstance(Checkpoint(fp8_folder).matrix("model.layers.1.mlp.experts.0.up_proj.weight"), Int4Matrix)
    assert any("with INT4 experts" in line for line in said)


@pytest.mark.parametrize(("tokens", "cache", "what"), [(6, 0, "prefill 6 tokens (6.0 per expert)"),
                                                       (1, 5, "decode 1 token, 5-position cache")])
def test_the_layers_in_turn_are_the_fp8_and_the_int4_layer_on_the_same_tokens(tmp_path, monkeypatch, tokens, cache,
                                                                             what):
    from stepper.model import Transformer

    small = checkpoints.bench_config("tiny", 4)
    fp8 = checkpoints.ensure_checkpoint(tmp_path, small, range(1, 2))
    int4 = checkpoints.ensure_checkpoint(
        tmp_path, dataclasses.replace(layers.requantized(small, "int4"), name="tiny-4-int4"), range(1, 2))
    outputs = []

    def once_each(first, second, pairs, warmed):
        outputs.extend([first(), second(), first()])
        warmed()
        return 1.25, 2.0, 2.5

    monkeypatch.setattr(layers, "paired_times", once_each)
    [figure] = layers.layers_in_turn(str(fp8), str(int4), tokens=tokens, cache=cache, pairs=3)
    assert (figure.value, figure.unit) == (1.25, "x")
    assert figure.name == f"tiny-4-experts-layers1-1-seed0 layer 1, {what}, in turn: INT4 experts / FP8 experts"
    assert figure.note.startswith("median of 3 ratios, taken in turn after one of each; medians 2.5 s against 2 s; ")
    assert figure.note.endswith(" pages read from disk while timed")
    # the first is the FP8 layer, the second the INT4 one: each equal to that checkpoint's own layer on the same
    # inputs, and the same again on a second call (a fresh cache each time)
    rng = np.random.default_rng(7)
    hidden = rng.standard_normal((1, tokens, small.hidden_size), dtype=np.float32)
    latent = rng.standard_normal((1, cache, small.kv_lora_rank), dtype=np.float32)
    k_pe = rng.standard_normal((1, 1, cache, small.qk_rope_head_dim), dtype=np.float32)
    for checkpoint, out in zip((fp8, int4), outputs):
        model = Transformer(layers.Checkpoint(checkpoint))
        kv = layers.KVCache(small.num_hidden_layers)
        kv.layers[1].extend_latent(latent, k_pe)
        rope = model.rope(cache + np.arange(tokens), layers.Emitter())
        expected = model.layer(1, hidden, rope, kv, layers.Emitter(), "absorb" if cache else "naive")
        np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(outputs[0], outputs[2])
    assert not np.array_equal(outputs[0], outputs[1])  # FP8 and INT4 weights differ


def test_the_indexer_scenario_times_the_indexer_the_attention_and_the_layer_of_a_small_v32(tmp_path):
    said = []
    figures = runner.indexer_figures(tmp_path, said.append, model="tiny-v32", tokens=24, repeat=1)
    assert [f.name.partition(" ")[2] for f in figures] == [  # after the checkpoint's name
        "layer 0: prefill 24 tokens, its Lightning Indexer",
        "layer 0: prefill 24 tokens, its attention under the indexer's mask",
        "layer 0: prefill 24 tokens, the whole layer (indexer, attention, FFN)",
    ]
    assert all(f.value > 0 and f.unit == "s" for f in figures) and "4 of up to 24 positions kept" in figures[0].note
    assert said[-1] == "tiny-v32 layer 0: prefill 24 tokens, the indexer apart from the attention"


def test_the_expert_scenario_times_one_expert_of_each_checkpoint_in_turn(tmp_path, monkeypatch):
    from stepper.model.ops import swiglu
    from stepper.presets import preset
    from stepper.weights.seeded import SyntheticWeights
    from stepper.weights.stored import Fp8Matrix, Int4Matrix
    from stepper.weights.synth_checkpoint import requantized, synth_checkpoint

    fp8 = synth_checkpoint(SyntheticWeights(preset("tiny")), tmp_path / "fp8", range(1, 2))
    int4 = synth_checkpoint(SyntheticWeights(requantized(preset("tiny"), "int4")), tmp_path / "int4", range(1, 2))
    kinds = []
    monkeypatch.setattr(layers, "swiglu", lambda x, *ws: kinds.append({type(w) for w in ws}) or swiglu(x, *ws))
    [figure] = layers.expert_products(str(fp8), str(int4), tokens=3, pairs=2)
    assert figure.name.endswith(" layer 1, one routed expert, 3 token(s): INT4 / FP8") and figure.unit == "x"
    assert figure.value > 0 and "median of 2 ratios" in figure.note
    fp8_run, int4_run = {Fp8Matrix}, {Int4Matrix}  # one untimed run of each, then two pairs in turn
    assert kinds == [fp8_run, int4_run, fp8_run, int4_run, int4_run, fp8_run]
def test_the_shown_prefill_runs_in_chunks_and_shows_what_the_whole_prompt_would(monkeypatch):
    from stepper.views import summary

    monkeypatch.setattr(long_context, "gemm_rate", lambda: 1e9)
    seen = {}

    def shown(event) -> None:
        seen[event.name] = summary.stats(event.array)

    monkeypatch.setattr(long_context, "shown_like_run", shown)
    [prefill] = long_context.attention_run("tiny", tokens=300, cache=0, attn="absorb", shown=True, repeat=1, chunk=128)
    assert "every tensor shown" in prefill.note
    assert prefill.note.endswith("in chunks of 128 positions")
    weights = seen["self_attn.attn_weights"]
    assert weights.finite == 4 * 300 * 300 and weights.sum == pytest.approx(4 * 300)  # every row's weights, whole
    assert seen["self_attn.q_nope_absorbed"].finite == 4 * 300 * 128


def test_a_layer_floor_counts_the_weights_decoded_and_the_flops_at_the_ceilings_of_the_run():
    from stepper.presets import preset

    cfg = preset("tiny")
    ceil = ceilings.Ceilings(fp8=2e6, gemm=1e9, cores=2)
    shapes = ceilings.layer_shapes(cfg, 1)
    matrices = {n: s[0] * s[1] for n, s in shapes.items() if len(s) == 2 and ".gate.weight" not in n}
    routed = sum(v for n, v in matrices.items() if ".experts." in n)
    rest, k, n = sum(matrices.values()) - routed, cfg.num_experts_per_tok, cfg.n_routed_experts
    floor, how = ceilings.layer_floor(cfg, 1, 1, 10, ceil)  # one token uses k experts (a floor from given rates)
    flops = 2 * (rest + routed / n * k) + ceilings.core_flops(cfg, 1, 10, "absorb")
    assert floor == pytest.approx((rest + routed / n * k) / 2e6 + flops / 1e9)
    assert "on 2 cores at once" in how
    floor, _ = ceilings.layer_floor(cfg, 1, 10_000, 0, ceil)  # so many tokens choose every expert
    flops = 2 * 10_000 * (rest + routed / n * k) + ceilings.core_flops(cfg, 10_000, 0, "naive")
    assert floor == pytest.approx((rest + routed) / 2e6 + flops / 1e9)


def test_figures_print_their_ratio_to_the_floor_and_the_machine_names_its_blas_and_features(monkeypatch):
    from stepper.cli.bench import against_floor

    figure = figs.Figure("layer", 0.3, "s", floor=0.2, floor_note="decoding")
    assert figure.ratio() == pytest.approx(1.5)
    assert against_floor(figure) == "  = 1.50x its floor 0.2 s (decoding)"
    assert against_floor(figs.Figure("bandwidth", 20.0, "GB/s")) == ""
    held = figs.anchored([figure, figs.Figure("ratio", 0.9, "x")], "no slower")
    assert [f.floor for f in held] == [0.2, 1.0]
    rates = [figs.Figure(ceilings.GEMM_CEILING, 200.0, "GFLOP/s"),
             figs.Figure(ceilings.FP8_CEILING, 1.5, "G weights/s"),
             figs.Figure(ceilings.FP8_EVERY_CORE, 2.5, "G weights/s")]
    measured = ceilings.Ceilings.of(rates)
    assert (measured.fp8, measured.gemm) == (2.5e9, 200e9)  # the floors use every core's rate, measured at once
    described = ceilings.machine()
    assert "BLAS: " in described and "CPU features: " in described and "L2 " in described
    monkeypatch.setattr(ceilings.fp8_tiles, "part_rows", lambda rows, width: 32)
    assert ceilings.machine().endswith("FP8 blocks [128, 7168] decoded in parts of 32 rows, half the L2 (measured "
                                       "faster here)")
    monkeypatch.setattr(ceilings.fp8_tiles, "part_rows", lambda rows, width: rows)
    assert "FP8 blocks [128, 7168] decoded whole" in ceilings.machine()
    monkeypatch.setattr(ceilings.fp4_tiles, "subnormals_slow", lambda: True)
    assert "; FP4 tiles normalized (float32 subnormals measured slow here); FP8 blocks" in ceilings.machine()
    monkeypatch.setattr(ceilings.fp4_tiles, "subnormals_slow", lambda: False)
    assert "; FP4 tiles by the bit trick alone (float32 subnormals measured fast enough here)" in ceilings.machine()


def test_the_least_time_against_transformers_is_made_of_the_rates_measured_in_the_same_process(monkeypatch):
    """The 16-expert comparison's floor: the FP8 weights of the experts chosen and the rest decoded
    at one core's FP8 rate on every core, and each product at stepper's own GEMM rate on its tiles
    by the columns it gets, padded as stepper pads them: each expert its own tokens, the rest every
    token (one rate timed per count of columns), every core."""
    from stepper.bench import transformers_pair
    from stepper.presets import preset

    cfg = preset("tiny")  # 32 experts, 4 a token
    timed = []
    monkeypatch.setattr(transformers_pair, "fp8_rate", lambda: [figs.Figure("fp8", 0.5, "G weights/s")])
    monkeypatch.setattr(transformers_pair.parallel, "cores", lambda: 2)

    def gemm_time(fn, repeat):
        fn()
        timed.append(repeat)
        return 0.001 * len(timed)  # each count of columns its own rate

    monkeypatch.setattr(transformers_pair, "median_time", gemm_time)
    floor, how = transformers_pair.least_time(cfg, 16, [3, 8, 9, 20, 24])  # made of the rates given, not timed
    assert timed == [9, 9, 9]  # 8 (3 and 8, padded), 16 (9 and the 16 tokens), 24 (20, 24): one rate each
    rest, per_expert = ceilings.layer_weights(cfg, 1)
    rate = {c: 2 * 128 * cfg.hidden_size * c / (0.001 * (i + 1)) for i, c in enumerate([8, 16, 24])}
    products = (2 * per_expert * (3 / rate[8] + 8 / rate[8] + 9 / rate[16] + 20 / rate[24] + 24 / rate[24])
                + (2 * 16 * rest + ceilings.core_flops(cfg, 16, 0, "naive")) / rate[16])
    assert floor == pytest.approx((rest + 5 * per_expert) / (2 * 0.5e9) + products / 2)
    assert f"{(rest + 5 * per_expert) / 1e6:,.0f} M FP8 weights at 1.00 G/s on 2 cores at once" in how
    assert "5 experts' tokens 3-24" in how and f"8: {rate[8] / 1e9:.0f}, 16: {rate[16] / 1e9:.0f}, 24:" in how


def test_an_expert_s_tokens_are_those_its_router_gave_it():
    """The floor's counts come from the layer's own router: one per expert it chose, none for the
    others, summing to tokens x top-k."""
    from stepper.bench.transformers_pair import expert_tokens
    from stepper.model import Transformer
    from stepper.presets import preset
    from stepper.seams.trace import Emitter
    from stepper.weights.seeded import SyntheticWeights

    cfg = preset("tiny")  # 32 experts, 4 a token
    model = Transformer(SyntheticWeights(cfg, 0))
    hidden = np.random.default_rng(3).standard_normal((1, 6, cfg.hidden_size), dtype=np.float32)
    seen = {}

    def keep(event):
        seen[event.key] = np.array(event.array)

    emit = Emitter([keep])
    model.layer(1, hidden, model.rope(np.arange(6), emit), None, emit, "naive")
    chosen = seen["mlp.gate.topk_idx"].reshape(6, cfg.num_experts_per_tok)
    expected = [sum(int(e in row) for row in chosen) for e in sorted(set(chosen.ravel().tolist()))]
    counts = expert_tokens(model, hidden)
    assert counts == expected and sum(counts) == 6 * 4 and len(counts) < 24  # some experts chosen twice or more


def test_the_floors_tiles_are_those_stepper_multiplies():
    """One scale block of rows up to as many tokens as a block has rows; past that, tall tiles of
    TALL_TILE_BYTES (fp8_tiles.apply_tiles), whole blocks."""
    from stepper.bench.transformers_pair import tile_rows
    from stepper.kernels.fp8_tiles import TALL_TILE_BYTES
    from stepper.presets import preset

    cfg = preset("kimi-k2")
    assert tile_rows(cfg, 1) == tile_rows(cfg, 128) == 128
    assert TALL_TILE_BYTES == 1 << 25  # 2^25 // (4 * 7168 * 128) = 9 blocks
    assert tile_rows(cfg, 129) == tile_rows(cfg, 4096) == 9 * 128


@pytest.mark.parametrize("args, problem", [(["nosuch"], "no scenario 'nosuch'; "), (["fp8_rate", "{x"], "not JSON"),
                                           (["fp8_rate", '{"x": 1}'], "unexpected keyword argument 'x'"), ([], "")])
def test_a_scenario_asked_for_wrongly_gets_one_line_of_usage_and_exit_2(args, problem):
    """`python -m stepper.bench` is how the bench runs each scenario in its own process; typed by
    hand with a wrong name or arguments it says so in one line, no traceback."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "stepper.bench", *args], check=False, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert problem in line and "usage: python -m stepper.bench SCENARIO" in line and "layers_in_turn" in line


@pytest.mark.parametrize("v4", [False, True], ids=["default", "v4"])
def test_a_work_folder_that_cannot_be_written_is_refused_before_anything_is_measured(tmp_path, monkeypatch, v4):
    """A file where the folder should be was refused only after the ceilings' measuring (seconds),
    when the first checkpoint was written; now before any scenario runs."""
    from helpers.cli import one_line, stepper

    def measured(*args, **kwargs):
        raise AssertionError("measured before the work folder was checked")

    monkeypatch.setattr(figs, "in_subprocess", measured)
    monkeypatch.setattr(runner, "in_subprocess", measured)
    (tmp_path / "taken").write_text("a file of the user's\n")
    out = stepper("bench", "--workdir", "taken", *(["--v4"] if v4 else []), cwd=tmp_path)
    assert one_line(out) == "stepper: error: taken: is not a folder; stepper does not write through it"
    assert (tmp_path / "taken").read_text() == "a file of the user's\n"


@pytest.mark.parametrize("args, line", [
    (["--long-model", "deepseek-v3"], "--long-model deepseek-v3 is the model --long measures: add --long"),
    (["--v4", "--long-model", "kimi-k2"], "--long-model kimi-k2 is the model --long measures: add --long"),
    (["--long", "--v4"], "--long is a run of its own: leave out --v4"),
    (["--long", "--kda", "--workdir", "w"], "--long is a run of its own: leave out --kda and --workdir"),
    (["--v4-hca", "--indexer"], "--v4-hca is a run of its own: leave out --indexer"),
])
def test_options_the_chosen_run_would_not_read_are_refused_before_it_starts(tmp_path, monkeypatch, args, line):
    """`bench --long-model deepseek-v3` ran the default bench (minutes, 20 GB written) and measured no
    DeepSeek-V3; --long beside --v4 ran --long alone, --v4 beside --kda no KDA layer."""
    from helpers.cli import one_line, stepper

    def ran(*args, **kwargs):
        raise AssertionError("a run started")

    for module, name in ((runner, "run_all"), (long_context, "long_context"), (v4_layer, "v4_figures")):
        monkeypatch.setattr(module, name, ran)
    assert one_line(stepper("bench", *args, cwd=tmp_path)) == f"stepper: error: {line}"
    assert list(tmp_path.iterdir()) == []
