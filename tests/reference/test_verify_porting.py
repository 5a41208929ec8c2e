"""`fixtures verify` as a porter reads it: the first divergence in the port's own name and layout,
a router weight's worst entry by token and expert, and a difference no larger than float32's
rounding of a rotary angle said to be that."""

from pathlib import Path

import numpy as np
from helpers.cli import stepper
from safetensors.numpy import save_file

from stepper.fixtures.fixture import load

ROOT = Path(__file__).resolve().parents[2] / "fixtures"


def candidate(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path))
    return path


def verify(*args) -> str:
    out = stepper("fixtures", "verify", *map(str, args), "--allow-missing", "--plain", "--problems")
    assert out.returncode == 1, out.stderr
    return out.stdout


def test_the_first_divergence_is_named_and_placed_in_the_port_s_own_name_and_layout(tmp_path):
    """A KDA port dumps its forget gate as transformers' module does, [B, T, H, K], under that
    module's name, one entry wrong. verify said the fixture's name and the fixture's index
    [0, h, t, k]: in the port's array that is past its axes (t is 70 positions, h 4 heads)."""
    kda = load(ROOT / "tiny-kimi-linear-kda")
    gate = kda.tensors["prefill.layers.0.self_attn.forget_gate"]  # [1, 4 heads, 66 positions, 32]
    theirs = np.ascontiguousarray(gate.transpose(0, 2, 1, 3))
    theirs[0, 37, 2, 5] += 1.0  # position 37, head 2, channel 5
    name = "prefill.model.layers.0.self_attn.forget_gate"
    out = verify(kda.path, candidate(tmp_path / "port.safetensors", {name: theirs}), "--names", "transformers")
    assert (f"first divergence: prefill.layers.0.self_attn.forget_gate (the candidate's {name}): 1 of "
            f"{gate.size} entries outside tolerance (worst at [0,2,37,5], the candidate's [0,37,2,5])") in out


def test_a_port_s_rope_pairs_side_by_side_are_placed_where_the_port_has_them(tmp_path):
    """Rotary dims in the checkpoint's pairs (x0' x1' x2' ...) against the reference's halves
    [x0' x2' ... | x1' x3' ...]: reference dim 9 of 16 is the port's dim 3."""
    basic = load(ROOT / "tiny-prefill-decode")
    ref = basic.tensors["prefill.layers.1.self_attn.q_pe_rope"]  # [1, 4, 7, 16]
    pairs = np.empty_like(ref)
    pairs[..., 0::2], pairs[..., 1::2] = ref[..., :8], ref[..., 8:]
    pairs[0, 1, 4, 3] += 1.0
    out = verify(basic.path, candidate(tmp_path / "port.safetensors",
                                       {"prefill.layers.1.self_attn.q_pe_rope": pairs}))
    assert "(worst at [0,1,4,9], the candidate's [0,1,4,3])" in out
    assert "(the candidate's" not in out.split("first divergence:")[1].split(":")[0]  # its name is the fixture's


def test_a_router_weight_s_worst_entry_is_its_token_and_expert(tmp_path):
    """topk_weight is compared with both sides sorted by expert, so its index [token, slot] was the
    slot in that sorted order, in neither side's own: the worst is named by token and expert."""
    mla = load(ROOT / "tiny-kimi-linear-mla")
    idx = mla.tensors["prefill.layers.3.mlp.gate.topk_idx"]  # [8 tokens, 4]
    weights = mla.tensors["prefill.layers.3.mlp.gate.topk_weight"].copy()
    weights[5, 2] += 0.5  # token 5's third choice
    out = verify(mla.path, candidate(tmp_path / "port.safetensors", {
        "prefill.layers.3.mlp.gate.topk_idx": idx, "prefill.layers.3.mlp.gate.topk_weight": weights}))
    assert f"1 of {weights.size} entries outside tolerance (worst at token 5, expert {idx[5, 2]})" in out


ANGLE_NOTE = "float32 rounds a rotary angle (position x inv_freq) by up to"


def test_a_rotary_difference_within_float32_s_angle_rounding_is_said_to_be_that(tmp_path):
    """Past position 4094 a float32 angle is rounded by up to 4.9e-4 rad, more than the tolerance
    (1e-4): a port computing angles in float64 differs from the reference (transformers' float32
    product) by about 2e-4 in q_pe_rope. verify says so; a bug's difference, or the same 2e-4 at
    positions 0..8 (where the angles round by 1e-6), gets no such line."""
    yarn, basic = load(ROOT / "tiny-yarn-4094"), load(ROOT / "tiny-prefill-decode")
    name = "prefill.layers.1.self_attn.q_pe_rope"
    out = verify(yarn.path, candidate(tmp_path / "near.safetensors", {name: yarn.tensors[name] * np.float32(1.0002)}))
    assert "the fixture's positions reach 4098, where " + ANGLE_NOTE + " 4.9e-04 rad" in out
    assert "--rtol 1e-3 --atol 1e-3" in out
    out = verify(yarn.path, candidate(tmp_path / "bug.safetensors", {name: yarn.tensors[name] * np.float32(1.46)}))
    assert ANGLE_NOTE not in out
    out = verify(basic.path, candidate(tmp_path / "early.safetensors",
                                       {name: basic.tensors[name] * np.float32(1.0002)}))
    assert "first divergence: " + name in out and ANGLE_NOTE not in out
