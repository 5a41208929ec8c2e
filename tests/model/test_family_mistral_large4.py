"""tiny-mistral-large4 without transformers: what each kind of layer emits (a NoPE layer no rotary
tensor, a layer reading layer 0's latent no kv_a of its own), the cache the memory plan counts (a
shared latent once), a lone layer's synthetic cache on each kind, `synth` of a slice of layers that
runs alone (LeRoPE's alpha, which every layer reads, written with it), and a tensor missing from
Mistral's consolidated files named as they would store it. The run against transformers:
tests/model/test_mistral_large4_crosscheck.py."""

import json

import numpy as np
import pytest
from helpers.cli import one_line, stepper
from helpers.configs import family_preset
from safetensors.numpy import load_file, save_file

from stepper.families import derive, family_for
from stepper.seams.trace import Emitter

NAME = "tiny-mistral-large4"  # layer 0 dense, 1 MoE, 2 reads layer 0's latent and layer 1's choice, 3 NoPE
ROTARY = ("self_attn.q_pe", "self_attn.k_pe", "self_attn.q_pe_rope", "self_attn.k_pe_rope", "self_attn.kv_a")


@pytest.mark.parametrize("attn", ["naive", "absorb"])
def test_each_kind_of_layer_emits_its_own_tensors(attn):
    cfg = family_preset(NAME)
    rope, reader, nope = (derive.layer_keys(cfg, layer, attn) for layer in (1, 2, 3))
    assert set(ROTARY[:4]) <= set(rope) and "self_attn.indexer.q_rope" in rope
    assert "self_attn.shared_latent" in reader and not {"self_attn.kv_a", "self_attn.compressed_kv"} & set(reader)
    assert "self_attn.q_pe_rope" in reader and "self_attn.k_pe_rope" not in reader  # the source turned its key
    assert not set(ROTARY) & set(nope) and "self_attn.indexer.q_rope" not in nope
    assert "self_attn.compressed_kv_norm" in nope and "self_attn.indexer.q_scaled" in nope


@pytest.mark.parametrize("attn", ["naive", "absorb"])
def test_the_memory_plan_counts_what_the_caches_hold_a_shared_latent_once(attn):
    cfg = family_preset(NAME)
    family = family_for(cfg)
    model, cache, T = family.build(family.synthetic(cfg, 0)), family.cache(cfg), 9
    model.forward(np.arange(T)[None], np.arange(T), Emitter(), cache, attn=attn)
    assert cache.layers[2].latent is cache.layers[0].latent and cache.layers[3].k_pe.shape[-1] == 0
    held = {id(a): a for layer in cache.layers for a in (layer.latent, layer.k_pe, layer.index_keys,
                                                         layer.key_states, layer.value_states) if a is not None}
    assert sum(a.nbytes for a in held.values()) == family.cache_bytes(cfg, range(4), T, attn, "exact")


def test_the_run_header_says_what_the_latent_caches_hold():
    out = stepper("run", "--model", NAME, "--prompt-len", 6, "--plain")
    assert out.returncode == 0, out.stderr
    # layers 0 and 1 keep 64 + 16 floats a position, NoPE layer 3 64, layer 2 layer 0's
    assert ("latents: 3 of 4 layers keep their own (1 of them NoPE, no rotary key), 1 read an earlier layer's: "
            "896 B a position for the model, 5,376 B over 6 positions") in out.stdout


@pytest.mark.parametrize("layer, attn", [(3, "naive"), (3, "absorb"), (1, "naive")])
def test_a_lone_layers_synthetic_cache(layer, attn):
    out = stepper("run", "--model", NAME, "--layer", layer, "--cache-len", 40, "--attn", attn, "--plain")
    assert out.returncode == 0, out.stderr
    assert f"layers.{layer}.self_attn.indexer.keys  [B=1 batch, S=47 attended positions" in out.stdout


def test_a_slice_of_layers_synth_writes_runs_alone(tmp_path):
    assert stepper("synth", "--model", NAME, "--layers", "1:2", "--out", tmp_path / "slice").returncode == 0
    assert "lerope.alpha" in load_file(str(tmp_path / "slice" / "model-00002-of-00002.safetensors"))
    out = stepper("run", "--model", tmp_path / "slice", "--layer", 1, "--prompt-len", 4, "--plain")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("stored", ["layers.1.attention.wkv_b.weight", "lerope.alpha"])
def test_a_missing_tensor_is_named_as_the_files_would_store_it(tmp_path, stored):
    folder = tmp_path / "ml4"
    assert stepper("synth", "--model", NAME, "--out", folder).returncode == 0
    shard = next(p for p in folder.glob("*.safetensors") if stored in load_file(str(p)))
    tensors = load_file(str(shard))
    del tensors[stored]
    save_file(tensors, str(shard), {"format": "pt"})
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    del index["weight_map"][stored]
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert f"'{stored}' is missing" in one_line(stepper("run", "--model", folder))
