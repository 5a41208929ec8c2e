"""The Python API: `stepper.run` keeps a run's tensors, names, config and tokens; bad arguments are
one sentence naming the argument."""

import html
import re
import subprocess
import sys
from pathlib import Path

import helpers.cli
import numpy as np
import pytest
import safetensors.numpy

import stepper
from stepper import catalog, prefill
from stepper.errors import StepperError
from stepper.kernels import parallel
from stepper.model.ops import rms_norm
from stepper.planning import memory
from stepper.planning.memory import Need
from stepper.presets import preset
from stepper.seams.trace import Recorder
from stepper.session import RunSpec
from stepper.session import run as session_run
from stepper.tensors.chunked import Chunked
from stepper.tensors.tiled import Tiled
from stepper.weights.seeded import SyntheticWeights

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run():
    return stepper.run("tiny", ids=[1, 2, 3], decode=1)


def test_the_issue_example_runs_as_written(run):
    kv = run["prefill.layers.1.self_attn.compressed_kv"]
    assert isinstance(kv, np.ndarray) and kv.shape == (1, 3, run.config.kv_lora_rank)
    assert run.names[:3] == ["prefill.embed", "prefill.rope_cos", "prefill.rope_sin"]
    assert run.explain("k_pe")["name"] == "self_attn.k_pe"
    assert len(run.generated) == 1 and run.config.name == "tiny"


def test_tensors_names_and_tokens_are_those_of_the_same_run_through_the_session(run):
    rec = Recorder()
    result = session_run(RunSpec(ids=(1, 2, 3), decode=1), [rec])
    assert run.names == [e.name for e in rec.events] == run.emitted
    for event in rec.events:
        assert np.array_equal(run[event.name], event.array), event.name
    assert run.generated == result.generated and run.prompt == (1, 2, 3)


def test_compressed_kv_is_the_latent_part_of_kv_a_of_the_normed_input_computed_by_hand(run):
    w = SyntheticWeights(preset("tiny"), 0)
    x = run["prefill.layers.1.hidden_states"]
    normed = rms_norm(x, w.get("model.layers.1.input_layernorm.weight"), run.config.rms_norm_eps)
    kv_a = normed.astype(np.float64) @ w.get("model.layers.1.self_attn.kv_a_proj_with_mqa.weight").T.astype(np.float64)
    np.testing.assert_allclose(run["prefill.layers.1.self_attn.compressed_kv"], kv_a[..., :run.config.kv_lora_rank],
                               rtol=1e-5, atol=1e-5)


def test_a_short_name_finds_its_one_tensor_and_an_ambiguous_one_is_refused(run):
    assert run["decode0.logits"] is run["decode0.lo*"] is run.event("decode0.logits").array
    assert run["decode0.layers.2.self_attn.k_pe"] is run["decode0.layers.2.*k_pe"]
    with pytest.raises(KeyError, match="matches 2 kept tensors"):
        run["layers.1.self_attn.k_pe"]  # prefill and decode0
    with pytest.raises(KeyError, match="did you mean"):
        run["layers.1.self_attn.compresed_kv"]


def test_tensors_are_read_only(run):
    with pytest.raises(ValueError):
        run["prefill.embed"][0, 0, 0] = 1


def test_a_run_is_a_mapping_in_execution_order(run):
    assert list(run) == run.names and len(run) == len(run.names) and "prefill.logits" in run
    assert dict(run.items())["decode0.logits"].shape == (1, 1, run.config.vocab_size)


def test_explain_gives_the_catalogue_entry_as_data_and_refuses_an_unknown_name(run):
    entry = run.explain("prefill.layers.1.mlp.gate.topk_idx")
    assert entry["dims"] == ["N", "k"] and "formula" in entry and "aliases" in entry
    entry["dims"].append("x")
    assert run.explain("mlp.gate.topk_idx")["dims"] == ["N", "k"]  # a copy
    with pytest.raises(KeyError, match="no tensor named 'no_such_tensor' in the catalogue"):
        run.explain("no_such_tensor")
    with pytest.raises(KeyError, match="did you mean compressed_kv"):  # as `stepper explain` answers a typo
        run.explain("compresed_kv")
    with pytest.raises(StepperError, match="^explain expects a tensor name \\(a str\\), got int$"):
        run.explain(3)


def test_explain_of_a_tensor_the_run_never_emits_gives_its_entry_and_the_preset_that_emits_it(run):
    """As `stepper explain` shows it (tests/cli/test_v4_new_user.py), not refused as before."""
    v4 = stepper.run("tiny-v4", prompt_len=3)
    entry = v4.explain("self_attn.k_pe")
    assert entry["name"] == "self_attn.k_pe" and entry["emitted_by"] == "tiny"
    assert entry["dims"] == ["B", "one", "T", "rope"]
    assert run.explain("hc_attn.comb")["emitted_by"] == "tiny-v4"  # a family of other streams
    assert run.explain("self_attn.state")["emitted_by"] == "tiny-kimi-linear"  # the same streams
    assert "emitted_by" not in v4.explain("hc_attn.comb") and "emitted_by" not in run.explain("k_pe")
    with pytest.raises(KeyError, match=r"^no tensor named 'nosuch' in the catalogue \(stepper tree lists them\)$"):
        v4.explain("nosuch")
    with pytest.raises(KeyError, match=r"^layers.9.self_attn.k_pe: layer 9 out of range: model tiny has layers 0..2$"):
        run.explain("layers.9.self_attn.k_pe")  # as `stepper explain` refuses it (it answered k_pe's entry)


def test_explain_reads_other_implementations_names_back_as_stepper_explain_does(run):
    """The names `fixtures verify` prints (transformers', DeepSeek's inference code's, llama.cpp's)
    and a checkpoint's parameters, read through the naming tables as the command reads them."""
    assert run.explain("model.layers.1.self_attn.kv_a_proj_with_mqa")["name"] == "self_attn.kv_a"  # transformers'
    assert run.explain("model.layers.1.self_attn.q_a_proj.weight")["name"] == "self_attn.q_a"  # its parameter
    with pytest.raises(KeyError, match=r"^'kv_cmpr-1' names 2 catalogue entries \(self_attn.compressed_kv, "
                                       r"self_attn.compressed_kv_norm\); give one of them$"):  # llama.cpp's, two values
        run.explain("kv_cmpr-1")
    with pytest.raises(KeyError, match="layer 1 of tiny has no parameter 'model.layers.1.self_attn.qq.weight'"):
        run.explain("model.layers.1.self_attn.qq.weight")
    assert stepper.run("tiny-v4", prompt_len=3).explain("attn.kv#2")["name"] == "attn.kv"  # inference's second kv


def test_keep_keeps_only_the_matching_tensors():
    run = stepper.run("tiny", prompt_len=2, keep=["*compressed_kv", "norm"])
    assert run.names == ["layers.0.self_attn.compressed_kv", "layers.1.self_attn.compressed_kv",
                         "layers.2.self_attn.compressed_kv", "norm"]
    assert len(run.emitted) > 60
    with pytest.raises(KeyError, match="emitted but not kept"):
        run["layers.1.self_attn.k_pe"]


def test_a_keep_glob_that_matches_nothing_is_an_error_before_the_run():
    with pytest.raises(StepperError, match="keep= compresed: matches no tensor of this run"):
        stepper.run("tiny", prompt_len=2, keep="compresed")


def test_keeping_everything_that_would_not_fit_is_refused_naming_keep(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 2**20)
    with pytest.raises(StepperError, match=r"would need about .* lower it with keep="):
        stepper.run("tiny", prompt_len=64)
    with pytest.raises(StepperError, match=r"lower it with prompt_len="):
        monkeypatch.setattr(memory, "needs", lambda plan, kept, lower, looked: [Need("scores", 2**30, "--prompt-len")])
        stepper.run("tiny", prompt_len=2, keep="logits")


@pytest.mark.parametrize("kwargs, message", [
    ({"ids": "1,2,3"}, "ids= expects a list of token ids"),
    ({"ids": [1, 2.5]}, "ids= expects a list of token ids"),
    ({"ids": [1], "prompt_len": 3}, "give ids= or prompt_len=, not both"),
    ({"decode": -1}, "decode= expects an integer >= 0"),
    ({"decode": True}, "decode= expects an integer >= 0"),
    ({"prompt_len": 0}, "prompt_len= expects an integer >= 1"),
    ({"attn": "fast"}, "attn= expects one of auto, naive, absorb"),
    ({"layers": "1-2"}, "layers= expects"),
    ({"layer": 1, "layers": "0:2"}, "^give layer= or layers=, not both$"),  # layers= was dropped
    ({"layers": "2:1"}, r"^layers='2:1' is reversed: \(A, B\) runs layers A to B-1"),
    ({"layers": (1, 1)}, r"^layers=\(1, 1\) is empty"),
    ({"layers": "3:"}, "^layers 3: out of range: model tiny has layers 0..2$"),  # not 3:3
    ({"layer": "1"}, "layer= expects an integer >= 0 or None"),
    ({"keep": 3}, "keep= expects a glob, a list of globs or a function of the name"),
    ({"patch": 5}, "patch= expects a dict"),
    ({"patch": {"logits": 0}}, "patch= expects name patterns .* mapped to functions"),
    ({"weights": "w"}, "weights= expects a weight source"),
    ({"model": "no-such-model"}, "unknown model 'no-such-model'"),
    # an array is named by its type and shape, never printed (the residual stream as input= was a 17 KB message)
    ({"layer": 1, "input": np.zeros((1, 3, 320), np.float32)},
     (r"^input= expects the path of a safetensors file holding the layer's input \(a --dump, say\), got "
     r"an array of shape \(1, 3, 320\) \(float32\)$")),
    ({"layer": 1, "input": {"x": np.zeros((1, 3, 320), np.float32)}}, r"input= expects .*, got a dict of length 1$"),
    ({"model": np.zeros((1, 3, 320), np.float32)},
     r"^model= expects a name or a path, got an array of shape \(1, 3, 320\) \(float32\)$"),
    ({"layers": np.zeros((64, 64), np.float32)},
     r"^layers= expects \(A, B\) or 'A:B' \(layers A to B-1\), got an array of shape \(64, 64\) \(float32\)$"),
    ({"ids": [5000]}, "token id 5000 out of range"),
    ({"ids": []}, "^ids= is empty: give at least one token id$"),
    ({"ids": [[]]}, "^ids= is empty: give at least one token id$"),
    # the session's own checks, in the API's words (the command line's are --cache-len, --layer N)
    ({"cache_len": 3}, "^cache_len=3 fills one layer's cache: use it with layer=N$"),
    ({"index_scoring": "fp8"}, r"^index_scoring=fp8 scores the Lightning Indexer, and model tiny \(kimi_k2\) has none"),
])
def test_bad_arguments_are_one_sentence_naming_the_argument(kwargs, message):
    with pytest.raises(StepperError, match=message) as e:
        stepper.run(**kwargs)
    assert "\n" not in str(e.value)


def test_weights_of_another_model_than_the_one_named_are_refused_and_name_the_run_without_one():
    """weights= of tiny-glm5 beside model "tiny" ran tiny-glm5 while run.spec.model said tiny."""
    from stepper.presets import preset
    from stepper.weights.seeded import SyntheticWeights

    glm = SyntheticWeights(preset("tiny-glm5"), seed=3)
    with pytest.raises(StepperError, match=r"^model='tiny' with weights= of tiny-glm5: the weights' model is what "):
        stepper.run("tiny", weights=glm)
    run = stepper.run(weights=glm, prompt_len=3)
    assert run.spec.model == run.config.name == "tiny-glm5"
    assert stepper.run("tiny-glm5", weights=glm, prompt_len=3).spec.model == "tiny-glm5"
    assert stepper.run(prompt_len=3).spec.model == "tiny"


def test_layers_as_a_tuple_or_text_and_a_lone_layer():
    a = stepper.run("tiny", prompt_len=2, layers=(1, 2), keep="*output")
    b = stepper.run("tiny", prompt_len=2, layers="1:2", keep="*output")
    assert a.names == b.names == ["layers.1.self_attn.attn_output", "layers.1.mlp.routed_output",
                                  "layers.1.mlp.shared_output", "layers.1.mlp_output", "layers.1.output"]
    alone = stepper.run("tiny", prompt_len=2, layer=1, decode=2, keep="*.output")
    assert alone.names == ["prefill.layers.1.output", "decode0.layers.1.output", "decode1.layers.1.output"]
    assert len(alone.generated) == 2


def test_import_stepper_is_light():
    code = "import sys, stepper; print(stepper.__version__, 'numpy' in sys.modules, 'stepper.api' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [stepper.__version__, "False", "False"]
    with pytest.raises(AttributeError):
        _ = stepper.no_such_thing


def test_explain_prefers_the_entry_this_run_emits():
    """topk_idx is the router's and DeepSeek-V3.2's indexer's: a run without an indexer means its router's."""
    assert stepper.run("tiny", prompt_len=2, keep=["*topk_idx"]).explain("topk_idx")["name"] == "mlp.gate.topk_idx"
    with pytest.raises(stepper.api.NotFound, match="names 2 catalogue entries .*; give one of them"):
        stepper.run("tiny-v32", prompt_len=2, keep=["*topk_idx"]).explain("topk_idx")


def test_a_chunked_prefill_keeps_every_tensor_once_equal_to_the_whole_prompts():
    whole = stepper.run(model="tiny", prompt_len=21, decode=1)
    chunked = stepper.run(model="tiny", prompt_len=21, decode=1, chunk=8)
    assert chunked.names == whole.names and chunked.generated == whole.generated
    lazy = {name: chunked[name] for name in chunked.names if isinstance(chunked[name], Chunked)}
    assert {t.chunks for t in lazy.values()} == {3}, "the prompt runs in three chunks"
    for name in ("prefill.layers.0.self_attn.attn_weights", "prefill.layers.1.mlp.gate.topk_idx",
                 "prefill.layers.2.output"):
        assert isinstance(chunked[name], stepper.LazyTensor), name
    for name in whole.names:  # each read whole, as a user reads it
        a, b = np.asarray(whole[name], np.float64), np.asarray(chunked[name], np.float64)
        np.testing.assert_allclose(b, a, rtol=1e-5,
                                   atol=1e-5 * np.nanmax(np.abs(np.where(np.isfinite(a), a, 0))), err_msg=name)
    with pytest.raises(StepperError, match="chunk= with patch="):
        stepper.run(model="tiny", chunk=4, patch={"*q_a": "x*2"})


def test_a_run_with_use_runs_the_prompt_whole_as_a_chunked_read_would_replay_it_without_the_functions(tmp_path,
                                                                                                        monkeypatch):
    """A chunked tensor is made when read, after run() returned: its replay once ran stepper's own
    rms_norm on a cache the learner's had made (104 tensors, 92 differing from the whole run's)."""
    (tmp_path / "rms2.py").write_text("import numpy as np\n\ndef rms_norm(x, weight, eps):\n"
                                      "    return (2 * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight)"
                                      ".astype(np.float32)\n")
    mine = tmp_path / "rms2.py"
    whole = stepper.run("tiny", prompt_len=21, chunk=0, use=mine)
    auto = stepper.run("tiny", prompt_len=21, use=mine)  # auto: whole, as with a patch
    assert not any(isinstance(auto[name], stepper.LazyTensor) for name in auto.names)
    assert stepper.diff(whole, auto).count("differs") == 0
    plain = stepper.run("tiny", prompt_len=21)
    assert not np.allclose(whole["layers.0.input_layernorm"], plain["layers.0.input_layernorm"])  # the file's, used
    with pytest.raises(StepperError, match="chunk= with use=: .* made again when read, without your functions"):
        stepper.run("tiny", prompt_len=21, chunk=8, use=mine)
    with pytest.raises(StepperError, match="use= expects a file path or a list of them, got int"):
        stepper.run("tiny", use=3)
    monkeypatch.setattr(memory, "available_bytes", lambda: 16 * 2**20)  # where auto chunks a 300-token prompt
    assert stepper.run("tiny", prompt_len=300, keep="logits").spec.chunk == 128
    with pytest.raises(StepperError, match="would need about"):  # with use=, whole or not at all: never chunked
        stepper.run("tiny", prompt_len=300, keep="logits", use=mine)


def test_a_learners_softmax_makes_a_long_prompts_tiled_attention_too(tmp_path):
    """Past whole_fits the attention runs over tiles with an online softmax that called no
    exercise: a learner's softmax was silently not used (its run equal to a plain one)."""
    (tmp_path / "soft2.py").write_text("import numpy as np\n\ndef softmax(x, axis=-1):\n    x = x * 0.5\n"
                                       "    e = np.exp(x - np.max(x, axis=axis, keepdims=True))\n"
                                       "    return (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)\n")
    keep = ["layers.0.self_attn.attn_*", "layers.0.self_attn.value_states"]
    mine = stepper.run("tiny", prompt_len=1100, use=tmp_path / "soft2.py", keep=keep)  # 4 x 1100 x 1100 scores
    assert isinstance(mine["layers.0.self_attn.attn_weights"], stepper.LazyTensor)  # tiled: read after the run
    scores, weights = (np.asarray(mine[f"layers.0.self_attn.attn_{n}"], np.float64) for n in ("scores", "weights"))
    halved = np.exp(0.5 * (scores - scores.max(-1, keepdims=True)))
    np.testing.assert_allclose(weights, halved / halved.sum(-1, keepdims=True), atol=1e-6)
    values = np.asarray(mine["layers.0.self_attn.value_states"], np.float64)
    out = np.asarray(mine["layers.0.self_attn.attn_output"])
    made = np.einsum("bhts,bhsv->bthv", weights, values).reshape(out.shape)
    np.testing.assert_allclose(out, made, atol=1e-5)  # made with the learner's weights, not the online softmax's


def test_a_learners_causal_mask_rules_a_long_prompts_tiled_attention_too(tmp_path):
    """The tiles built their own causal mask: a learner's (here its rule inverted: a query sees
    itself and the keys after it) was used on short prompts only."""
    (tmp_path / "mask2.py").write_text("import numpy as np\n\ndef causal_mask(t, s):\n"
                                       "    return np.arange(s)[None, :] >= np.arange(t)[:, None] + (s - t)\n")
    keep = ["layers.0.self_attn.attn_weights", "layers.0.self_attn.attn_output", "layers.0.self_attn.value_states"]
    mine = stepper.run("tiny", prompt_len=1100, use=tmp_path / "mask2.py", keep=keep)
    weights = np.asarray(mine["layers.0.self_attn.attn_weights"], np.float64)  # [1, 4, T, S], made a tile at a time
    seen = np.arange(1100)[None, :] >= np.arange(1100)[:, None]
    assert not weights[..., ~seen].any() and np.allclose(weights.sum(-1), 1)
    values = np.asarray(mine["layers.0.self_attn.value_states"], np.float64)
    out = np.asarray(mine["layers.0.self_attn.attn_output"])
    np.testing.assert_allclose(out, np.einsum("bhts,bhsv->bthv", weights, values).reshape(out.shape), atol=1e-5)


def test_run_name_is_a_read_only_array_when_held_and_a_lazy_tensor_of_a_chunked_run_read_in_one_replay(monkeypatch):
    """As docs/python.md says: a held tensor is a read-only NumPy array; a chunked prefill's tensor
    over the positions is a LazyTensor, and reading all of them (twice) replays each chunk once."""
    whole = stepper.run(model="tiny", prompt_len=21)
    assert all(type(whole[n]) is np.ndarray and not whole[n].flags.writeable for n in whole.names)
    replayed = []
    replay = prefill.Replay.run
    monkeypatch.setattr(prefill.Replay, "run", lambda self, k, sinks: replayed.append(k) or replay(self, k, sinks))
    chunked = stepper.run(model="tiny", prompt_len=21, chunk=8)
    held = [n for n in chunked.names if type(chunked[n]) is np.ndarray]
    lazy = [n for n in chunked.names if isinstance(chunked[n], stepper.LazyTensor)]
    assert sorted(held + lazy) == sorted(chunked.names) and len(lazy) == 98 and "layers.1.output" in lazy
    # the last chunk's: the cache's
    assert held == [f"layers.{i}.self_attn.{t}_states" for i in range(3) for t in ("key", "value")]
    after_the_prefill = len(replayed)  # the histograms' pass: each chunk once
    first = chunked[lazy[0]]
    assert first.shape == whole[lazy[0]].shape and first.dtype == whole[lazy[0]].dtype
    assert first.cost == "reading it replays the prefill's 3 chunks once and makes the 98 chunked tensors the run " \
                         f"keeps ({sum(chunked[n].nbytes for n in lazy) / 2**20:,.1f} MiB): the next reads cost nothing"
    drawn = "layers.1.self_attn.attn_weights"
    assert repr(chunked.picture("attention", drawn)) == repr(whole.picture("attention", drawn))
    for _ in range(2):
        for name in lazy:
            a, b = whole[name].astype(np.float64), chunked[name].numpy().astype(np.float64)
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.nanmax(np.abs(np.where(np.isfinite(a), a, 0))),
                                       err_msg=name)
    assert replayed[after_the_prefill:] == [0, 1, 2]  # a picture and 98 tensors read twice: one replay of the 3 chunks
    assert chunked[lazy[0]].cost == "held since a tensor of its run was read (no cost)"
    assert np.array_equal(np.asarray(chunked[lazy[1]]), chunked[lazy[1]].numpy())


def test_a_lone_layer_starts_after_a_synthetic_cache():
    run = stepper.run(model="tiny", layer=1, cache_len=5000, prompt_len=3, keep="*attn_weights")
    weights = np.asarray(run["attn_weights"])
    assert weights.shape == (1, 4, 3, 5003)  # the new positions attend the 5000 cached ones and themselves
    np.testing.assert_allclose(weights.sum(axis=-1), 1, rtol=1e-5)
    assert np.all(weights[0, :, 0, 5001:] == 0)  # the first new position sees nothing after itself


def test_auto_chooses_the_path_the_command_line_chooses():
    """attn="auto" as `stepper run --attn auto` decides: absorbed throughout for a prefill over a
    longer synthetic cache, and where the naive estimate is over half the memory available."""
    long = {"layer": 1, "cache_len": 50, "prompt_len": 2, "keep": "*attn_weights"}
    run = stepper.run("tiny", **long)
    assert run.spec.attn == "absorb"
    assert stepper.diff(run, stepper.run("tiny", **{**long, "attn": "absorb"})).count("same") == len(run) == 1
    cli = helpers.cli.stepper("run", "--plain", "--layer", "1", "--cache-len", "50", "--prompt-len", "2", "--only",
                              "*attn_weights")
    assert "--attn auto: absorbed throughout" in cli.stdout
    assert stepper.run("tiny", prompt_len=2, keep="logits").spec.attn == "auto"  # naive prefill: it fits


def test_auto_is_absorbed_where_the_naive_estimate_is_over_half_the_memory(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 2 * 2**20)  # the naive run needs about 1 MiB
    assert stepper.run("tiny", keep="logits").spec.attn == "absorb"
    assert stepper.run("tiny", keep="logits", attn="naive").spec.attn == "naive"


def test_dir_lists_the_api_for_completion_without_loading_it():
    code = ("import sys, stepper; "
            "print(*(n for n in dir(stepper) if not n.startswith('_')), 'stepper.api' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["Diff", "LazyTensor", "LongRunWarning", "Run", "StepperError", "diff", "force_experts", "load",
                   "run", "version", "zero_expert", "zero_head", "zero_router_bias", "False"]
    assert stepper.StepperError is StepperError and stepper.diff is stepper.api.diff


def test_keep_takes_a_function_of_the_name():
    by_function = stepper.run("tiny", prompt_len=2, decode=1, keep=lambda name: name.endswith(".compressed_kv"))
    by_glob = stepper.run("tiny", prompt_len=2, decode=1, keep="*compressed_kv")
    assert by_function.names == by_glob.names and len(by_function.names) == 6  # 3 layers x (prefill, decode0)
    for name in by_glob.names:
        assert np.array_equal(by_function[name], by_glob[name]), name
    with pytest.raises(StepperError, match=r"^keep= test_keep_takes_a_function_of_the_name.<locals>.<lambda>: keeps "
                                           r"no tensor of this run \(it is given full names, e.g. decode0.logits\)$"):
        stepper.run("tiny", prompt_len=2, decode=1, keep=lambda name: name == "k_pe")


def test_a_patch_function_that_cannot_take_array_and_name_is_refused_naming_it():
    def halve(a):
        return a * 0.5

    with pytest.raises(StepperError, match=r"^patch= \*k_pe: test_.*<locals>.halve\(a\) cannot take \(array, name\); "
                                           r"expected fn\(array, name\), e.g. lambda a, name: a \* 0.5$"):
        stepper.run("tiny", prompt_len=2, patch={"*k_pe": halve})
    with pytest.raises(StepperError, match=r"<lambda>\(a, name, scale\) cannot take"):
        stepper.run("tiny", prompt_len=2, patch={"*k_pe": lambda a, name, scale: a * scale})
    kept = stepper.run("tiny", prompt_len=2, keep="layers.1.self_attn.k_pe")["layers.1.self_attn.k_pe"]
    for fn in (lambda a, name, scale=0.5: a * np.float32(scale), lambda *args: args[0] * np.float32(0.5)):
        patched = stepper.run("tiny", prompt_len=2, patch={"layers.1.self_attn.k_pe": fn},
                              keep="layers.1.self_attn.k_pe")
        assert np.array_equal(patched["layers.1.self_attn.k_pe"], kept * np.float32(0.5))


def test_a_patched_run_says_so_in_its_repr_and_its_patched_rows_as_the_command_line_does():
    run = stepper.run("tiny", prompt_len=2, patch={"layers.1.mlp.gate.topk_idx": "x[..., 0]=5"})
    assert repr(run).startswith("<stepper.Run tiny, patched at layers.1.mlp.gate.topk_idx: ")
    assert repr(run.show("layers.1.mlp.gate.topk_idx")).splitlines()[0].endswith("  int64  patched")
    assert not repr(run.show("layers.1.mlp.gate.topk_weight")).splitlines()[0].endswith("patched")
    assert repr(stepper.run("tiny", prompt_len=2, keep="logits")).startswith("<stepper.Run tiny: 3 tensors kept")


def test_a_batch_of_prompts_is_refused_and_a_batch_of_one_is_that_prompt():
    for batch in ([[1, 2, 3], [4, 5, 6]], np.array([[1, 2, 3], [4, 5, 6]]), [[1, 2], [3]]):
        with pytest.raises(StepperError, match=r"^ids= expects one prompt, a flat list of token ids; got a batch of 2 "
                                               r"\(\[\[1, 2.*\): a run is one sequence \(B=1\), so run each prompt "
                                               r"on its own$"):
            stepper.run("tiny", ids=batch)
    for one in ([[1, 2, 3]], np.array([[1, 2, 3]]), np.array([1, 2, 3])):
        assert stepper.run("tiny", ids=one, keep="logits").prompt == (1, 2, 3)


def test_a_choice_or_ids_given_as_a_large_array_is_one_short_line():
    """An array as attn= or index_scoring= was a ValueError ("The truth value of an array ... is
    ambiguous"); an array of floats as ids= was written out through its list, 20 s for 30 million."""
    for keyword, choices in (("attn", "auto, naive, absorb"), ("index_scoring", "exact, fp8")):
        with pytest.raises(StepperError) as e:
            stepper.run("tiny", **{keyword: np.arange(2_000_000)})
        assert str(e.value) == f"{keyword}= expects one of {choices}, got an array of shape (2000000,) (int64)"
    with pytest.raises(StepperError) as e:
        stepper.run("tiny", ids=np.full(1000, 1.5))
    assert str(e.value) == "ids= expects a list of token ids (integers), got an array of shape (1000,) (float64)"
    with pytest.raises(StepperError) as e:
        stepper.run("tiny", ids=[1.5] * 100_000)
    assert str(e.value) == "ids= expects a list of token ids (integers), got [1.5, 1.5, 1.5, 1.5, 1.5, 1.5, ...]"

    class Unlisted(np.ndarray):  # an array of floats is refused by its dtype, never gone through (9 s for 30 million)
        def __iter__(self):
            raise AssertionError("the ids were gone through one by one")

    with pytest.raises(StepperError, match=r"^ids= expects a list of token ids \(integers\), got an? [\w.]+ of shape "
                                           r"\(1000,\) \(float64\)$"):
        stepper.run("tiny", ids=np.full(1000, 1.5).view(Unlisted))


def test_a_name_of_100_000_characters_is_shown_cut(run, monkeypatch):
    """A name looked up, explained or kept is shown by its first 60 characters: each refusal was a
    line of 100,000 (and explain searched it as a parameter's name, in quadratic time, for 20 s: no
    text longer than any parameter's name is searched)."""
    searched = []

    class Spy:  # catalog.PARAMETER, the lengths of the texts searched noted
        def __getattr__(self, method):
            def call(text, *args):
                searched.append(len(text))
                return getattr(parameter, method)(text, *args)
            return call

    parameter = catalog.PARAMETER
    monkeypatch.setattr(catalog, "PARAMETER", Spy())
    long = "q" * 100_000
    for lookup, line in ((lambda: run[long], f"no tensor '{'q' * 60}...' in this run"),
                         (lambda: run.show(long), f"no tensor '{'q' * 60}...' in this run"),
                         (lambda: run.explain(long),
                          f"no tensor named '{'q' * 60}...' in the catalogue (stepper tree lists them)"),
                         (lambda: stepper.run("tiny", prompt_len=2, keep=long),
                          f"keep= {'q' * 60}...: matches no tensor of this run")):
        with pytest.raises(StepperError) as e:
            lookup()
        assert str(e.value) == line
    with pytest.raises(StepperError, match=r"^no tensor named 'layers\.1\.q{51}\.\.\.' in the catalogue"):
        run.explain("layers.1." + long)  # a layer's parameter, as layer_parameter reads it
    assert searched == []
    assert run.explain("model.layers.1.self_attn.q_a_proj.weight")["name"] == "self_attn.q_a"  # a name it searches
    assert searched and max(searched) <= catalog.LONGEST_PARAMETER


def test_a_dict_side_of_other_numbers_than_integers_or_floats_is_refused(run):
    """Complex arrays were compared by their real parts (exit as the same, a ComplexWarning), an
    object array was float()'s TypeError."""
    embed = run["prefill.embed"]
    for array, dtype in ((embed.astype(np.complex64), "complex64"), (np.array([object()]), "object"),
                         (np.array(["a"]), "<U1")):
        with pytest.raises(StepperError) as e:
            stepper.diff({"prefill.embed": array}, run)
        assert str(e.value) == (f"diff: a is a dict of name -> array, but its 'prefill.embed' has dtype {dtype}; "
                                "expected integers or floats")


def test_a_missing_side_says_what_stepper_diff_says(run):
    with pytest.raises(StepperError) as api:
        stepper.diff("nonexistent", run)
    cli = helpers.cli.stepper("diff", "nonexistent", "run")
    assert str(api.value) == "diff a 'nonexistent': no such file or folder; give a --dump file, a fixture folder, " \
                             "a fixture's name (e.g. tiny-prefill-decode) or a stepper.Run"
    assert cli.returncode == 2 and cli.stderr == "stepper: error: diff A 'nonexistent': no such file or folder; give " \
        "a --dump file, a fixture folder, a fixture's name (e.g. tiny-prefill-decode) or a run such as " \
        "'run --attn naive'\n"
    with pytest.raises(StepperError, match="^load 'no/such.safetensors': no such file or folder; give a --dump file, "):
        stepper.load("no/such.safetensors")


def test_a_fixture_name_given_to_an_install_without_the_repository_says_where_the_fixtures_are(tmp_path, monkeypatch):
    """A wheel (`pip install .`) holds no fixtures/: the docs' `stepper diff tiny-prefill-decode tiny-absorb`
    was refused as no such file, with no word of where the named fixtures are."""
    from stepper.fixtures import fixture, run_diff

    for module in (fixture, run_diff):
        monkeypatch.setattr(module, "REPOSITORY_FIXTURES", tmp_path / "installed" / "fixtures")
    monkeypatch.chdir(tmp_path)
    clone = "; the repository's fixtures (tiny-prefill-decode, ...) are read by name from a clone of it, not an install"
    cli = helpers.cli.stepper("diff", "tiny-prefill-decode", "tiny-absorb")
    assert cli.returncode == 2 and cli.stderr == ("stepper: error: diff A 'tiny-prefill-decode': no such file or "
                                                  "folder; give a --dump file, a fixture folder or a run such as "
                                                  f"'run --attn naive'{clone}\n")
    with pytest.raises(StepperError) as api:
        stepper.load("tiny-absorb")
    assert str(api.value).endswith(clone)
    verify = helpers.cli.stepper("fixtures", "verify", "tiny-absorb", "dump.safetensors")
    assert verify.returncode == 2 and verify.stderr.rstrip().endswith(clone), verify.stderr
    with pytest.raises(StepperError) as own:
        stepper.diff("no/such.safetensors", "elsewhere")
    assert "clone" not in str(own.value)  # a path, not a fixture's name


def test_the_repository_fixtures_are_found_by_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = stepper.diff("tiny-prefill-decode", "tiny-absorb")
    assert d.first is None and len(d.rows) > 150 and d.count("close") > 0  # naive and absorbed: round-off only
    by_name, by_path = stepper.load("tiny-absorb"), stepper.load(ROOT / "fixtures" / "tiny-absorb")
    assert list(by_name) == list(by_path) and all(np.array_equal(by_name[n], by_path[n]) for n in by_name)
    cli = helpers.cli.stepper("diff", "--plain", "tiny-prefill-decode", "tiny-absorb", cwd=tmp_path)
    assert cli.returncode == 0 and "no tensor in both differs beyond round-off" in cli.stdout, cli.stderr
    (tmp_path / "tiny-absorb").mkdir()  # a folder of the user's own, by the same name, comes first
    with pytest.raises(StepperError, match="tiny-absorb"):
        stepper.load("tiny-absorb")


@pytest.mark.parametrize("suffix", ["", ".safetensors", ".npz"])
def test_load_gives_arrays_of_their_own_from_a_fixture_or_a_file(tmp_path, suffix):
    """A fixture's and a safetensors file's tensors are read as read-only views of the file; load()
    gives writable arrays of their own from either, as from an .npz."""
    fixture = stepper.load("tiny-absorb")
    path = "tiny-absorb"
    if suffix:
        path = tmp_path / f"dump{suffix}"
        if suffix == ".npz":
            np.savez(path, **fixture)
        else:
            safetensors.numpy.save_file(fixture, str(path))
    loaded = stepper.load(path)
    assert sorted(loaded) == sorted(fixture) and all(np.array_equal(loaded[n], fixture[n]) for n in fixture)
    assert all(a.flags.writeable for a in loaded.values())
    loaded["prefill.embed"] += 1  # was "output array is read-only"


@pytest.fixture
def blas_on_two_threads():
    """NumPy's OpenBLAS on two threads, as a notebook finds it, then back on one."""
    if parallel.blas_threads() is None:
        pytest.skip("NumPy here is not built on OpenBLAS")
    set_threads = parallel._blas_thread_setter()
    set_threads(2)
    yield
    set_threads(1)


def test_a_run_puts_blas_on_one_thread_and_gives_it_back_as_it_was(blas_on_two_threads, monkeypatch):
    """stepper splits the big products across the cores itself; OpenBLAS's own second thread would
    fight those splits (a Kimi K2 decode step 2-3x slower). The command line puts BLAS on one
    thread for good; the Python API only while it runs a model, the prefill's replay included."""
    seen = []
    run = stepper.run(model="tiny", prompt_len=3, patch={"*q_a": lambda x, name: seen.append(parallel.blas_threads())})
    assert seen == [1, 1, 1] and len(run.names) > 0
    assert parallel.blas_threads() == 2, "the caller's BLAS as it was"
    replay = prefill.Replay.run
    monkeypatch.setattr(prefill.Replay, "run",
                        lambda self, k, sinks: seen.append(parallel.blas_threads()) or replay(self, k, sinks))
    chunked = stepper.run(model="tiny", prompt_len=21, chunk=8)
    seen.clear()
    assert np.asarray(chunked["layers.1.output"]).shape == (1, 21, 320)
    assert seen == [1, 1, 1], "the replay of the 3 chunks"
    assert parallel.blas_threads() == 2


def test_a_long_prompts_tiles_are_shown_with_blas_on_one_thread(blas_on_two_threads):
    """Showing a tensor made a tile at a time (a long prompt's attention weights) gathers its
    figures as its tiles are made on stepper's own thread, BLAS on one thread meanwhile."""
    name = "layers.1.self_attn.attn_weights"
    run = stepper.run("tiny", prompt_len=1100, keep=name)
    weights = run[name]
    assert isinstance(weights, Tiled)
    seen, make = [], weights.tile
    weights.tile = lambda heads, queries: seen.append(parallel.blas_threads()) or make(heads, queries)
    assert "attn_weights" in repr(run.show(name)) and len(seen) > 1 and set(seen) == {1}
    assert parallel.blas_threads() == 2


@pytest.mark.parametrize("terminal", [True, False])
def test_a_diff_printed_by_rich_fits_80_columns_as_stepper_diff_does(terminal):
    """rich.print(d) squeezed every column to a letter or two and a dot at 80 columns."""
    import io

    from rich.console import Console

    base = stepper.run("tiny", ids=[1, 2, 3])
    d = stepper.diff(base, stepper.run("tiny", ids=[1, 2, 3], patch={"*q_a": "x*1.5"}))
    console = Console(file=io.StringIO(), width=80, force_terminal=terminal, color_system=None)
    console.print(d)
    lines = console.file.getvalue().splitlines()
    assert "…" not in "\n".join(lines) and max(len(line) for line in lines) <= 80
    assert [line.split() for line in lines[:2]] == [["#", "tensor"], ["status", "max|b-a|", "relative", "cosine",
                                                                      "1e-9", "..", "1"]]


def test_diff_reads_a_chunked_run_and_refuses_sides_that_share_nothing():
    chunked = stepper.run("tiny", prompt_len=21, chunk=8)
    whole = stepper.run("tiny", prompt_len=21, chunk=0)
    assert isinstance(chunked["layers.1.self_attn.attn_weights"], stepper.LazyTensor)
    for d in (stepper.diff(chunked, whole), stepper.diff(whole, chunked)):
        assert d.first is None and d.count("same") + d.count("close") == len(d.rows) == len(whole.names)
        assert d.count("close") > 0  # the chunks' sums differ in round-off: compared value by value
    with pytest.raises(StepperError, match=r"^count: a status is one of same, close, differs, got differ$"):
        d.count("differ")
    with pytest.raises(StepperError, match=r"have no tensor in common \(one side has decode steps"):
        stepper.diff(stepper.run("tiny", ids=[1, 2, 3]), stepper.run("tiny", ids=[1, 2, 3], decode=1))
    with pytest.raises(StepperError, match=r"have no tensor in common \(B holds no tensor\)"):
        stepper.diff(whole, {})
    assert stepper.diff(dict(chunked), whole).first is None  # a run's dict, its LazyTensors read as the run's
    with pytest.raises(StepperError, match=r"^diff: a is a dict of name -> array, but its 'embed' is list, not a "):
        stepper.diff({"embed": [1, 2]}, whole)  # it said "must be ... a dict of name -> NumPy array, got dict"


def test_what_a_new_user_mistypes_gets_the_name_meant():
    run = stepper.run("tiny", ids=[1, 2, 3], decode=1, keep="*compressed_kv")
    with pytest.raises(StepperError, match=r"did you mean prefill.layers.1.self_attn.compressed_kv, "):
        run["prefill.layers.1.self_attn.compresed_kv"]  # a full name, one letter out: the full names it is near
    with pytest.raises(StepperError, match=r"unknown model 'tiny_v4' \(did you mean tiny-v4, "):
        stepper.run("tiny_v4")
    with pytest.raises(StepperError, match=r"^model '/no/such/checkpoint': no such checkpoint directory or config"):
        stepper.run("/no/such/checkpoint")


def test_a_lazy_tensor_says_how_to_get_its_array_and_a_long_prompt_is_shortened():
    run = stepper.run("tiny", prompt_len=300, chunk=128, keep="layers.1.self_attn.attn_weights")
    lazy = run["layers.1.self_attn.attn_weights"]
    assert len(lazy) == 1 and isinstance(lazy, stepper.LazyTensor)
    with pytest.raises(AttributeError, match=r"has no 'sum': it is a LazyTensor, made when read; its .numpy\(\) is "):
        lazy.sum()
    with pytest.raises(AttributeError, match=r"object has no attribute 'no_such'$"):
        getattr(lazy, "no_such")  # noqa: B009
    for arithmetic in (lambda: lazy * 2, lambda: 2 * lazy, lambda: lazy - lazy, lambda: -lazy, lambda: lazy > 0):
        with pytest.raises(TypeError, match=r"takes no arithmetic: it is a LazyTensor, made when read; its .numpy\(\)"):
            arithmetic()  # (it was Python's "unsupported operand type(s) for *: 'Chunked' and 'int'")
    whole = lazy.numpy()
    assert np.exp(lazy).shape == lazy.shape  # a NumPy function reads it whole, as before
    assert np.array_equal(lazy - whole, whole - lazy) and not (lazy - whole).any()  # so does an array's operator
    assert "(300 tokens)" in repr(run) and len(repr(run)) < 300


def test_a_name_that_is_not_a_string_is_one_sentence_in_show_and_picture_too(run):
    for look in (run.__getitem__, run.show, lambda name: run.picture("hist", name)):
        with pytest.raises(StepperError, match=r"^tensors are looked up by name \(a string\), got int$"):
            look(3)  # show and picture: a TypeError from inside fnmatch


def test_two_runs_compared_with_eq_point_to_diff(run):
    again = stepper.run("tiny", ids=[1, 2, 3], decode=1)
    for compare in (lambda: run == again, lambda: run != dict(again)):
        with pytest.raises(StepperError, match=r"^runs are compared tensor by tensor with stepper.diff\(a, b\)"):
            compare()  # a Mapping's == asked the truth of an array: NumPy's ValueError
    assert run in [run] and run != 3 and run != "tiny"  # itself, and what is no mapping: as any object
    assert stepper.diff(run, again).first is None


def test_a_patch_that_makes_inf_and_nan_warns_nothing_as_the_command_line_runs(recwarn):
    run = stepper.run("tiny", ids=[1, 2, 3], patch={"layers.1.self_attn.q": "x*inf"})
    assert [str(w.message) for w in recwarn] == []  # 6 RuntimeWarnings from rope and the attention kernels
    assert np.isinf(run["layers.1.self_attn.q"]).all() and np.isnan(run["layers.2.output"]).all()
    assert np.isfinite(run["layers.1.self_attn.compressed_kv"]).all()  # before the patch: untouched


def test_a_lone_layer_without_an_embedding_table_says_its_ids_only_count_positions_as_stepper_run_does(tmp_path):
    """ids= of a checkpoint holding layer 1 alone: seeded vectors, the same whatever the ids (the
    command line says so before the run; the API said nothing)."""
    out = tmp_path / "t12"
    assert helpers.cli.stepper("synth", "--model", "tiny", "--layers", "1:2", "--out", out).returncode == 0
    one, other = (stepper.run(out, layer=1, ids=ids, keep="layers.1.output") for ids in ([5, 6], [7, 8]))
    np.testing.assert_array_equal(one["layers.1.output"], other["layers.1.output"])  # the ids count positions only
    note = ("note: this checkpoint has no embedding table, so layer 1 runs on seeded random vectors and ids= only sets "
            "their number; give input=FILE (the hidden states of the layer before, dumped from a run) for real ones")
    assert one.notes[-1] == note and one.notes[0].startswith("attn=auto: naive prefill (the run needs about ")
    page = " ".join(html.unescape(re.sub(r"<[^>]+>", "", one._repr_html_())).split())  # wrapped at its width
    assert repr(one).endswith("generated []; 1 note in run.notes>") and note in page
    plain = stepper.run("tiny", ids=[5, 6], keep="layers.1.output")
    assert [line.split(":")[0] for line in plain.notes] == ["attn=auto"] and "note" not in repr(plain)


def test_a_routing_picture_of_nan_weights_draws_them_as_nan_not_as_the_largest():
    """A NaN patch spreads to layer 2's router: its weights were all drawn █, "≤1 of the largest weight (0)"."""
    run = stepper.run("tiny", ids=[1, 2, 3], patch={"layers.1.self_attn.attn_weights": lambda a, name: a * np.nan})
    assert np.isnan(run["layers.2.mlp.gate.topk_weight"]).all()
    rows = repr(run.picture("routing", "layers.2.mlp.gate.topk_idx")).splitlines()
    grid = [row.split()[1] for row in rows[1:4]]
    assert grid == ["!!!!" + "·" * 28] * 3 and "! NaN or infinite" in rows
    assert not any("█" in cells for cells in grid)


def test_a_patch_returning_a_masked_array_is_refused_naming_what_to_return():
    masked = {"layers.1.self_attn.q": lambda a, name: np.ma.masked_less(a, 0)}
    with pytest.raises(StepperError, match=r"^patch layers.1.self_attn.q on layers.1.self_attn.q returned a "
                                           r"MaskedArray; expected a plain np.ndarray of the tensor's shape and dtype, "
                                           r"float32\[1, 4, 3, 48\] \(a masked array's .filled\(value\) is one\)$"):
        stepper.run("tiny", ids=[1, 2, 3], patch=masked)  # NumPy's broadcast error from inside numpy.ma's matmul
    filled = stepper.run("tiny", ids=[1, 2, 3], patch={"layers.1.self_attn.q": lambda a, name: np.ma.masked_less(
        a, 0).filled(0)})
    assert filled["layers.1.self_attn.q"].min() == 0 and filled["layers.1.self_attn.q"].max() > 0


def test_a_chunked_runs_tensor_read_after_its_checkpoint_was_cut_short_is_one_line_not_a_bus_error(tmp_path):
    """A chunked run's tensor is made when read, from the checkpoint's mapped weights: a shard
    written over in place since (cp, or a writer that opens it "wb") killed the process with
    SIGBUS (a notebook's kernel died). In a child process, as the old code crashed."""
    out = tmp_path / "ck"
    assert helpers.cli.stepper("synth", "--model", "tiny", "--out", out).returncode == 0
    script = (
        "import os, sys, numpy as np, stepper\n"
        "run = stepper.run(sys.argv[1], prompt_len=21, chunk=8, keep='layers.1.self_attn.attn_weights')\n"
        "for shard in sorted(p for p in os.listdir(sys.argv[1]) if p.endswith('.safetensors')):\n"
        "    os.truncate(os.path.join(sys.argv[1], shard), 1000)\n"
        "try:\n"
        "    np.asarray(run['layers.1.self_attn.attn_weights'])\n"
        "except stepper.StepperError as error:\n"
        "    print(error)\n")
    done = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert (done.returncode, done.stderr) == (0, ""), done.returncode
    assert done.stdout == (f"{out}/model-00001-of-00005.safetensors: the file was cut short after it was read "
                           "(written over in place), so its weights can no longer be read; run again on the file "
                           "as it is now\n")


def test_an_unknown_picture_kind_lists_the_kinds_this_runs_tensors_draw_not_every_familys(run):
    """tiny was offered DeepSeek-V4's hc and reach and Kimi Linear's state, which its tensors never draw."""
    with pytest.raises(StepperError) as caught:
        run.picture("heat", "layers.1.self_attn.attn_weights")
    assert str(caught.value) == ("picture: kind expects one of attention, routing, hist (what this run's kept tensors "
                                 "draw), got 'heat'")
    kimi = stepper.run("tiny-kimi-linear", ids=[1, 2, 3], keep="layers.0.self_attn.*")
    with pytest.raises(StepperError, match=r"^picture: kind expects one of state, hist \(what this run's kept"):
        kimi.picture("heat", "layers.0.self_attn.state")
