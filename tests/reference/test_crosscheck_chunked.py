"""A long prefill run in chunks (`--chunk`, RunSpec.chunk), past position 4096, against transformers'
prefill of the whole prompt at once, then a cached decode step: each named tensor within relative
error 1e-5 (helpers.compare), as in every cross-check.

The other cross-checks' prompts are a few positions, so their attention is made on whole arrays.
Here 2100 positions from 4093 run as chunks of 768, 768 and 564, each over the cache the chunks
before it left: the first chunk's scores [1, 4, 768, 768] are made whole, the next two's
([1, 4, 768, 1536], [1, 4, 564, 2100]) pass kernels.attention.WHOLE_SCORES and are made in tiles
(of up to 1024 keys, so a row's keys span several). Shown, each chunk's rows of the scores and
weights are widened with the masked future, as the whole prompt's tensors hold it. On tiny (Kimi
K2's YaRN; the naive path shown whole, the absorbed one's online softmax) and on tiny-minicpm3
(another attention: Llama's rotate_half RoPE, LongRoPE's tables, muP scalings)."""

import os

import numpy as np
import pytest

if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

from helpers.compare import compare
from helpers.configs import family_preset
from helpers.hf_families import hf_family_trace
from helpers.hf_reference import hf_trace

from stepper.kernels import attention as kernels
from stepper.presets import preset
from stepper.seams.trace import Filter, Recorder
from stepper.session import RunSpec, run
from stepper.tensors.chunked import Chunked
from stepper.weights.names import weight_shapes
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.source import ArrayWeights
from stepper.weights.synth_checkpoint import synth_checkpoint

START, LENGTH, CHUNK = 4093, 2100, 768


def prompt(vocab: int) -> tuple[int, ...]:
    return tuple(int(i) for i in np.random.default_rng(4).integers(0, vocab, LENGTH))


def chunked(spec: RunSpec, weights=None, shown_only: tuple[str, ...] = ()) -> tuple[dict, tuple[int, ...]]:
    """stepper's tensors of a chunked run (those whose names end with one of `shown_only`, if
    given), read whole: each Chunked tensor's values are the chunks replayed, once for all of them
    (keep_when_read, as stepper.run's are)."""
    rec = Recorder()
    wanted = (lambda event: event.name.endswith(shown_only)) if shown_only else (lambda event: True)
    result = run(spec, [Filter(wanted, [rec])], weights)
    shown = rec.tensors()
    assert isinstance(shown["prefill.layers.1.self_attn.o_proj"], Chunked)
    for tensor in shown.values():
        if isinstance(tensor, Chunked):
            tensor.keep_when_read()
    return {name: np.asarray(t) for name, t in shown.items()}, result.generated


def assert_tiled_chunks() -> None:
    """The chunks after the first are past the whole-array bound: their attention is made in tiles."""
    assert 4 * CHUNK * CHUNK <= kernels.WHOLE_SCORES < min(4 * CHUNK * 2 * CHUNK, 4 * (LENGTH - 2 * CHUNK) * LENGTH)


def tiny_case(attn: str, shown_only: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """stepper's chunked run of tiny from START and transformers' whole prefill, then a decode step."""
    cfg = preset("tiny")
    synthetic = SyntheticWeights(cfg, 0)
    arrays = {n: synthetic.get(n) for n in weight_shapes(cfg)}
    ids = prompt(cfg.vocab_size)
    spec = RunSpec(model="tiny", ids=ids, start_pos=START, decode=1, attn=attn, chunk=CHUNK)
    mine, generated = chunked(spec, ArrayWeights(cfg, arrays), shown_only)
    ref = hf_trace(cfg.to_hf(), arrays, np.array([ids]), start_pos=START, decode_ids=[np.array([generated])])
    return mine, ref


def test_a_chunked_prefill_past_4096_matches_transformers_whole_prefill():
    """Every tensor shown: the scores and weights are made a tile of whole rows at a time (the
    shown path, kernels.attention.Softmaxed), the output with them."""
    assert_tiled_chunks()
    mine, ref = tiny_case("naive")
    assert list(mine) and set(mine) == set(ref), sorted(set(mine) ^ set(ref))
    failures = {name: why for name in mine if (why := compare(name, mine, ref))}
    assert not failures, failures
    assert mine["prefill.layers.2.self_attn.attn_weights"].shape == (1, 4, LENGTH, LENGTH)


def test_the_absorbed_chunks_online_softmax_matches_transformers(monkeypatch):
    """Only the attention's and the layers' outputs and the logits shown, as a run filtered to them
    shows them: no sink looks at the scores, so the tiled chunks' attention is the online softmax
    over key tiles (kernels.attention.attend), on the absorbed path's shared latent keys."""
    assert_tiled_chunks()
    attended, attend = [], kernels.attend
    monkeypatch.setattr(kernels, "attend", lambda ops: attended.append(ops.shape) or attend(ops))
    mine, ref = tiny_case("absorb", ("self_attn.o_proj", ".output", "logits"))
    assert {shape[2:] for shape in attended} == {(CHUNK, 2 * CHUNK), (LENGTH - 2 * CHUNK, LENGTH)}
    # both steps: each layer's attention output and output, the two MoE layers' router logits, the logits
    assert len(mine) == 2 * (3 * 2 + 2 + 1) and set(mine) <= set(ref)
    failures = {name: why for name in mine if (why := compare(name, mine, ref))}
    assert not failures, failures


def test_a_chunked_minicpm3_prefill_past_4096_matches_transformers(tmp_path):
    assert_tiled_chunks()
    folder = synth_checkpoint(SyntheticWeights(family_preset("tiny-minicpm3"), seed=3), tmp_path / "minicpm3")
    ids = prompt(family_preset("tiny-minicpm3").vocab_size)
    mine, generated = chunked(RunSpec(model=str(folder), ids=ids, start_pos=START, decode=1, attn="naive", chunk=CHUNK))
    ref = hf_family_trace(folder, np.array([ids]), start_pos=START, decode_ids=[np.array([generated])])
    assert list(mine) and set(mine) == set(ref), sorted(set(mine) ^ set(ref))
    failures = {name: why for name in mine if (why := compare(name, mine, ref))}
    assert not failures, failures
