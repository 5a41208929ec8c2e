"""`fixtures verify` as a porter reads it: the first divergence in the port's own name and layout,
a router weight's worst entry by token and expert, and a difference no larger than float32's
rounding of a rotary angle said to be that."""

from pathlib import Path

import numpy as np
from helpers.cli import stepper
from safetensors.numpy import save_file

from stepper import catalog
from stepper.fixtures import verify as verifying
from stepper.fixtures.fixture import load
from stepper.fixtures.layouts import softmax_scale

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


def inputs_of(fixture, name: str) -> list[str]:
    index = next(i for i, e in enumerate(fixture.entries) if e["name"] == name)
    return [fixture.entries[j]["name"] for j in verifying.formula_inputs(fixture, index)]


def test_deepseek_v4_s_tensors_are_computed_from_their_own_inputs():
    """Read from the formulas' words, the compressor's slot gates came from `attn.window` (the word
    "window" in its prose), the router's weights and the routed experts from `attn.chosen` (the
    attention's entries, for the experts chosen), the attention's scores from the indexer's keys, and
    the head from the first layer's embedding: the verdict under a first divergence named inputs the
    tensor never reads. The catalogue lists these inputs."""
    v4 = load(ROOT / "tiny-v4-windows")
    layer = "prefill.layers.1."
    assert inputs_of(v4, layer + "attn.compressor.slot_gate") == [layer + "attn.compressor.gate"]
    assert inputs_of(v4, layer + "attn.compressor.pooled") == [layer + "attn.compressor.kv",
                                                               layer + "attn.compressor.slot_weights"]
    assert inputs_of(v4, layer + "attn.indexer.compressor.kv") == [layer + "attn_norm"]
    assert inputs_of(v4, layer + "attn.entry_keys") == [layer + "attn.entries", layer + "attn.chosen"]
    assert inputs_of(v4, layer + "attn.scores") == [layer + f"attn.{n}" for n in ("q_rope", "window", "entry_keys")]
    assert inputs_of(v4, layer + "ffn.gate.weights") == [layer + "ffn.gate.scores", layer + "ffn.gate.hash_idx"]
    assert inputs_of(v4, "prefill.layers.2.ffn.gate.weights") == ["prefill.layers.2.ffn.gate.scores",
                                                                  "prefill.layers.2.ffn.gate.topk_idx"]
    assert inputs_of(v4, layer + "hc_attn.collapsed") == [layer + "streams", layer + "hc_attn.pre"]
    last = max(e["layer"] for e in v4.entries if e["layer"] is not None)
    assert inputs_of(v4, "prefill.hc_head.mixes") == [f"prefill.layers.{last}.ffn_streams"]


def test_every_listed_input_is_a_catalogue_name():
    cat = catalog.load()
    listed = {e["name"]: e["inputs"] for e in cat.entries if "inputs" in e}
    assert len(listed) >= 20
    assert {name: [k for k in keys if cat.entry(k) is None] for name, keys in listed.items()} == {
        name: [] for name in listed}


def test_a_compressor_window_off_by_one_is_put_in_its_own_step(tmp_path):
    """A port's compressor whose windows start one token late: its gates are right, its slot gates
    not. The verdict named `attn.window` (missing) as the slot gates' input and said the difference
    may start earlier; it is the gates, which match, so it starts in this step."""
    v4 = load(ROOT / "tiny-v4-windows")
    p = "prefill.layers.1.attn.compressor."
    late = np.roll(v4.tensors[p + "slot_gate"], -1, axis=1)  # window w given window w + 1's slots
    out = verify(v4.path, candidate(tmp_path / "port.safetensors", {p + "gate": v4.tensors[p + "gate"],
                                                                     p + "slot_gate": late}))
    assert f"first divergence: {p}slot_gate: " in out
    assert f"  input {p}gate: match\n  its inputs match, so the difference starts in this step" in out
    assert "attn.window" not in out.split("first divergence:")[1]


def test_llama_cpp_s_raw_kq_is_placed_in_its_own_cells(tmp_path):
    """llama.cpp's kq-{i}: [H, T, n_kv] cells, K·Q before the scale, padded past the positions. Its
    compared values are scaled, so the layout's label differs once values are left alone: the index
    was left out. Head 2, query 5, cell 1 wrong."""
    basic = load(ROOT / "tiny-prefill-decode")
    scores = basic.tensors["prefill.layers.1.self_attn.attn_scores"][0]  # [4 heads, 7, 7], -inf in the future
    raw = np.zeros(scores.shape[:-1] + (scores.shape[-1] + 3,), np.float32)  # three padding cells
    raw[..., :scores.shape[-1]] = np.where(np.isinf(scores), 0, scores) / np.float32(softmax_scale(basic.config))
    raw[2, 5, 1] += 1.0
    out = verify(basic.path, candidate(tmp_path / "port.safetensors", {"prefill.kq-1": raw}), "--names", "llama.cpp")
    assert "first divergence: prefill.layers.1.self_attn.attn_scores (the candidate's prefill.kq-1): 1 of 196 " \
           "entries outside tolerance (worst at [0,2,5,1], the candidate's [2,5,1])" in out


def test_kda_tensors_with_positions_before_heads_are_read_as_the_reference_s(tmp_path):
    """transformers' KDA holds its per-head tensors [B, T, H, K] and beta [B, T, H]; under their
    canonical names (or --map) verify arranged only MLA's heads (H), so a port dumping KDA's
    (Hk) or the indexer's (Hi) that way was 'cannot be arranged' though every value was right."""
    kda = load(ROOT / "tiny-kimi-linear-kda")
    names = [f"prefill.layers.0.self_attn.{k}" for k in ("q_unit", "forget_gate", "beta", "delta", "core_out")]
    theirs = {n: np.swapaxes(kda.tensors[n], 1, 2).copy() for n in names}
    out = stepper("fixtures", "verify", kda.path, candidate(tmp_path / "port.safetensors", theirs), "--allow-missing",
                  "--plain")
    assert out.returncode == 0 and "match: 58 fixture tensors, 5 match, 0 differ, 53 missing" in out.stdout, out.stdout
    theirs[names[2]][0, 40, 3] += 0.5  # beta of position 40, head 3
    out = verify(kda.path, candidate(tmp_path / "port.safetensors", theirs))
    assert (f"first divergence: {names[2]}: 1 of {theirs[names[2]].size} entries outside tolerance "
            "(worst at [0,3,40], the candidate's [0,40,3])") in out


def pairs_side_by_side(array: np.ndarray, rope: int) -> np.ndarray:
    """The first `rope` dims from the reference's [evens | odds] into pairs (x0' x1' x2' ...)."""
    out = array.copy()
    out[..., 0:rope:2], out[..., 1:rope:2] = array[..., :rope // 2], array[..., rope // 2:rope]
    return np.ascontiguousarray(out)


def test_glm5_s_indexer_rope_pairs_side_by_side_are_read_as_the_reference_s(tmp_path):
    """GLM-5's indexer turns interleaved pairs of its first qk_rope_head_dim dims; the fixture lays
    them out as MLA's q_pe_rope ([evens | odds]), and a port turning the pairs in place (the same
    index scores) differed at cosine 0.53. V3.2's indexer turns two halves, so there the same
    permutation is a different layout, and still differs."""
    glm5, v32 = load(ROOT / "tiny-glm5-shared"), load(ROOT / "tiny-v32-indexer")
    for fixture, layer, agrees in ((glm5, 1, True), (v32, 1, False)):
        rope = int(fixture.manifest["config"]["qk_rope_head_dim"])
        names = [f"prefill.layers.{layer}.self_attn.indexer.{k}" for k in ("q_rope", "k_rope", "keys")]
        theirs = {n: pairs_side_by_side(fixture.tensors[n], rope) for n in names}
        out = stepper("fixtures", "verify", fixture.path, candidate(tmp_path / "port.safetensors", theirs),
                      "--allow-missing", "--plain")
        assert (out.returncode == 0) is agrees, out.stdout
        assert ("3 match, 0 differ" in out.stdout) is agrees
