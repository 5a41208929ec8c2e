"""LayerCache appends into room its own arrays leave (model/cache.py, kernels/growing.py): the
same positions as concatenating, the earlier positions never written again, a `first(n)` cache's appends never
reaching the cache it was cut from."""

import dataclasses

import numpy as np

from stepper.kernels import growing
from stepper.model.cache import POSITION_AXIS, LayerCache


def rows(rng, t, d=5):
    return rng.standard_normal((1, t, d), dtype=np.float32)


def test_appends_equal_concatenation_and_reuse_the_room():
    rng = np.random.default_rng(0)
    cache, parts = LayerCache(), []
    for t in (7, 1, 1, 3, 100, 1):
        part, pe = rows(rng, t), rng.standard_normal((1, 1, t, 2), dtype=np.float32)
        parts.append((part, pe))
        latent, k_pe = cache.extend_latent(part, pe)
        np.testing.assert_array_equal(latent, np.concatenate([p for p, _ in parts], axis=1))
        np.testing.assert_array_equal(k_pe, np.concatenate([e for _, e in parts], axis=2))
    assert cache.length == 113
    own = cache.growing["latent"].own
    cache.extend_latent(rows(rng, 1), np.zeros((1, 1, 1, 2), np.float32))
    assert cache.growing["latent"].own is own and np.shares_memory(cache.latent, own)  # one more position: no copy
    assert 114 < own.shape[1] <= 114 + growing.ROOM_LEAST + 114 // growing.ROOM  # room bounded by the length


def test_views_of_earlier_positions_keep_them_and_a_cut_cache_writes_only_its_own():
    rng = np.random.default_rng(1)
    cache = LayerCache()
    cache.extend_latent(rows(rng, 10), np.zeros((1, 1, 10, 2), np.float32))
    cache.extend_latent(rows(rng, 1), np.zeros((1, 1, 1, 2), np.float32))  # now with room
    held, before = cache.latent, cache.latent.copy()
    cut = cache.first(6)
    cut.extend_latent(np.full((1, 3, 5), 7.0, np.float32), np.zeros((1, 1, 3, 2), np.float32))
    np.testing.assert_array_equal(cache.latent, before)  # the cut cache's append went to a new array
    np.testing.assert_array_equal(cut.latent[:, 6:], 7.0)
    cache.extend_latent(rows(rng, 2), np.zeros((1, 1, 2, 2), np.float32))
    np.testing.assert_array_equal(held, before)  # a view held before the append still holds what it held
    cache.latent = cache.latent.copy()  # a field set from outside: the next append copies it
    cache.extend_latent(rows(rng, 1), np.zeros((1, 1, 1, 2), np.float32))
    np.testing.assert_array_equal(cache.latent[:, :11], before)


def test_first_cuts_every_kept_field_along_its_own_axis_of_positions():
    # LongCat's second cache is cut by its own first(); recurrent: a KDA layer's state, not positions
    step_only = ("growing", "second", "previous", "index_choice", "recurrent", "kv_source")
    kept = [f.name for f in dataclasses.fields(LayerCache) if f.name not in step_only]
    assert sorted(POSITION_AXIS) == sorted(kept)  # a field added to the cache needs its axis
    rng = np.random.default_rng(2)
    cache = LayerCache()
    shapes = {"latent": (1, 9, 4), "k_pe": (1, 1, 9, 2), "key_states": (1, 2, 9, 3), "value_states": (1, 2, 9, 3),
              "index_keys": (1, 9, 4), "index_key_codes": (1, 9, 4), "index_key_scales": (1, 9)}
    for name, shape in shapes.items():
        setattr(cache, name, rng.standard_normal(shape, dtype=np.float32))
    cut = cache.first(4)
    for name, shape in shapes.items():
        axis = POSITION_AXIS[name]
        assert getattr(cut, name).shape[axis] == 4 and np.shares_memory(getattr(cut, name), getattr(cache, name))
        np.testing.assert_array_equal(getattr(cut, name), np.take(getattr(cache, name), range(4), axis=axis))
    assert cut.length == 4 and cache.first(0) == LayerCache()
