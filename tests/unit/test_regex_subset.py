"""The `re:` patterns of an INT4 quantization_config: only a subset whose backtracking work is
bounded runs; the work is counted (ways of placing repeats and alternatives), not timed."""

import re

import pytest

from stepper.config import KIMI_INT4_IGNORE
from stepper.errors import StepperError
from stepper.untrusted import regex_subset as patterns


def ways(pattern: str, n: int = patterns.MAX_NAME) -> int:
    return patterns.ways_of(patterns.sre_parse.parse(pattern), n)


def test_kimis_patterns_are_in_the_subset_with_their_ways_counted():
    found = {p[3:]: ways(p[3:]) for p in KIMI_INT4_IGNORE if p.startswith("re:")}
    assert found == {".*self_attn.*": 129**2, ".*shared_experts.*": 129**2,
                     r".*mlp\.(gate|up|gate_up|down)_proj.*": 129 * 4 * 129}
    assert all(patterns.refusal(p) is None for p in found)


@pytest.mark.parametrize(("pattern", "count"), [
    ("abc", 1), ("a?b?", 4), ("a{2,5}", 4), ("(a|bc|d)x*", 3 * 129), (".*.*.*", 129**3), ("a{0,1000}", 129),
])
def test_ways_multiply_over_a_sequence_and_add_over_alternatives(pattern, count):
    assert ways(pattern) == count


@pytest.mark.parametrize(("pattern", "why"), [
    ("(.*.*)*!", "uses a repeated group"), ("(?:ab)+", "uses a repeated group"), ("(a)\\1", "uses a backreference"),
    ("(?=a)b", "uses a lookaround"), ("(?<!a)b", "uses a lookaround"), ("(a)(?(1)b|c)", "uses a conditional"),
    (".*.*.*.*!", "could try 2.8e+08 ways"), ("(" * 17 + ")" * 17, "nests groups more than 16 deep"),
    ("a" * 257, "is longer than 256 characters"), ("[", "is not a regular expression"),
])
def test_a_pattern_outside_the_subset_is_refused_before_it_runs(pattern, why):
    assert patterns.refusal(pattern).startswith(why)


@pytest.mark.parametrize("name", ["model.layers.3.mlp.experts.7.gate_proj", "model.layers.3.self_attn.q_a_proj",
                                  "lm_head", "model.layers.10.mlp.down_proj"])
def test_matching_is_re_match_from_the_start(name):
    for entry in KIMI_INT4_IGNORE:
        if entry.startswith("re:"):
            assert patterns.matches(entry[3:], name) == (re.match(entry[3:], name) is not None)


def test_a_name_longer_than_the_bound_is_refused():
    with pytest.raises(StepperError, match="is longer than 128 characters"):
        patterns.matches(".*x", "a" * 129)
