"""Every integer of a config.json has a bound, so an absurd one (10^9 experts, layers or vocabulary
entries) is refused in one line naming the field, before it sizes any work: never a list of 10^9
expert names built, nor a loop over 10^9 layers (each of these took minutes and gigabytes)."""

import json

import pytest
from helpers.cli import refused, stepper

from stepper.config import MAX_COUNT, MAX_SIZE
from stepper.presets import PRESETS, V4_PRESETS

CASES = [
    ("tiny", "n_routed_experts", MAX_COUNT), ("tiny", "num_hidden_layers", MAX_COUNT),
    ("tiny", "vocab_size", MAX_SIZE), ("tiny", "hidden_size", MAX_SIZE),
    ("tiny-kimi-linear", "num_experts", MAX_COUNT), ("tiny-kimi-linear", "num_hidden_layers", MAX_COUNT),
    ("tiny-longcat", "n_routed_experts", MAX_COUNT), ("tiny-longcat", "num_layers", MAX_COUNT),
    ("tiny-minicpm3", "vocab_size", MAX_SIZE), ("tiny-mistral4", "num_attention_heads", MAX_COUNT),
    ("tiny-v4", "n_routed_experts", MAX_COUNT), ("tiny-v4", "num_hidden_layers", MAX_COUNT),
    ("tiny-v4", "vocab_size", MAX_SIZE),
]


@pytest.mark.parametrize("name, field, limit", CASES)
def test_a_count_or_size_past_its_bound_is_refused_naming_the_field(tmp_path, name, field, limit):
    raw = {**PRESETS.get(name, V4_PRESETS.get(name)), field: 10**9}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert refused(stepper("run", "--model", tmp_path / "config.json")) == (
        f"{tmp_path / 'config.json'}: field '{field}' must be <= {limit:,}, got 1,000,000,000")


HUGE_VALUES = [  # a value no field could be, of every JSON kind, each far longer than a line
    ("tiny", "hidden_size", list(range(100_000)), "got [0, 1, 2, 3, 4, 5, ...]"),
    ("tiny", "model_type", "x" * 100_000, "got 'xxxxxxxxxxxx"),
    ("tiny", "rope_scaling", [[list(range(1000))] * 100], "got [[[0, 1, 2, 3, 4, 5, ...], "),
    ("tiny-kimi-linear", "num_key_value_heads", {str(i): i for i in range(100_000)}, "got {'0': 0, '1': 1, "),
    ("tiny-longcat", "zero_expert_num", "1" * 100_000, "got '111111111111"),
    ("tiny-mistral4", "moe_layer_freq", list(range(100_000)), "got [0, 1, 2, 3, 4, 5, ...]"),
    ("tiny-v4", "compress_ratios", [list(range(100_000))] * 5, ("[0]' must be 0 (sliding), 4 (CSA) or another "
                                                                "ratio >= 2 (HCA; published: 128), got [0, 1, 2, 3, "
                                                                "4, 5, ...]")),
    ("tiny-v4", "hc_eps", "e" * 100_000, "got 'eeeeeeeeeeee"),
]


@pytest.mark.parametrize("name, field, value, shown", HUGE_VALUES)
def test_a_huge_value_is_shown_cut_in_its_one_line(tmp_path, name, field, value, shown):
    """A config value is shown in its refusal as a few of its items or the ends of its text: a list
    of 100,000 numbers in hidden_size made a line of 690,000 characters."""
    raw = {**PRESETS.get(name, V4_PRESETS.get(name)), field: value}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    line = refused(stepper("run", "--model", tmp_path / "config.json"))
    assert line.startswith(f"{tmp_path / 'config.json'}: field '{field}") and shown in line
    assert len(line) < len(str(tmp_path)) + 400


def test_the_bounds_are_far_above_every_published_model():
    """The largest counts and sizes of the presets (the published configs) sit well inside the bounds."""
    every = [*PRESETS.values(), *V4_PRESETS.values()]
    counts = ("num_hidden_layers", "n_routed_experts", "num_experts", "num_attention_heads")
    assert max(raw.get(k, 0) for raw in every for k in counts) * 64 < MAX_COUNT
    sizes = ("vocab_size", "hidden_size", "intermediate_size")
    assert max(raw.get(k, 0) for raw in every for k in sizes) * 16 < MAX_SIZE


@pytest.mark.parametrize("option, value", [("--prompt-len", 10**9), ("--decode", 10**8), ("--cache-len", 10**8)])
def test_a_length_past_any_context_is_refused_before_its_tokens_are_drawn(tmp_path, option, value):
    """With a config whose max_position_embeddings allows it, 10^9 prompt tokens were drawn as
    Python ints (tens of GB) before the run's memory was estimated."""
    raw = {**PRESETS["tiny"], "max_position_embeddings": 10**12}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    args = ["run", "--model", tmp_path / "config.json", "--layer", "1", option, str(value)]
    assert refused(stepper(*args)) == f"{option} must be at most 16,777,216 positions, got {value:,}"


def _theta(name: str, field: str, value: float) -> dict:
    """The preset with a rotary base set where its config.json keeps it (Mistral 4: in rope_parameters)."""
    raw = {**PRESETS.get(name, V4_PRESETS.get(name))}
    if field == "rope_parameters.rope_theta":
        raw["rope_parameters"] = {**raw["rope_parameters"], "rope_theta": value}
    else:
        raw[field] = value
    return raw


@pytest.mark.parametrize("name, field, value", [
    ("tiny", "rope_theta", 1.0), ("tiny", "rope_theta", 1e-300), ("tiny-glm4-flash", "rope_theta", 0.5),
    ("tiny-minicpm3", "rope_theta", 1.0), ("tiny-mistral4", "rope_parameters.rope_theta", 1.0),
    ("tiny-v4", "rope_theta", 1.0), ("tiny-v4", "compress_rope_theta", 1.0), ("tiny-v4", "compress_rope_theta", 1e-300),
])
def test_a_rotary_base_that_makes_no_table_is_refused_naming_the_field(tmp_path, name, field, value):
    """rope_theta 1 divided by log(1) in YaRN's correction range (a ZeroDivisionError traceback);
    1e-300 made NaN tables."""
    (tmp_path / "config.json").write_text(json.dumps(_theta(name, field, value)))
    where, _, short = field.rpartition(".")
    at = f"{tmp_path / 'config.json'}: {where + ': ' if where else ''}"
    assert refused(stepper("run", "--model", tmp_path / "config.json", "--layer", "1")) == (
        f"{at}field '{short}' must be > 1 (the rotary base: frequencies are base^(-2i/dim)), got {value!r}")


def test_a_v4_compress_ratio_past_any_window_is_refused_before_its_ape_is_made(tmp_path):
    """2**40 was taken: the run of a config.json made a 64 TiB ape (NumPy's out-of-memory line)."""
    raw = {**V4_PRESETS["tiny-v4"], "max_position_embeddings": 1 << 40, "compress_ratios": [0, 4, 1 << 40, 4, 0]}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert refused(stepper("run", "--model", tmp_path / "config.json", "--layer", "2")) == (
        f"{tmp_path / 'config.json'}: field 'compress_ratios[2]' must be <= {MAX_SIZE:,}, got {1 << 40:,}")


@pytest.mark.parametrize("name", ["tiny", "tiny-kimi-linear", "tiny-v4"])
@pytest.mark.parametrize("eps", [1.0, 1e300])
def test_an_rms_norm_eps_as_large_as_a_mean_square_is_refused(tmp_path, name, eps):
    """rms_norm_eps 1e300 made every norm's output about 0, exit 0."""
    (tmp_path / "config.json").write_text(json.dumps({**PRESETS.get(name, V4_PRESETS.get(name)), "rms_norm_eps": eps}))
    assert refused(stepper("run", "--model", tmp_path / "config.json")) == (
        f"{tmp_path / 'config.json'}: field 'rms_norm_eps' must be < 1, got {eps:g}")


@pytest.mark.parametrize("name", ["tiny", "tiny-v4"])
def test_a_yarn_beta_fast_below_beta_slow_is_refused(tmp_path, name):
    raw = {**PRESETS.get(name, V4_PRESETS.get(name))}
    raw["rope_scaling"] = {**raw["rope_scaling"], "beta_fast": 0.5, "beta_slow": 2.0}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert refused(stepper("run", "--model", tmp_path / "config.json")) == (
        f"{tmp_path / 'config.json'}: field 'rope_scaling.beta_fast' must be >= beta_slow (2): YaRN keeps the pairs "
        "turning more than beta_fast times in the original context, got 0.5")
