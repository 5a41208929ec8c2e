"""The group map under `--show routing`: which expert groups a grouped router kept for each token,
and how many of its experts came from each."""

import io

import numpy as np
from helpers.cli import stepper
from helpers.configs import family_preset
from rich.console import Console

from stepper.views.group_map import group_map, group_rule


def drawn(picture) -> list[str]:
    console = Console(width=120, no_color=True, record=True, file=io.StringIO())
    console.print(picture)
    return console.export_text().splitlines()


def test_each_token_row_marks_dropped_groups_kept_ones_and_the_experts_chosen_from_them():
    cfg = family_preset("tiny-mistral4")  # 16 experts in 4 groups of 4, 2 groups kept, top 4
    mask = np.array([[1, 0, 0, 1], [0, 1, 1, 0]], np.float32)
    idx = np.array([[0, 1, 2, 13], [4, 5, 6, 7]])
    lines = drawn(group_map(mask, idx, cfg))
    assert lines[1:3] == ["    0 3··1", "    1 ·4○·"]
    assert "4 groups of 4 experts, 2 kept per token" in lines[3]
    assert "sum of its two best (softmax score, no bias)" in " ".join(lines[3:])


def test_the_rule_names_each_routers_group_score():
    assert group_rule(family_preset("tiny-v3")).endswith("(sigmoid score + e_score_correction_bias)")
    assert group_rule(family_preset("tiny-axk1")).endswith("(sigmoid score, no bias)")
    assert group_rule(family_preset("deepseek-v2")) == "a group scores as its best softmax score (V2)"


def test_run_draws_it_under_the_routing_map_for_a_grouped_router_only():
    grouped = stepper("run", "--model", "tiny-axk1", "--show", "routing", "--only", "layers.1.mlp.gate.topk_weight",
                      "--plain")
    assert grouped.returncode == 0, grouped.stderr
    assert "tok\\g 0123" in grouped.stdout and "(sigmoid score, no bias)" in grouped.stdout
    single = stepper("run", "--model", "tiny-glm4-flash", "--show", "routing", "--only",
                     "layers.1.mlp.gate.topk_weight", "--plain")
    assert single.returncode == 0 and "tok\\e" in single.stdout and "tok\\g" not in single.stdout
