"""Figures as a user reads them: a tensor none of whose values is finite has no sum (nan, as its
mean), and the cache's sizes are in GiB, the unit its limit is set in; its checkpoints' names whole."""

import json

from helpers.cli import stepper
from helpers.terminal import on_terminal

from stepper.tensors.statistics import Gather
from stepper.weights.remote import human

ALL_NAN = ("run", "--layers", "0:1", "--only", "layers.0.input_layernorm", "--patch", "layers.0.input_layernorm=x*nan")


def test_an_all_nan_tensor_shows_nan_for_its_sum_as_for_its_mean():
    """On screen: no figure beside the counts (not "min nan ... nan 0" of an all-inf tensor); in
    JSON: every figure null."""
    plain = stepper(*ALL_NAN, "--plain")
    assert plain.returncode == 0, plain.stderr
    (row,) = [line.strip() for line in plain.stdout.splitlines() if line.lstrip().startswith("no finite values")]
    assert row == "no finite values  nan 2,240  inf 0"
    as_json = json.loads(stepper(*ALL_NAN, "--json").stdout.splitlines()[0])["stats"]
    assert as_json["sum"] is None and as_json["mean"] is None and as_json["nan"] == 7 * 320


def test_no_finite_value_gives_a_nan_sum_and_finite_ones_their_sum():
    import numpy as np

    gathered = Gather()
    gathered.add(np.array([np.inf, -np.inf, np.nan], np.float32))
    st = gathered.stats()
    assert np.isnan(st.sum) and np.isnan(st.mean) and (st.nan, st.inf, st.finite) == (1, 2, 0)
    gathered.add(np.array([1.5, 2.0], np.float32))
    assert gathered.stats().sum == 3.5


def test_cache_ls_says_the_limit_in_the_gib_it_is_set_in(tmp_path):
    env = {"STEPPER_CACHE_DIR": str(tmp_path), "STEPPER_CACHE_MAX_GB": None}
    listed = stepper("cache", "ls", "--plain", env=env)
    assert listed.returncode == 0 and listed.stdout == f"0 B kept in {tmp_path} (at most 100.0 GiB)\n"
    listed = stepper("--cache-max-gb", "1.5", "cache", "ls", "--plain", env=env)
    assert listed.stdout == f"0 B kept in {tmp_path} (at most 1.5 GiB)\n"
    assert [human(n) for n in (512, 3 << 10, 5 << 20, 100 << 30)] == ["512 B", "3.0 KiB", "5.0 MiB", "100.0 GiB"]


def test_cache_ls_names_each_checkpoint_whole_as_cache_clear_takes_it(tmp_path):
    """A Hub checkpoint's folder (ORG/NAME and a 40-digit commit) is wider than 80 columns leave it
    beside the other columns: it was cut with an ellipsis, on a terminal and in a pipe."""
    name = "hf/moonshotai/Kimi-K2-Instruct/" + "0123456789abcdef" * 2 + "01234567"
    ledgers = tmp_path / name / ".stepper"
    ledgers.mkdir(parents=True)
    (ledgers / "config.json.json").write_text(json.dumps({"used": 1.7e9, "chunks": [[0, 1000, "0" * 64]]}))
    env = {"STEPPER_CACHE_DIR": str(tmp_path)}
    piped = stepper("cache", "ls", env=env)
    assert piped.returncode == 0 and name in piped.stdout.splitlines()[1].split(), piped.stdout
    screen = on_terminal("cache", "ls", columns=80, env=env)
    assert screen.code == 0 and name in screen.lines, screen.text
