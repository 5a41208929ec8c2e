"""Tensors too large to hold, shown without being held (stepper.tensors.tiled): their statistics and
histogram bins are exactly those of the whole array, gathered a tile at a time; the heat map is
pooled tile by tile into the same cells; a slice computes only that slice; a dump writes them
tile by tile; they cannot be replaced."""

from fractions import Fraction
from io import StringIO

import numpy as np
import pytest
from rich.console import Console

from stepper.seams.trace import Emitter
from stepper.tensors import statistics, tiled
from stepper.tensors.tiled import Tiled
from stepper.views import attention_map, histogram_picture, summary
from stepper.views.debugger import take
from stepper.views.dump import write_dump
from stepper.weights.safetensors_reader import SafetensorsFile


class Counted:
    """A Tiled over an array, counting the query rows each tile computes."""

    def __init__(self, array):
        self.array, self.rows = array, 0
        self.tensor = Tiled(array.shape, self.tile)

    def tile(self, heads, queries):
        self.rows += (heads.stop - heads.start) * (queries.stop - queries.start)
        return self.array[:, heads, queries].copy()


def attention_like(rng, shape=(2, 3, 37, 41)):
    """Scores-like values: spread, some -inf (masked), a NaN, a subnormal, a huge one."""
    a = (rng.standard_normal(shape) * 7).astype(np.float32)
    a[..., 30:] = -np.inf
    a[0, 1, 2, 3] = np.nan
    a[1, 2, 5, 6] = np.float32(1e-42)
    a[1, 0, 7, 8] = np.float32(3e37)
    return a


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(tiled, "TILE_VALUES", 100)  # tiles of 2 query rows of 41 keys
    monkeypatch.setattr(statistics, "CHUNK", 29)  # chunks cut across the tiles' rows


def test_indexing_computes_only_the_rows_it_touches_and_equals_the_array():
    a = attention_like(np.random.default_rng(0))
    counted = Counted(a)
    for index in [(0, 1, 2), (1, slice(None), -1), (..., 3), (0, slice(0, 2), slice(3, 9, 2), slice(None, None, -3)),
                  1, (0, 2, 36, 40), (slice(None), slice(None, None, -1), -2)]:
        assert np.array_equal(counted.tensor[index], a[index], equal_nan=True)
    counted.rows = 0
    assert np.array_equal(counted.tensor[0, 2, 5:8], a[0, 2, 5:8])
    assert counted.rows == 3  # one head's three rows, not the tensor
    assert np.array_equal(take(counted.tensor, "[1, 0, 7, :4]"), a[1, 0, 7, :4])
    with pytest.raises(TypeError):
        counted.tensor[[0, 1]]


def test_tiles_are_the_tensor_in_c_order_and_asarray_is_the_whole(small_tiles):
    rng = np.random.default_rng(1)
    for a in (attention_like(rng),
              rng.standard_normal((1, 5, 1, 30)).astype(np.float32)):  # prefill; decode: heads together
        counted = Counted(a)
        tiles = list(counted.tensor.tiles())
        assert np.array_equal(np.concatenate([b.ravel() for b in tiles]), a.ravel(), equal_nan=True)
        assert max(b.size for b in tiles) <= 100 and counted.rows == a.shape[0] * a.shape[1] * a.shape[2]
        assert np.array_equal(np.asarray(counted.tensor), a, equal_nan=True)
    assert len(tiles) == 2  # 3 heads, then 2


def test_a_tiled_tensor_may_have_more_trailing_dims(small_tiles):
    """[B, H, T, K, V] (a KDA layer's states after every token): indexed, tiled and read whole as the array."""
    a = np.random.default_rng(7).standard_normal((2, 3, 9, 4, 5)).astype(np.float32)
    counted = Counted(a)
    for index in [(0, 1, 2), (1, slice(None), -1, 3), (..., 2), (0, 2, slice(3, 8, 2), slice(None), 4), (..., 1, 2)]:
        assert np.array_equal(counted.tensor[index], a[index])
    counted.rows = 0
    assert np.array_equal(counted.tensor[1, 2, 4:6], a[1, 2, 4:6]) and counted.rows == 2
    tiles = list(counted.tensor.tiles())
    assert max(b.size for b in tiles) <= 100 and np.array_equal(np.concatenate([b.ravel() for b in tiles]), a.ravel())
    assert np.array_equal(np.asarray(counted.tensor), a)
    with pytest.raises(IndexError, match="too many indices for a tensor of 5 dimensions"):
        counted.tensor[0, 0, 0, 0, 0, 0]


def test_streamed_statistics_and_histogram_equal_the_whole_arrays_exactly(small_tiles):
    a = attention_like(np.random.default_rng(2))
    whole, streamed = summary.stats(a), summary.stats(Counted(a).tensor)
    assert streamed == whole  # every figure, to the bit
    assert summary.histogram(Counted(a).tensor) == summary.histogram(a)  # the bins too
    assert summary.corners(Counted(a).tensor) == summary.corners(a)


def test_the_statistics_are_the_exact_figures():
    a = attention_like(np.random.default_rng(3))
    finite = a[np.isfinite(a)].astype(np.float64)
    st = summary.stats(a)
    exact = sum(Fraction(v) for v in finite.tolist())
    assert st.sum == float(exact) and st.mean == float(exact / finite.size)
    assert st.std == pytest.approx(float(finite.std()), rel=1e-12)
    assert (st.min, st.max, st.absmax) == (finite.min(), finite.max(), np.abs(finite).max())
    assert (st.nan, st.inf, st.finite) == (1, int(np.isinf(a).sum()), finite.size)
    counts, edges = summary.look(a)[1].view(summary.BINS)
    assert counts.tolist() == np.histogram(finite, bins=edges)[0].tolist()
    width = edges[1] - edges[0]  # the bins start at or below the min and end past the max, by less than one
    assert edges[0] <= finite.min() < edges[0] + width and edges[-1] - width <= finite.max() < edges[-1]
    assert summary.histogram(a) == (counts.tolist(), edges[0], edges[-1])


def test_any_chunking_gives_the_same_figures(monkeypatch):
    a = np.random.default_rng(4).standard_normal(1000).astype(np.float32) * np.float32(1e5)
    whole = summary.stats(a)
    for chunk in (1, 7, 64, 999):
        monkeypatch.setattr(statistics, "CHUNK", chunk)
        assert summary.stats(a) == whole


def rendered(picture, width):
    console = Console(width=width, file=StringIO(), record=True, no_color=True)
    console.print(picture)
    return console.export_text()


@pytest.mark.parametrize("width", [80, 200])
def test_the_heat_map_and_histogram_of_a_tiled_tensor_are_those_of_the_array(width, small_tiles):
    rng = np.random.default_rng(5)
    weights = rng.random((1, 3, 103, 77)).astype(np.float32)
    weights[0, 1, 5, 7] = np.nan
    weights[0, 0, :, 60:] = 0
    for a in (weights, weights[:, :, :1]):  # a prefill, pooled; a decode step, as bars
        counted = Counted(a)
        drawn = rendered(attention_map.attention_heatmap(counted.tensor), width)
        assert drawn == rendered(attention_map.attention_heatmap(a), width)
        assert counted.rows <= 4 * a.shape[2]  # the drawn heads' rows only, each once
    histogram = histogram_picture.histogram
    assert rendered(histogram(Counted(weights).tensor), width) == rendered(histogram(weights), width)


def test_a_dump_writes_a_tiled_tensor_tile_by_tile(tmp_path, small_tiles):
    from stepper.seams.trace import Recorder

    a = attention_like(np.random.default_rng(6))
    recorder = Recorder()
    emit = Emitter([recorder])
    emit("self_attn.attn_scores", Counted(a).tensor)
    emit("self_attn.k_pe", a[:, :1, :, :4].copy())
    path = tmp_path / "d.safetensors"
    write_dump(path, recorder, {})
    with SafetensorsFile(path) as f:
        assert np.array_equal(np.asarray(f.get("self_attn.attn_scores")), a, equal_nan=True)
        assert np.array_equal(np.asarray(f.get("self_attn.k_pe")), a[:, :1, :, :4], equal_nan=True)


def test_a_tiled_tensor_cannot_be_replaced():
    t = Counted(attention_like(np.random.default_rng(7))).tensor
    with pytest.raises(ValueError, match="made a tile at a time"):
        Emitter([lambda e: np.zeros(e.array.shape, np.float32)])("self_attn.attn_scores", t)
    assert Emitter([lambda e: None])("self_attn.attn_scores", t) is t


def cli(*args):
    from typer.testing import CliRunner

    from stepper.cli.main import app

    return CliRunner().invoke(app, list(args))


def test_run_dumps_attention_made_in_tiles_as_the_whole_arrays_would_be(tmp_path, monkeypatch):
    from stepper.kernels import attention

    args = ["run", "--layer", "0", "--prompt-len", "9", "--start-pos", "5000", "--only", "*attn_*", "--plain"]
    assert cli(*args, "--dump", str(tmp_path / "whole.safetensors")).exit_code == 0
    monkeypatch.setattr(attention, "WHOLE_SCORES", 0)
    result = cli(*args, "--dump", str(tmp_path / "tiled.safetensors"))
    assert result.exit_code == 0, result.output
    with SafetensorsFile(tmp_path / "whole.safetensors") as whole, \
            SafetensorsFile(tmp_path / "tiled.safetensors") as tiles:
        assert whole.names() == tiles.names()
        for name in whole.names():
            np.testing.assert_allclose(np.asarray(tiles.get(name)), np.asarray(whole.get(name)), rtol=1e-5, atol=1e-6)


def test_a_dump_past_the_limit_is_refused_in_one_line_before_the_run(tmp_path):
    out = tmp_path / "d.safetensors"
    result = cli("run", "--layer", "0", "--prompt-len", "300", "--only", "*attn_*", "--dump", str(out),
                 "--dump-limit-gb", "0.001")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines == [("stepper: error: --dump: layers.0.self_attn.attn_scores [1, 4, 300, 300] float32 is 0.00134 GiB "
                      "(and 1 more), over the dump limit of 0.001 GiB; raise it with --dump-limit-gb, or leave it out "
                      "with --only")]
    assert not out.exists()


def test_a_strided_view_is_gathered_in_pieces_without_a_whole_copy(monkeypatch):
    a = np.random.default_rng(8).standard_normal((3, 5, 7, 11)).astype(np.float32)
    view = a[:, :, 2:, :6]  # as q_nope is of q
    whole = summary.stats(np.ascontiguousarray(view))
    monkeypatch.setattr(statistics, "CHUNK", 13)
    pieces = list(statistics.pieces(view))
    assert max(p.size for p in pieces) <= 13 and sum(p.size for p in pieces) == view.size
    assert summary.stats(view) == whole
    assert summary.histogram(view) == summary.histogram(np.ascontiguousarray(view))


def test_the_exact_sum_is_exact_over_the_whole_float64_range():
    rng = np.random.default_rng(9)
    for values in (rng.standard_normal(500) * np.exp(rng.uniform(-700, 700, 500)),  # 2000 bits of range
                   np.array([5e-324, -5e-324, 1e-310, 1.7e308, -1.7e308, 3.0, 0.0, -0.0]),
                   np.exp(rng.uniform(-30, 0, 500)).astype(np.float32).astype(np.float64)):  # softmax-like
        assert Fraction(statistics.exact_sum(values),
                        2**statistics.EXACT_SHIFT) == sum(Fraction(v) for v in values.tolist())
