"""Every tensor stepper's Kimi Linear emits against transformers' KimiLinearForCausalLM on the same
weights: the tiny checkpoint `stepper synth` writes in the published layout (BF16, A_log, dt_bias
and the router's bias F32), which both load (transformers stacks the convs and the experts itself),
float32, a 70-token prompt (longer than one 64-token chunk) then two decode steps, at position 0
and from 4093 (past 4096: the family has no rotary tables, only the masks and the caches see the
positions), both forms of the delta rule, both MLA paths; relative error <= 1e-5.

Float32 round-off is about 1e-6 in the first layer's delta rule, on either side (both are within
1e-6 of a float64 recurrence on the same inputs, asserted below), and grows through the layers and
every RMSNorm of a small vector: over seeds 0-5 of these weights the worst tensor is 2.6e-6 to 8e-6
(a late o_norm), so the 1e-5 bound holds with room rather than by the seed's choice.
"""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from stepper import families
from stepper.families.kimi_linear import FAMILY
from stepper.kernels.kda_chunked import chunked
from stepper.model.cache import KVCache
from stepper.model.kda import gated_delta_rule
from stepper.model.transformer import Transformer
from stepper.seams.trace import Emitter, Recorder
from stepper.weights.checkpoint import Checkpoint
from tests.helpers import hf_kimi_linear
from tests.helpers.compare import compare, rel_err
from tests.helpers.kimi_linear import tiny_config, write_checkpoint

PROMPT, DECODE, SEED = 70, 2, 3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("kimi_linear") / "tiny", tiny_config(), seed=SEED)


@pytest.fixture(scope="module")
def reference(checkpoint):
    ids = np.random.default_rng(3).integers(0, 64, (1, PROMPT + DECODE))
    return ids, hf_kimi_linear.trace(hf_kimi_linear.load(checkpoint), ids[:, :PROMPT], ids[:, PROMPT:])


def stepper_trace(checkpoint, ids, delta_rule: str = "chunked", attn: str = "naive",
                  start: int = 0) -> dict[str, np.ndarray]:
    """stepper's model on the checkpoint, the family's decoder layer, prefill (at positions
    start .. start+PROMPT-1, an empty cache) then decode steps."""
    model = Transformer(Checkpoint(checkpoint, families.load_config), layer=FAMILY.decoder_layer)
    model.options = dataclasses.replace(model.options, delta_rule=delta_rule)
    cache, recorder = KVCache(model.config.num_hidden_layers), Recorder()
    steps = [("prefill", slice(0, PROMPT))] + [(f"decode{j}", slice(PROMPT + j, PROMPT + j + 1)) for j in range(DECODE)]
    for phase, span in steps:
        emit = Emitter([recorder]).phase(phase)
        model.forward(ids[:, span], np.arange(span.start, span.stop) + start, emit, cache, attn=attn)
    return {name: np.asarray(array) for name, array in recorder.tensors().items()}  # the states per token read


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_every_tensor_matches_transformers(checkpoint, reference, form):
    ids, ref = reference
    mine = stepper_trace(checkpoint, ids, form)
    emitted = set(mine)
    missing = sorted(n for n in emitted if n not in ref)
    assert missing == []
    problems = {n: why for n in sorted(emitted) if (why := compare(n, mine, ref))}
    assert problems == {}
    # the comparison covered both kinds of layer, both phases, and tensors that are not zero
    for name in ("prefill.layers.0.self_attn.delta", "decode1.layers.2.self_attn.state",
                 "decode0.layers.1.self_attn.attn_weights", "prefill.layers.2.mlp.routed_output", "decode1.logits"):
        assert name in emitted and np.abs(ref[name]).max() > 0
    assert mine["prefill.layers.0.self_attn.q_unit"].shape == (1, 2, PROMPT, 8)
    assert mine["prefill.layers.0.self_attn.state_per_chunk"].shape == (1, 2, 2, 8, 8)  # 64 + 6 tokens
    assert mine["prefill.layers.0.self_attn.state_per_token"].shape == (1, 2, PROMPT, 8, 8)


def test_past_position_4096_every_tensor_matches_transformers_on_both_mla_paths(checkpoint, reference):
    """The prompt at positions 4093..4162, the decode steps at 4163 and 4164: the model has no
    rotary tables, so every tensor is the one at position 0 on both sides; the masks and the caches
    must still count from the start."""
    ids, at_zero = reference
    ref = hf_kimi_linear.trace(hf_kimi_linear.load(checkpoint), ids[:, :PROMPT], ids[:, PROMPT:], start=4093)
    naive = stepper_trace(checkpoint, ids, start=4093)
    absorbed = stepper_trace(checkpoint, ids, attn="absorb", start=4093)
    assert [n for n in naive if n not in ref] == [] and len(naive) > 100
    problems = {n: why for n in sorted(naive) if (why := compare(n, naive, ref))}
    assert problems == {}
    shared = [n for n in absorbed if n in ref]
    assert {"decode1.logits", "decode1.layers.1.self_attn.attn_weights", "decode1.layers.2.mlp_output"} <= set(shared)
    problems = {n: why for n in shared if (why := compare(n, absorbed, ref))}
    assert problems == {}
    for phase in ("prefill", "decode0", "decode1"):  # no positional encoding: the same as at position 0
        assert compare(f"{phase}.logits", ref, at_zero) is None


def test_the_absorbed_mla_path_gives_the_same_logits(checkpoint, reference):
    ids, ref = reference
    mine = stepper_trace(checkpoint, ids, attn="absorb")
    for phase in ("prefill", "decode0", "decode1"):
        assert compare(f"{phase}.logits", mine, ref) is None


def test_both_sides_are_within_round_off_of_a_float64_recurrence(reference):
    """On transformers' own inputs to the first KDA layer's delta rule, transformers' chunked output
    and stepper's are both within 1e-6 of the recurrence in float64: the 1e-5 budget above is
    round-off, not a difference of method."""
    _, ref = reference
    at = "prefill.layers.0.self_attn."
    q = ref[at + "q_unit"].astype(np.float64) * 8**-0.5
    k = ref[at + "k_unit"].astype(np.float64)
    B, H, T, K = k.shape
    v = ref[at + "v_conv"].reshape(B, T, H, K).transpose(0, 2, 1, 3).astype(np.float64)
    g, beta = ref[at + "forget_gate"].astype(np.float64), ref[at + "beta"].astype(np.float64)
    exact, _, exact_state, _ = gated_delta_rule(q, k, v, g, beta, np.zeros((B, H, K, K)))
    out, _, state, _ = chunked(*(a.astype(np.float32) for a in (q, k, v, g, beta)), np.zeros((B, H, K, K), np.float32))
    assert rel_err(ref[at + "core_out"], exact) <= 1e-6 and rel_err(out, exact) <= 1e-6
    assert rel_err(ref[at + "state"], exact_state) <= 1e-6 and rel_err(state, exact_state) <= 1e-6



@pytest.mark.parametrize("name", ["tiny-kimi-linear-kda", "tiny-kimi-linear-mla"])
def test_a_shipped_fixtures_weights_load_in_transformers_as_written(name):
    """The fixture's weights folder, untouched (the embedding and its layer's tensors): its config.json's
    token ids lie inside the vocabulary of 1000; without them transformers takes the published model's
    (pad 163839), and nn.Embedding refuses that padding row. The model is built and holds the folder's
    tensors; KDA layer 0 on the fixture's prompt gives the fixture's layer output."""
    import torch
    from safetensors.torch import load_file as load_torch

    fixture = Path(__file__).resolve().parents[2] / "fixtures" / name
    model = hf_kimi_linear.load(fixture / "weights")
    assert model.model.embed_tokens.padding_idx == 999
    stored = {}
    for shard in (fixture / "weights").glob("*.safetensors"):
        stored.update(load_torch(str(shard)))
    assert torch.equal(model.model.embed_tokens.weight, stored["model.embed_tokens.weight"].float())
    if name.endswith("kda"):  # layer 0's input is the embedding, the model's own
        prompt = json.loads((fixture / "manifest.json").read_text())["inputs"]["prompt_ids"]
        with torch.no_grad():
            hidden = model(torch.tensor([prompt]), output_hidden_states=True).hidden_states[1]
        expected = load_file(str(fixture / "tensors.safetensors"))["prefill.layers.0.output"]
        assert rel_err(hidden.numpy(), expected) <= 1e-5
