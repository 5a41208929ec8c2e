"""--cache-len: a lone layer's cache starts with N synthetic positions, deterministic from the
seed, with the statistics of the layer's real latents, rotary keys turned at their positions;
both attention paths attend over the same cache."""

import numpy as np
import pytest

from stepper.errors import StepperError
from stepper.model.cache import LayerCache
from stepper.model.rope import apply_rope, rotate_halves
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, prepare, run


def tensors(**spec):
    rec = Recorder()
    run(RunSpec(layer=1, **spec), [rec])
    return {e.name: np.asarray(e.array) for e in rec.events}


def filled(seed=0, n=3000, start_pos=0, attn="absorb"):
    """The layer cache a run with cache_len n starts from (captured through the session)."""
    from stepper.model import synthetic_cache

    caught = {}
    original = synthetic_cache.fill

    def fill(cache: LayerCache, *args):
        original(cache, *args)
        caught["cache"] = cache
        raise KeyboardInterrupt  # stop the run there

    synthetic_cache.fill = fill
    try:
        with pytest.raises(KeyboardInterrupt):
            run(RunSpec(layer=1, prompt_len=2, cache_len=n, seed=seed, start_pos=start_pos, attn=attn), [])
    finally:
        synthetic_cache.fill = original
    return caught["cache"]


def test_the_cache_is_deterministic_from_the_seed_with_the_statistics_of_real_latents():
    a, b, other = filled(0), filled(0), filled(1)
    assert a.latent.shape == (1, 3000, 128) and a.k_pe.shape == (1, 1, 3000, 16)
    assert np.array_equal(a.latent, b.latent) and np.array_equal(a.k_pe, b.k_pe)
    assert not np.array_equal(a.latent, other.latent)
    real = tensors(prompt_len=64)["layers.1.self_attn.compressed_kv_norm"][0]  # [64, kv_lora]
    synthetic = a.latent[0]
    np.testing.assert_allclose(synthetic.std(axis=0).mean(), real.std(axis=0).mean(), rtol=0.1)
    np.testing.assert_allclose(np.sqrt(np.mean(synthetic**2)), np.sqrt(np.mean(real**2)), rtol=0.1)


def test_the_rotary_keys_are_turned_at_their_positions():
    from stepper.model import Transformer, synthetic_cache
    from stepper.model.layer_weights import LayerWeights
    from stepper.presets import preset
    from stepper.seams.trace import Emitter
    from stepper.weights.seeded import SyntheticWeights

    cfg = preset("tiny")
    model = Transformer(SyntheticWeights(cfg, 0))
    w, sample = LayerWeights(model.weights, 1,
                             {}), np.random.default_rng(0).standard_normal((1, 8, cfg.hidden_size), np.float32)
    caches = {}
    for start in (0, 5000):
        caches[start] = LayerCache()
        rope = model.rope(start + np.arange(40), Emitter())
        synthetic_cache.fill(caches[start], w, cfg, sample, rope, 7, per_head=False)
    assert np.array_equal(caches[0].latent, caches[5000].latent)  # the same draws
    assert not np.allclose(caches[0].k_pe, caches[5000].k_pe, atol=1e-3)  # turned at other positions
    # the keys at 5000 are those at 0 turned on by 5000 positions more: RoPE(p + q) = RoPE(q) of RoPE(p), mscale aside
    shift = model.rope(np.full(40, 5000), Emitter())
    scale = float(np.hypot(shift.cos[0, 0], shift.sin[0, 0]))  # YaRN's mscale multiplies cos and sin
    halves = caches[0].k_pe
    interleaved = np.empty_like(halves)  # apply_rope reads interleaved pairs and writes the halves' layout
    interleaved[..., 0::2], interleaved[..., 1::2] = np.split(halves, 2, axis=-1)
    np.testing.assert_allclose(apply_rope(interleaved, shift.cos / scale, shift.sin / scale), caches[5000].k_pe,
                               rtol=1e-3, atol=1e-4)


def test_both_paths_attend_over_the_same_synthetic_cache_past_4096():
    spec = {"prompt_len": 3, "cache_len": 4200, "decode": 1, "seed": 3}
    naive, absorbed = tensors(attn="naive", **spec), tensors(attn="absorb", **spec)
    for name in ("prefill.layers.1.self_attn.attn_output", "decode0.layers.1.self_attn.attn_output",
                 "decode0.layers.1.output"):
        np.testing.assert_allclose(naive[name], absorbed[name], rtol=1e-4, atol=1e-5, err_msg=name)
    assert naive["decode0.layers.1.self_attn.attn_weights"].shape == (1, 4, 1, 4204)
    no_cache = tensors(attn="absorb", prompt_len=3, decode=1, seed=3, start_pos=4200)  # the same positions
    assert not np.allclose(no_cache["decode0.layers.1.output"], absorbed["decode0.layers.1.output"])


def test_cache_len_needs_a_lone_layer_and_fits_the_positions():
    with pytest.raises(StepperError, match="--cache-len 10 fills one layer's cache: use it with --layer N"):
        prepare(RunSpec(cache_len=10))
    with pytest.raises(StepperError, match="positions up to 131073 exceed max_position_embeddings"):
        prepare(RunSpec(layer=0, cache_len=131072, prompt_len=2))
    with pytest.raises(StepperError, match="--cache-len must be >= 0"):
        prepare(RunSpec(layer=0, cache_len=-1))


@pytest.mark.parametrize("name", ["tiny-minicpm3", "tiny-kimi-linear"])
def test_the_rotary_keys_are_turned_as_the_models_own_layer_turns_them(name):
    """The synthetic rotary keys are the drawn ones turned at their positions as the layer turns
    keys: MiniCPM3 dim i with dim i + rope/2 (two halves, not interleaved pairs); Kimi Linear not at
    all. The draws are those of the same fill with a rope that turns nothing."""
    import dataclasses

    from stepper import families
    from stepper.model import synthetic_cache
    from stepper.model.layer_weights import LayerWeights
    from stepper.seams.trace import Emitter
    from stepper.session import preset_config

    cfg = preset_config(name)
    layer = cfg.full_attn_layers[0] if name == "tiny-kimi-linear" else 1
    model = families.family_for(cfg).build(families.family_for(cfg).synthetic(cfg, 0))
    w = LayerWeights(model.weights, layer, {})
    sample = np.random.default_rng(0).standard_normal((1, 8, cfg.hidden_size), np.float32)
    rope = model.rope(500 + np.arange(40), Emitter())
    turned, drawn = LayerCache(), LayerCache()
    synthetic_cache.fill(turned, w, cfg, sample, rope, 7, False)
    synthetic_cache.fill(drawn, w, cfg, sample, dataclasses.replace(rope, rotates=False), 7, False)
    keys, draws = turned.k_pe[0, 0], drawn.k_pe[0, 0]  # [S, rope]
    if not cfg.rotary:
        np.testing.assert_array_equal(keys, draws)
        return
    np.testing.assert_allclose(keys, rotate_halves(draws, rope.cos, rope.sin, draws.shape[-1]), rtol=1e-5, atol=1e-6)
    assert not np.allclose(keys, draws, atol=1e-3)
