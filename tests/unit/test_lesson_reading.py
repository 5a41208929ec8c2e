"""Reading lesson answers (stepper.lessons.reading) and explaining wrong shapes (answers.why_shape):
property tests over the forms a learner writes, and every kind of shape mistake."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepper.lessons.answers import same, why_shape
from stepper.lessons.context import Context
from stepper.lessons.judge import judge
from stepper.lessons.reading import FORMS, parse_number, parse_set, parse_shape, read
from stepper.lessons.schema import Prediction
from stepper.presets import preset
from stepper.session import RunSpec, prepare

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True)


# ---------------------------------------------------------------------------------------------
# Numbers


@SETTINGS
@given(st.integers(0, 10**12))
def test_integers_with_thousands_separators_and_byte_units(n):
    for text in (f"{n}", f"{n:,}", f"{n:_}", f"{n:,} B", f"{n} bytes", f"≈ {n:,}", f"{n:,}B"):
        assert parse_number(text) == n, text


@SETTINGS
@given(st.integers(1024, 10**10), st.integers(1, 3), st.sampled_from([("KiB", 2**10), ("MiB", 2**20), ("kB", 1e3)]))
def test_a_size_in_larger_units_rounded_to_its_digits_is_right(n, digits, unit):
    name, size = unit
    if n < size:
        n = size + n  # at least 1 of the unit: two significant digits or more
    text = f"{n / size:.{digits}f} {name}"
    assert same("number", parse_number(text), n), text
    off = f"{n / size + 3 * 10**-digits:.{digits}f} {name}"  # three steps of the last digit away
    assert not same("number", parse_number(off), n), off


@SETTINGS
@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e30, max_value=1e30))
def test_decimal_and_scientific_forms(x):
    assert parse_number(repr(x)) == x
    assert math.isclose(parse_number(f"{x:e}"), x, rel_tol=1e-6, abs_tol=1e-300)
    assert math.isclose(parse_number(f"{x:g}x"), x, rel_tol=1e-5, abs_tol=1e-300)


@SETTINGS
@given(st.integers(0, 999), st.integers(0, 999))
def test_two_numbers_or_a_range_are_not_one_number(a, b):
    for text in (f"{a} {b}", f"{a}, {b}", f"{a}-{b}", f"{a}–{b}", f"{a},{b % 100:02d}"):
        value, why = read("number", text)
        assert value is None and FORMS["number"] in why, text
    assert parse_number(f"{a} - {b}") == a - b  # spaced: a difference


def test_the_forms_of_the_issue():
    assert parse_number("1,280") == 1280 and parse_number("1,280 B") == 1280
    assert same("number", parse_number("1.3 KiB"), 1280) and same("number", parse_number("1.25 KiB"), 1280)
    assert not same("number", parse_number("1.2 KiB"), 1280 + 60)
    assert parse_number("2^-6") == 2**-6 and parse_number("3/8") == 0.375 and parse_number("4*320") == 1280
    assert parse_number("0x4C") == 76 and parse_number("448.0") == 448
    assert math.isclose(parse_number("64*(192+128)/(512+64)"), 35.5556, rel_tol=1e-5)
    for text in ("1,28", "1 280", "0-4", "2^100000", "1/0", "1280 apples", "__import__('os')", "x" * 500):
        assert read("number", text)[0] is None, text


# ---------------------------------------------------------------------------------------------
# Sets and shapes


def ranges(members: list[int]) -> str:
    """'0-4, 7, 9-10': runs of consecutive members as ranges."""
    out, run = [], [members[0]]
    for m in members[1:]:
        if m == run[-1] + 1:
            run.append(m)
        else:
            out.append(run)
            run = [m]
    out.append(run)
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out)


@SETTINGS
@given(st.sets(st.integers(0, 300), min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_sets_in_any_order_with_ranges(members, rnd):
    shuffled = list(members)
    rnd.shuffle(shuffled)
    for text in (", ".join(map(str, shuffled)), " ".join(map(str, shuffled)), "{" + ", ".join(map(str, shuffled)) + "}",
                 ranges(sorted(members)), ranges(sorted(members)).replace("-", ".."), " and ".join(map(str, shuffled))):
        assert parse_set(text) == members, text


def test_set_forms_refused():
    assert parse_set("0-4") == {0, 1, 2, 3, 4} and parse_set("0 to 2") == {0, 1, 2} and parse_set("none") == set()
    for text in ("3, -4", "4-0", "1.5", "0-100000", "three"):
        value, why = read("set", text)
        assert value is None and FORMS["set"] in why, text


@SETTINGS
@given(st.lists(st.integers(1, 100_000), min_size=1, max_size=5))
def test_shapes_in_every_form(sizes):
    shape = tuple(sizes)
    forms = ["[" + ", ".join(map(str, shape)) + "]", "x".join(map(str, shape)), "(" + ",".join(map(str, shape)) + ")",
             " ".join(map(str, shape)), " × ".join(map(str, shape)),
             "[" + ", ".join(f"A{i}={s} label" for i, s in enumerate(shape)) + "]"]  # stepper's named form
    for text in forms:
        assert parse_shape(text) == shape, text


def test_shape_forms_refused_and_products():
    assert parse_shape("[B=1 batch, 4 heads, T=7 positions, 64 k_nope + v dims]") == (1, 4, 7, 64)
    assert parse_shape("[1, 7, 4*48]") == (1, 7, 192)
    for text in ("[1, 7.5]", "[1, -7]", "no idea", "1 7 ?", "[1, 7 128]", "about 1", "~1x7"):
        value, why = read("shape", text)
        assert value is None and FORMS["shape"] in why, text
    assert "a shape is exact" in read("shape", "about 1")[1]  # it was read as [1], "about" an axis's label


def test_a_shape_given_for_a_number_is_counted_whole():
    """(1,7,128) once read as 2 numbers: 7,128 taken for seven thousand one hundred and twenty-eight."""
    for text in ("(1,7,128)", "1,7,128", "[1, 7, 128]"):
        value, why = read("number", text)
        assert value is None and "3 numbers" in why, text
    assert parse_number("12,345,678") == 12345678 and parse_number("7,128") == 7128


@SETTINGS
@given(st.text(max_size=80))
def test_no_text_breaks_a_reader(text):
    for kind in ("shape", "number", "set", "choice"):
        value, why = read(kind, text, ("yes", "no"))
        assert (value is None) == bool(why)


# ---------------------------------------------------------------------------------------------
# Judged: refused, not marked wrong; and each kind of shape mistake named


@pytest.fixture(scope="module")
def ctx():
    return Context(prepare(RunSpec()))


def test_unreadable_answers_are_refused_not_marked_wrong(ctx):
    naive = Prediction("bytes?", "number", 1280)
    assert judge(naive, "1,280", ctx, None).right and judge(naive, "1.25 KiB", ctx, None).right
    verdict = judge(naive, "1 280", ctx, None)
    assert not verdict.readable and "1,280" in verdict.why
    pairs = Prediction("pairs?", "set", [0, 1, 2, 3, 4])
    assert judge(pairs, "0-4", ctx, None).right
    assert "2 of 5 right" in judge(pairs, "0, 4", ctx, None).why


K_PE = "layers.1.self_attn.k_pe"  # [B, one, T, rope] = [1, 1, 7, 16]
LATENT = "layers.1.self_attn.compressed_kv"  # [B, T, kv_lora] = [1, 7, 128]


@pytest.mark.parametrize("tensor, answer, said, not_said", [
    (K_PE, "1 7 16",
     ("an axis of size 1 is still an axis: the head axis (one shared rope head) is missing; the shape is [B, H=1, T, "
     "rope]"), "batch"),  # missing
    (K_PE, "7 16", "B (batch) and the head axis (one shared rope head) are missing", None),
    (LATENT, "7 128", "stepper keeps the batch axis", None),
    (LATENT, "1 7", "kv_lora (kv latent) is missing; the shape is [B, T, kv_lora]", None),
    (LATENT, "1 1 7 128", "one axis too many: the shape is [B, T, kv_lora], with nothing for the 1 after B",
     None),  # extra
    (LATENT, "1 7 128 1", "with nothing for the 1 after kv_lora", None),
    (LATENT, "7 1 128", "the right sizes in the wrong order: B (batch) comes before T (positions)", None),  # swapped
    (K_PE, "1 7 1 16", "the head axis (one shared rope head) comes before T (positions)", None),
    (K_PE, "1 1 7 64",
     ("rope (rope dims) is not 64 (Kimi K2's full-size qk_rope_head_dim, not this tiny model's): it is "
     "qk_rope_head_dim"), None),  # size
    (LATENT, "1 8 128", "T (positions) is not 8: it is a size of this run, not of the config", "Kimi"),
    ("layers.1.self_attn.attn_output", "1 7 4 32",
     "the heads side by side, not yet merged: [B, T, H, V] is reshaped to [B, T, H*V]", None),
    ("layers.1.self_attn.attn_output", "1 4 7 32", "before the heads are merged back", None),
    (LATENT, "5", "the shape has 3 axes, [B, T, kv_lora]; that has 1", None),  # nothing to align
    (LATENT, "7 512",
     ("stepper keeps the batch axis: B = 1 comes first, even for one sequence; and kv_lora (kv latent) is not "
     "512"), None),
])
def test_each_shape_mistake_names_the_axis(ctx, tensor, answer, said, not_said):
    shapes = {K_PE: [1, 1, 7, 16], LATENT: [1, 7, 128], "layers.1.self_attn.attn_output": [1, 7, 128]}
    verdict = judge(Prediction("?", "shape", shapes[tensor], tensor=tensor), answer, ctx, None)
    assert not verdict.right and said in verdict.why, verdict.why
    assert not_said is None or not_said not in verdict.why, verdict.why
    assert str(shapes[tensor])[1:-1] not in verdict.why  # a hint, not the answer


@SETTINGS
@given(st.lists(st.integers(1, 9), min_size=2, max_size=5), st.data())
def test_a_dropped_axis_is_the_one_named(shape, data):
    """Drop one axis whose size occurs once: the diagnosis names that axis."""
    shape = tuple(shape)
    unique = [i for i, s in enumerate(shape) if shape.count(s) == 1 and s != 1]
    if not unique:
        return
    i = data.draw(st.sampled_from(unique))
    answer = shape[:i] + shape[i + 1:]
    why = why_shape(answer, shape, (), preset("tiny"))
    assert why.startswith(f"axis {i + 1} is missing; the shape has {len(shape)} axes"), why
    rnd = random.Random(i)
    extra = list(shape)
    extra.insert(rnd.randrange(len(shape) + 1), 10)  # a size nowhere in the shape
    assert "one axis too many" in why_shape(tuple(extra), shape, (), preset("tiny"))


def test_a_tolerance_is_not_loosened_by_the_digits_written():
    assert same("number", parse_number("0.90"), 0.9044)  # exact: rounds to what was written
    assert not same("number", parse_number("0.90"), 0.9044, atol=0.001)  # the lesson asks for 0.001
    assert same("number", parse_number("0.904"), 0.9044, atol=0.001)


def test_a_wrong_number_names_only_a_telling_factor():
    from stepper.lessons.answers import why_number

    assert why_number(320, 1280) == "that is 1/4 of the answer"
    assert why_number(1280, 1.25) == "that is 1024 times the answer"
    assert why_number(0.05, 2.312) == "too low"  # 1/46: a coincidence, not a mistake to name
    assert why_number(-2.312, 2.312) == "right size, wrong sign"
