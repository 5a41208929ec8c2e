"""A lone MLA layer attending over 4200 cached positions, against transformers' DeepseekV3DecoderLayer
(the naive path of tiny and tiny-v3, the absorbed one of tiny).

The other cross-checks start past 4096 with an empty cache, so their queries meet at most a dozen
keys, all a few positions away. Here stepper's lone layer (`--layer 1 --cache-len 4200`, tiny and
tiny-v3) starts from its synthetic cache of positions 0..4199; transformers' layer 1, on the same
weights, gets that cache's latents and rotated keys in its DynamicCache and the same inputs, a
3-token prefill at positions 4200..4202 then a decode step at 4203: the attention weights over all
4203 / 4204 keys, the attention output and the layer's output within relative error 1e-5."""

import os

import pytest

if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

import torch
from helpers.compare import compare
from helpers.hf_reference import build_hf_model
from transformers import DynamicCache

from stepper.model import synthetic_cache
from stepper.presets import preset
from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run
from stepper.weights.names import weight_shapes
from stepper.weights.seeded import SyntheticWeights

CACHED, PROMPT, SEED = 4200, 3, 3


def stepper_run(model: str, attn: str, monkeypatch):
    """stepper's tensors, and the latents and rotary keys its synthetic cache started with."""
    start = {}
    original = synthetic_cache.fill

    def fill(cache, *args):
        original(cache, *args)
        start["latent"], start["k_pe"] = cache.latent.copy(), cache.k_pe.copy()

    monkeypatch.setattr(synthetic_cache, "fill", fill)
    rec = Recorder()
    run(RunSpec(model=model, layer=1, prompt_len=PROMPT, cache_len=CACHED, decode=1, seed=SEED, attn=attn), [rec])
    return rec.tensors(), start


@pytest.mark.parametrize("model, attn", [("tiny", "naive"), ("tiny-v3", "naive"), ("tiny", "absorb")])
def test_a_layer_over_4200_cached_positions_matches_transformers(model, attn, monkeypatch):
    mine, start = stepper_run(model, attn, monkeypatch)
    assert start["latent"].shape[1] == CACHED
    assert mine["decode0.layers.1.self_attn.attn_weights"].shape[-1] == CACHED + PROMPT + 1

    cfg = preset(model)
    weights = SyntheticWeights(cfg, SEED)
    hf = build_hf_model(cfg.to_hf(), {n: weights.get(n) for n in weight_shapes(cfg)})
    layer = hf.model.layers[1]
    captured = {}
    layer.self_attn.register_forward_hook(lambda m, a, o: captured.update(attn_output=o[0], attn_weights=o[1]))
    cache = DynamicCache(config=hf.config)
    # transformers caches what stepper's does: the normed latent and the rotated key, as one head
    cache.update(torch.from_numpy(start["latent"][:, None]), torch.from_numpy(start["k_pe"]), 1)
    ref = {}
    with torch.no_grad():
        for phase, first, count in (("prefill", CACHED, PROMPT), ("decode0", CACHED + PROMPT, 1)):
            x = torch.from_numpy(mine[f"{phase}.layers.1.hidden_states"])
            positions = torch.arange(first, first + count)[None]
            mask = torch.zeros(1, 1, count, first + count)  # each query sees the cache and the new tokens up to itself
            mask[..., first:] = torch.triu(torch.full((count, count), float("-inf")), 1)
            out = layer(x, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                        position_embeddings=hf.model.rotary_emb(x, positions))
            ref[f"{phase}.layers.1.output"] = out.numpy()
            ref[f"{phase}.layers.1.self_attn.attn_weights"] = captured["attn_weights"].numpy()
            ref[f"{phase}.layers.1.self_attn.o_proj"] = captured["attn_output"].numpy()

    assert set(ref) <= set(mine)
    failures = {name: why for name in ref if (why := compare(name, mine, ref))}
    assert not failures, failures
    far = ref["decode0.layers.1.self_attn.attn_weights"][0, :, 0, :4096].sum(-1)  # [H]: the keys at 0..4095
    assert (far > 0.5).all(), far  # carry most weight: the far keys are compared, not only the near ones
