"""The Lightning Indexer with DeepSeek's FP8 scoring (index_scoring "fp8") in a run: off, the layer
is unchanged; on, its index scores equal a float64 re-implementation of DeepSeek-V3.2-Exp's
Indexer.forward and fp8_index kernel (inference/model.py lines 465-476, kernel.py), its
kept-of-exact count is the overlap of the two top-k sets, and decode equals prefill."""

import math

import ml_dtypes
import numpy as np
import pytest

from stepper.errors import StepperError
from stepper.planning.names import planned_names
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, execute, prepare, run
from stepper.weights.seeded import SyntheticWeights

LAYER = "layers.1.self_attn.indexer."
FP8_ONLY = ("q_rotated", "k_rotated", "q_fp8", "q_scale", "k_fp8", "k_scale", "keys_fp8", "key_scales",
            "fp8_head_weights", "exact_index_scores", "exact_topk_idx", "kept_of_exact")


def recorded(spec: RunSpec, weights=None) -> dict[str, np.ndarray]:
    rec = Recorder()
    run(spec, [rec], weights)
    return rec.tensors()


@pytest.fixture(scope="module")
def wide_heads():
    """tiny-v32 with DeepSeek-V3.2's index head of 128 dims: one FP8 block a head, as act_quant has it."""
    from tests.helpers.configs import config_with
    return SyntheticWeights(config_with("tiny-v32", index_head_dim=128), seed=2)


def test_exact_scoring_is_the_default_and_emits_nothing_of_fp8():
    spec = RunSpec(model="tiny-v32", prompt_len=6, decode=1)
    default, exact = recorded(spec), recorded(RunSpec(model="tiny-v32", prompt_len=6, decode=1, index_scoring="exact"))
    assert list(default) == list(exact) and not any(n.rsplit(".", 1)[-1] in FP8_ONLY for n in default)
    for name in default:
        np.testing.assert_array_equal(default[name], exact[name], err_msg=name)


def test_fp8_scoring_changes_nothing_before_the_scores_and_emits_its_names_in_order():
    plan = prepare(RunSpec(model="tiny-v32", prompt_len=9, decode=2, index_scoring="fp8"))
    rec = Recorder()
    execute(plan, [rec])
    assert [e.name for e in rec.events if ".indexer." in e.name] == [n for n in planned_names(plan) if ".indexer." in n]
    # a layer alone, on the same inputs in every step (its decode tokens come from the seed, not its output)
    fp8 = recorded(RunSpec(model="tiny-v32", layer=1, prompt_len=9, decode=2, index_scoring="fp8"))
    exact = recorded(RunSpec(model="tiny-v32", layer=1, prompt_len=9, decode=2))
    for short in ("q_rope", "keys", "head_weights"):
        for phase in ("prefill.", "decode1."):
            np.testing.assert_array_equal(fp8[phase + LAYER + short], exact[phase + LAYER + short])
    # the exact scores beside the FP8 ones are what exact scoring computes
    np.testing.assert_array_equal(fp8["prefill." + LAYER + "exact_index_scores"],
                                  exact["prefill." + LAYER + "index_scores"])
    np.testing.assert_array_equal(fp8["prefill." + LAYER + "exact_topk_idx"], exact["prefill." + LAYER + "topk_idx"])


def sylvester(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def deepseek_index_score(q_rotated, k_rotated, head_weights) -> np.ndarray:
    """Indexer.forward from act_quant on (DeepSeek-V3.2-Exp inference/model.py 467-475), in float64:
    act_quant with ue8m0 scales; weights = weights_proj(x) * n_heads^-0.5 * q_scale * softmax_scale;
    fp8_index: logits = relu(q_fp8 k_fp8^T) * weights, summed over heads, times k_scale; + causal mask.
    q_rotated [B, Hi, T, D], k_rotated [B, S, D] (all S positions), head_weights [B, T, Hi] -> [B, T, S]"""

    def act_quant(x):
        amax = np.maximum(np.abs(x).max(axis=-1), 1e-4)
        scale = 2.0 ** np.ceil(np.log2(amax / 448.0))
        y = np.clip(x / scale[..., None], -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
        return y, scale

    q = np.asarray(q_rotated, np.float64).transpose(0, 2, 1, 3)  # [B, T, Hi, D], DeepSeek's layout
    q_fp8, q_scale = act_quant(q)  # [B, T, Hi, D], [B, T, Hi]
    k_fp8, k_scale = act_quant(np.asarray(k_rotated, np.float64))  # [B, S, D], [B, S]
    weights = np.asarray(head_weights, np.float64) * q_scale * q.shape[-1] ** -0.5  # [B, T, Hi]
    logits = np.maximum(np.einsum("bthd,bsd->btsh", q_fp8, k_fp8), 0) * weights[:, :, None, :]
    score = logits.sum(axis=-1) * k_scale[:, None, :]  # [B, T, S]
    T, S = score.shape[1:]
    future = np.arange(S)[None, :] > (S - T) + np.arange(T)[:, None]
    return np.where(future, -np.inf, score)


@pytest.mark.parametrize("attn", ["naive", "absorb"])
def test_fp8_index_scores_equal_deepseeks_formula_in_float64(wide_heads, attn):
    seen = recorded(RunSpec(prompt_len=12, start_pos=5000, decode=2, attn=attn, index_scoring="fp8", seed=2),
                    wide_heads)
    for phase in ("prefill.", "decode0.", "decode1."):
        t = {short: seen[phase + LAYER + short] for short in ("q_rope", "keys", "head_weights", "q_rotated",
                                                                "index_scores", "topk_idx", "keys_fp8")}
        dims = t["q_rope"].shape[-1]
        assert dims == 128
        # the rotation is Sylvester's matrix over sqrt(128); the keys' rotations come from every step so far
        np.testing.assert_allclose(t["q_rotated"], t["q_rope"] @ sylvester(dims) / math.sqrt(dims), rtol=1e-5,
                                   atol=1e-6)
        k_rotated = t["keys"].astype(np.float64) @ sylvester(dims) / math.sqrt(dims)
        want = deepseek_index_score(t["q_rotated"], k_rotated.astype(np.float32), t["head_weights"])
        np.testing.assert_allclose(t["index_scores"], want, rtol=1e-5, atol=1e-7, err_msg=phase)
        np.testing.assert_array_equal(t["keys_fp8"], np.clip(
            k_rotated.astype(np.float32) / seen[phase + LAYER + "key_scales"][..., None], -448, 448
        ).astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
        best = np.argsort(-want, axis=-1, kind="stable")[..., : t["topk_idx"].shape[-1]]
        np.testing.assert_array_equal(np.where(t["topk_idx"] >= 0, t["topk_idx"], best), best, err_msg=phase)


def test_kept_of_exact_is_the_overlap_of_the_two_choices(wide_heads):
    seen = recorded(RunSpec(prompt_len=40, index_scoring="fp8", seed=2), wide_heads)
    total_differing = 0
    for layer in range(3):
        prefix = f"layers.{layer}.self_attn.indexer."
        chosen, exact = seen[prefix + "topk_idx"][0], seen[prefix + "exact_topk_idx"][0]
        want = [len({int(s) for s in a if s >= 0} & {int(s) for s in b if s >= 0}) for a, b in zip(chosen, exact)]
        np.testing.assert_array_equal(seen[prefix + "kept_of_exact"][0], want)
        total_differing += sum(w < (b >= 0).sum() for w, b in zip(want, exact))
    assert total_differing > 0  # FP8 rounding does change some choices here, so the count is not trivially full


def test_fp8_decode_equals_prefill(wide_heads):
    """A prefill over the prompt and the generated tokens scores those positions as the decode steps did,
    over the FP8 key cache."""
    stepped = Recorder()
    result = run(RunSpec(prompt_len=10, start_pos=4090, decode=3, index_scoring="fp8", seed=2), [stepped], wide_heads)
    steps = stepped.tensors()
    whole = recorded(RunSpec(ids=(*result.prompt, *result.generated[:2]), start_pos=4090, index_scoring="fp8"),
                     wide_heads)
    for k in range(2):
        row = 10 + k
        for short in ("index_scores", "exact_index_scores"):
            np.testing.assert_allclose(steps[f"decode{k}.{LAYER}{short}"][:, 0],
                                       whole[LAYER + short][:, row, : row + 1],
                                       rtol=1e-5, atol=1e-6, err_msg=f"decode{k} {short}")
        for short in ("topk_idx", "exact_topk_idx", "kept_of_exact"):
            np.testing.assert_array_equal(steps[f"decode{k}.{LAYER}{short}"][:, 0], whole[LAYER + short][:, row])
        np.testing.assert_array_equal(steps[f"decode{k}.{LAYER}keys_fp8"], whole[LAYER + "keys_fp8"][:, : row + 1])
        np.testing.assert_array_equal(steps[f"decode{k}.{LAYER}key_scales"], whole[LAYER + "key_scales"][:, : row + 1])


@pytest.mark.parametrize("model, fields, message", [
    ("tiny", {}, r"model tiny \(kimi_k2\) has none"),
    ("tiny-v32", {"index_head_dim": 48}, "power of two up to 128"),
    ("tiny-v32", {"index_head_dim": 256}, "power of two up to 128"),
])
def test_fp8_scoring_refuses_a_model_it_cannot_score(model, fields, message):
    from tests.helpers.configs import config_with
    with pytest.raises(StepperError, match=message):
        prepare(RunSpec(index_scoring="fp8"), SyntheticWeights(config_with(model, **fields), seed=0))
    with pytest.raises(StepperError, match="--index-scoring must be one of exact, fp8, got 'bf16'"):
        prepare(RunSpec(model="tiny-v32", index_scoring="bf16"))


@pytest.mark.parametrize("scoring", ["exact", "fp8"])
def test_a_synthetic_cache_gives_the_indexer_keys_too(wide_heads, scoring):
    """--cache-len N on a V3.2 layer: N synthetic index keys (and, scoring in FP8, their codes and scales)."""
    seen = recorded(RunSpec(layer=1, prompt_len=5, cache_len=30, decode=1, index_scoring=scoring, seed=2), wide_heads)
    keys = seen["decode0." + LAYER + "keys"]  # [B, S, Di]
    assert keys.shape == (1, 36, 128) and np.isfinite(keys).all() and keys[:, :30].std() > 0
    assert (seen["decode0." + LAYER + "topk_idx"] >= 0).sum() == 4
    if scoring == "fp8":
        dims = keys.shape[-1]
        want = deepseek_index_score(seen["decode0." + LAYER + "q_rotated"],
                                    (keys.astype(np.float64) @ sylvester(dims) / math.sqrt(dims)).astype(np.float32),
                                    seen["decode0." + LAYER + "head_weights"])
        np.testing.assert_allclose(seen["decode0." + LAYER + "index_scores"], want, rtol=1e-5, atol=1e-7)


def test_the_fp8_scoring_goes_on_with_its_shown_tensors():
    """A sink replacing q_fp8 or k_fp8 changes what follows: the scores, and the FP8 key cache."""
    def zero(name):
        return lambda event: np.zeros_like(event.array) if event.name == name else None

    rec = Recorder()
    run(RunSpec(model="tiny-v32", layer=1, prompt_len=6, index_scoring="fp8"), [zero(LAYER + "q_fp8"), rec])
    scores = rec.tensors()[LAYER + "index_scores"]
    assert np.isfinite(scores).sum() == 21 and np.all(scores[np.isfinite(scores)] == 0)  # 6 queries' 1 + ... + 6 keys
    rec = Recorder()
    run(RunSpec(model="tiny-v32", layer=1, prompt_len=6, decode=1, index_scoring="fp8"),
        [zero("prefill." + LAYER + "k_fp8"), rec])
    keys = rec.tensors()["decode0." + LAYER + "keys_fp8"]
    assert np.all(keys[:, :6] == 0) and np.any(keys[:, 6] != 0)


def test_the_python_api_takes_index_scoring():
    import stepper
    seen = stepper.run("tiny-v32", layer=1, prompt_len=6, index_scoring="fp8", keep="*indexer*")
    want = recorded(RunSpec(model="tiny-v32", layer=1, prompt_len=6, index_scoring="fp8"))
    np.testing.assert_array_equal(seen[LAYER + "kept_of_exact"], want[LAYER + "kept_of_exact"])
    with pytest.raises(StepperError, match="index_scoring= expects one of exact, fp8, got 'int8'"):
        stepper.run("tiny-v32", index_scoring="int8")
