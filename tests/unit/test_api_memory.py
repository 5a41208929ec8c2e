"""What a diff of two runs and a patched run hold besides the runs' own tensors, in bytes
(tracemalloc, which NumPy reports its arrays to): a few blocks of the comparison and the copy a
patch function is given, not copies of the largest tensor many times over."""

import tracemalloc

import numpy as np
import pytest

import stepper
from stepper.fixtures.tensor_check import measure
from stepper.fixtures.tolerances import ATOL_PER_ABSMAX, BLOCK, RTOL

WEIGHTS = "layers.1.self_attn.attn_weights"  # [1, 4, 512, 512] float32: 4 MiB, the run's largest tensor
OPTIONS = {"prompt_len": 512, "attn": "naive", "chunk": 0}  # the same path whatever the machine's memory


def peak_bytes(call):
    """What `call` allocated at most beyond what was held before it, and its result."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = call()
        return tracemalloc.get_traced_memory()[1] - before, result
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def runs():
    kept = [WEIGHTS, "logits"]
    return (stepper.run("tiny", keep=kept, **OPTIONS),
            stepper.run("tiny", keep=kept, patch={"layers.0.self_attn.kv_a": "x*1.01"}, **OPTIONS))


def test_a_diff_holds_less_than_twice_its_largest_tensor_and_gives_the_whole_arrays_figures(runs):
    a, b = runs
    size = a[WEIGHTS].nbytes
    held, d = peak_bytes(lambda: stepper.diff(a, b))
    assert held < 2 * size, f"{held / 2**20:.1f} MiB to compare tensors of at most {size / 2**20:.0f} MiB"  # was 23x
    row = next(r for r in d.rows if r.name == WEIGHTS)
    ref, cand = a[WEIGHTS].astype(np.float64), b[WEIGHTS].astype(np.float64)
    err = np.abs(cand - ref)
    over = err - (float(np.float32(ATOL_PER_ABSMAX * np.abs(ref).max())) + RTOL * np.abs(ref))
    assert row.max_abs == err.max() and row.rel == err.max() / np.abs(ref).max()
    assert row.cosine == pytest.approx((cand * ref).sum() / np.linalg.norm(cand) / np.linalg.norm(ref), rel=1e-12)
    worst = ",".join(map(str, np.unravel_index(int(np.argmax(over)), ref.shape)))
    assert row.detail == f"{int((over > 0).sum())} of {ref.size} entries outside tolerance (worst at [{worst}])"


def test_a_patch_that_returns_none_holds_the_copy_it_was_given_and_no_more():
    kept = "layers.2.mlp_output"
    plain, _ = peak_bytes(lambda: stepper.run("tiny", keep=kept, **OPTIONS))
    looked, _ = peak_bytes(lambda: stepper.run("tiny", keep=kept, patch={WEIGHTS: lambda a, name: None}, **OPTIONS))
    copy = 4 * 512 * 512 * 4
    assert looked - plain < 1.5 * copy, f"{(looked - plain) / 2**20:.1f} MiB more than the plain run"  # was 3.7x


def test_measure_a_block_at_a_time_counts_and_places_as_over_the_whole_tensor():
    """A mask left off, a NaN and the worst entry each in another block, a lesser error after the
    worst: the figures and indices of the whole array."""
    ref = np.linspace(1, 2, 3 * BLOCK + 17).reshape(1, -1)
    ref[0, 5] = -np.inf
    cand = ref.copy()
    cand[0, 5] = 0.0  # a masked entry left unmasked, in the first block
    cand[0, BLOCK + 3] = np.nan  # in the second, and an infinity in the fourth
    cand[0, 3 * BLOCK + 5] = np.inf
    cand[0, 2 * BLOCK + 9] += 0.5  # the worst, in the third
    cand[0, 3 * BLOCK + 1] += 0.4  # in the fourth, not as bad
    cand[0, 7] += 1e-3
    m = measure(cand, ref, {"atol": 1e-6, "rtol": 1e-5})
    both = np.isfinite(ref) & np.isfinite(cand)
    err = np.abs(cand - ref)[both]
    assert (m["outside"], m["worst"], m["not_finite"]) == (6, [0, 2 * BLOCK + 9], 2)
    assert m["nonfinite"] == f"1 NaN and 1 inf where the reference is finite (first at [0,{BLOCK + 3}])"
    assert not m["same_nonfinite"] and not m["ok"]
    assert m["max_abs_err"] == err.max() and m["rel_err"] == err.max() / 2
    assert m["nmse"] == pytest.approx((err ** 2).sum() / (ref[both] ** 2).sum(), rel=1e-12)
