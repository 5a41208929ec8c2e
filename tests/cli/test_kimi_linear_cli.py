"""Kimi Linear from the command line: the run header's memory story in numbers, a 32768-position
prompt through a KDA layer in the memory of a 4096 one, the tree and explain of its tensors, and
the debugger drawing a state and printing a slice of it at a chosen token."""

import json
import re
import tracemalloc

import numpy as np
from helpers.cli import one_line, stepper
from helpers.resaved import saved_as_one_file, stored_tensors

from stepper.seams.trace import Recorder
from stepper.session import RunSpec, run


def test_the_header_tells_the_memory_story_and_no_rotary_tables_are_made():
    out = stepper("run", "--model", "tiny-kimi-linear", "--prompt-len", "3", "--plain")
    assert out.returncode == 0, out.stderr
    assert ("KDA layers keep 20,992 B each at any length (state 4x32x32 + conv inputs: 0 B per position), "
            "MLA layers 320 B per position (latent + key)") in out.stdout
    assert "at 3 positions: 3 KDA layers 62 KiB, 1 MLA layer 960 B" in out.stdout
    assert "rope_cos" not in out.stdout and "q_pe_rope" not in out.stdout
    assert "layers.3.self_attn.key_states" in out.stdout and "layers.2.self_attn.state_per_chunk" in out.stdout


def test_a_kda_layer_alone_is_told_no_attention_path_it_has_not():
    """A KDA layer run alone has no naive or absorbed attention: its header said which attention ran
    and what per-head keys would cache, and --attn auto chose between paths it does not have. What
    the run needs is said as for any run."""
    kda = stepper("run", "--model", "tiny-kimi-linear", "--layer", "0", "--prompt-len", "5", "--plain").stdout
    mla = stepper("run", "--model", "tiny-kimi-linear", "--layer", "3", "--prompt-len", "5", "--plain").stdout
    header = lambda out: out.split("\nlayer ")[0].splitlines()
    assert [line.split(" ")[0] for line in header(kda)] == ["model", "KDA", "memory:"]
    assert header(kda)[2].endswith(" (one attention path: nothing for --attn auto to choose)")
    assert [line.split(" ")[0] for line in header(mla)] == ["model", "attention", "KDA", "--attn"]
    assert header(mla)[3].startswith("--attn auto: naive prefill (the run needs about ")


def peak_traced(length: int) -> int:
    """The most memory NumPy and Python held at once (tracemalloc) while `stepper run` shows every
    tensor of KDA layer 0 on a prompt of `length` positions, 1024 at a time."""
    tracemalloc.start()
    out = stepper("run", "--model", "tiny-kimi-linear", "--layer", "0", "--prompt-len", length, "--chunk", "1024",
                  "--plain")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert out.returncode == 0, out.stderr
    assert f"layers.0.self_attn.state_per_token  [B=1 batch, 4 KDA heads, T={length} positions" in out.stdout
    return peak


def test_a_32768_position_prompt_runs_through_a_kda_layer_in_the_memory_of_a_4096_one():
    short, long = peak_traced(4096), peak_traced(32768)
    assert long < 1.5 * short  # one chunk's tensors and the fixed state, not the prompt's
    assert long < 64 << 20  # the whole prompt's per-token states alone would be 512 MiB


def test_tree_and_explain_show_kda():
    tree = stepper("tree", "--model", "tiny-kimi-linear", "--layer", "0")
    assert tree.returncode == 0 and "delta attention" in tree.stdout and "self_attn.forget_gate" in tree.stdout
    explained = stepper("explain", "self_attn.delta", "--model", "tiny-kimi-linear")
    assert explained.returncode == 0
    assert "stepper emits it  stepper/model/kda.py:" in explained.stdout
    assert "delta = (v_i - kv_mem) * b_i" in explained.stdout  # transformers' line


def test_the_debugger_draws_a_state_and_prints_it_at_a_chosen_token():
    commands = ("u layers.0.self_attn.state\n" "s state self_attn.state_per_token[0, 1, 2]\n"
                "p self_attn.state_per_token[0, 1, 2, :2, :3] 4\n" "q\n")
    out = stepper("step", "--plain", "--model", "tiny-kimi-linear", "--prompt-len", "5", stdin=commands)
    assert out.returncode == 0, out.stderr
    recorder = Recorder()
    run(RunSpec(model="tiny-kimi-linear", prompt_len=5), [recorder])
    states = recorder.tensors()["layers.0.self_attn.state_per_token"]
    assert np.array2string(states[0, 1, 2, :2, :3], precision=4, floatmode="fixed") in out.stdout
    assert "self_attn.state_per_token[0, 1, 2]" in out.stdout and "negative" in out.stdout  # the heat map's caption


def test_explain_of_a_parameter_names_the_tensors_of_the_layer_it_belongs_to():
    """q_proj.weight feeds KDA's q_proj in a KDA layer (0) and MLA's q in an MLA layer (3): the
    catalogue has both, the model's layer says which."""
    def first_entry(parameter: str) -> str:
        out = stepper("explain", parameter, "--model", "tiny-kimi-linear", "--plain")
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()[0]
    assert first_entry("model.layers.0.self_attn.q_proj.weight") == "self_attn.q_proj"
    assert first_entry("model.layers.3.self_attn.q_proj.weight") == "self_attn.q"
    assert first_entry("model.layers.0.self_attn.f_a_proj.weight") == "self_attn.forget_gate"


def test_a_lone_mla_layer_takes_a_seeded_cache_and_a_kda_layer_says_why_it_cannot():
    """--cache-len fills an MLA layer's cache with synthetic positions (their rope dims left as
    drawn: no layer of Kimi Linear rotates); a KDA layer keeps a state, not positions."""
    out = stepper("run", "--model", "tiny-kimi-linear", "--layer", "3", "--cache-len", "64", "--prompt-len", "1",
                  "--decode", "1", "--plain", "--only", "*attn_weights")
    assert out.returncode == 0, out.stderr
    assert "decode0.layers.3.self_attn.attn_weights  [B=1 batch, 4 heads, T=1 position, S=66 attended " in out.stdout
    out = stepper("run", "--model", "tiny-kimi-linear", "--layer", "0", "--cache-len", "64", "--plain")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == ("stepper: error: --cache-len 64: layer 0 of tiny-kimi-linear is a delta-attention (KDA) "
                          "layer, whose state holds no positions to fill; run it on a prompt and its decode steps, "
                          "or give an MLA layer (3) its cache\n")


def test_the_debugger_will_not_set_a_tensor_shown_only():
    out = stepper("step", "--model", "tiny-kimi-linear", "--plain", "--prompt-len", "3", "--break",
                  "layers.0.self_attn.delta", stdin="set = 0\nq\n")
    assert out.returncode == 0, out.stderr
    assert ("layers.0.self_attn.delta is shown only: the model does not read it back, so setting it would change "
            "nothing") in " ".join(out.stdout.split())


def test_a_chunked_prefill_shows_every_state_after_a_chunk_of_the_delta_rule():
    """The prefill's chunks are whole numbers of the delta rule's 64-token chunks, so the states
    after each of those follow each other across the prefill's chunks as in the whole prompt."""
    whole = stepper("run", "--model", "tiny-kimi-linear", "--prompt-len", "200", "--json", "--only",
                    "layers.0.self_attn.state_per_chunk")
    chunked = stepper("run", "--model", "tiny-kimi-linear", "--prompt-len", "200", "--chunk", "64", "--json",
                      "--only", "layers.0.self_attn.state_per_chunk")
    rows = [json.loads(out.stdout.splitlines()[-1]) for out in (whole, chunked)]
    assert rows[0]["shape"] == rows[1]["shape"] == [1, 4, 4, 32, 32]
    for figure in ("min", "max", "mean"):
        assert abs(rows[0]["stats"][figure] - rows[1]["stats"][figure]) <= 1e-5 * abs(rows[0]["stats"]["absmax"])
    refused = stepper("run", "--model", "tiny-kimi-linear", "--prompt-len", "200", "--chunk", "100")
    assert refused.returncode == 2 and refused.stderr.endswith("its delta rule's 64-position chunks (so the state "
                                                               "after each lines up with the whole prompt's); try "
                                                               "64 or 128\n")
    under = stepper("run", "--model", "tiny-kimi-linear", "--prompt-len", "200", "--chunk", "8")
    assert under.returncode == 2 and under.stderr.endswith("whole prompt's); try 64\n")  # not "64 or 64"


def test_the_tree_and_the_run_name_each_layers_attention():
    """Kimi Linear's layers differ by attention (KDA or MLA) as well as by MLP: the tree draws one of
    each kind, and the run's headings say which a layer is."""
    tree = stepper("tree", "--model", "tiny-kimi-linear", "--plain").stdout
    assert [line for line in tree.splitlines() if line.startswith("tiny-kimi-linear:")] == [
        "tiny-kimi-linear: layer 0 (KDA, dense)",  # a delta attention takes no --attn path
        "tiny-kimi-linear: layers 1..2 (KDA, MoE)",
        "tiny-kimi-linear: layer 3 (MLA, MoE), naive attention"]
    run = stepper("run", "--model", "tiny-kimi-linear", "--plain", "--only", "*output").stdout
    assert "layer 2 (KDA, MoE) ──" in run and "layer 3 (MLA, MoE) ──" in run
    # a KDA layer's output projection (shared with MLA's catalogue) is under the delta attention
    trees = tree.split("tiny-kimi-linear: ")
    assert "latent attention" not in trees[1] and "latent attention" in trees[3]
    stops = stepper("step", "--model", "tiny-kimi-linear", "--plain", "--break", "self_attn.o_proj",
                    stdin="c\nc\nc\nq\n").stdout
    assert [line for line in stops.splitlines() if " › o_proj" in line] == [
        "layer 0 (KDA, dense) › delta attention › o_proj", "layer 1 (KDA, MoE) › delta attention › o_proj",
        "layer 2 (KDA, MoE) › delta attention › o_proj", "layer 3 (MLA, MoE) › latent attention › o_proj"]


def test_run_show_state_draws_a_kda_layers_state_as_the_debugger_does():
    out = stepper("run", "--model", "tiny-kimi-linear", "--plain", "--show", "state", "--only",
                  "layers.0.self_attn.state")
    assert out.returncode == 0, out.stderr
    assert "  head      ‖S‖    max |S|    σ₁² share    rank@1%" in out.stdout
    assert "layers.0.self_attn.state[0, 0]" in out.stdout
    said = " ".join(out.stdout.split())  # the columns explained under the table, and why the rank is the tokens'
    assert "rank@1%: how many singular values reach 1% of the largest" in said and "at most the tokens written" in said
    refused = stepper("run", "--model", "tiny", "--show", "state")
    assert refused.returncode == 2 and "state is not drawn for this model; its pictures are attention, routing, " \
                                      "hist, scales" in refused.stderr
    own = stepper("run", "--model", "tiny-kimi-linear", "--show", "hc")  # only what this model can draw: no FP8 scales
    assert own.returncode == 2 and own.stderr.endswith("its pictures are attention, routing, hist, state\n")
    dense = stepper("run", "--model", "tiny-minicpm3", "--show", "hc")  # no router either
    assert dense.returncode == 2 and dense.stderr.endswith("its pictures are attention, hist\n")


def test_explain_says_the_mla_layers_turn_nothing_where_the_entry_reads_as_rope():
    """The shared entries speak of q_pe_rope and rotated dims; Kimi Linear's MLA layers have no RoPE."""
    out = stepper("explain", "layers.3.self_attn.query_states", "--model", "tiny-kimi-linear", "--plain")
    said = " ".join(out.stdout.split())
    assert out.returncode == 0 and "formula query_states = cat(q_nope, q_pe, dim=-1)" in said
    assert "Neither part depends on the position" in said and "q_pe_rope" not in said
    assert "Assembled queries: [q_nope | q_pe] for every head, the pe part unturned" in said
    assert "note " not in stepper("explain", "layers.1.self_attn.query_states", "--plain").stdout  # Kimi K2: turned


def test_a_bf16_fixture_export_copies_the_weights_as_published(tmp_path):
    """Kimi Linear is published in BF16: --weights-dtype bf16 writes the same shards as the default."""
    for out, more in (("bf16", ["--weights-dtype", "bf16"]), ("default", [])):
        done = stepper("fixtures", "export", tmp_path / out, "--model", "tiny-kimi-linear", "--layer", "0",
                       "--prompt-len", "2", *more)
        assert done.returncode == 0 and done.stderr == "", done.stderr
    shards = sorted((tmp_path / "bf16" / "weights").glob("*.safetensors"))
    assert shards and all(s.read_bytes() == (tmp_path / "default" / "weights" / s.name).read_bytes() for s in shards)
    manifest = json.loads((tmp_path / "bf16" / "manifest.json").read_text())
    assert manifest["export"]["weights_dtype"] == "bf16" and manifest["weights"]["storage"].startswith("bf16")


def test_a_state_made_infinite_is_counted_in_its_table_not_a_traceback():
    out = stepper("run", "--model", "tiny-kimi-linear", "--prompt-len", "6", "--plain", "--patch",
                  "layers.0.self_attn.v_proj=x[0,0]=x[0,0]*1e39", "--only", "layers.0.self_attn.state", "--show",
                  "state")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    heads = [line.split() for line in out.stdout.splitlines() if re.match(r"\s+\d\s+nan", line)]
    assert heads == [[str(h), "nan", "nan", "1024", "NaN/Inf", "—"] for h in range(4)]
    assert "! NaN or infinite" in out.stdout.splitlines()


def test_an_attention_path_asked_of_a_kda_layer_alone_is_said_to_change_nothing():
    """--attn absorb on a KDA layer alone ran without a word (its delta rule has one path); an MLA layer takes it."""
    line = ("note: --attn absorb changes nothing here: the layers this run computes have one path (a delta rule), "
            "no naive or absorbed attention")
    args = ("run", "--model", "tiny-kimi-linear", "--prompt-len", "3", "--only", "*.output", "--attn", "absorb")
    kda, mla = stepper(*args, "--layer", "0"), stepper(*args, "--layer", "3")
    assert kda.returncode == mla.returncode == 0, kda.stderr + mla.stderr
    assert line in kda.stdout.splitlines() and "changes nothing" not in mla.stdout


def as_transformers_saves_it(published, folder, drop: str | None = None):
    """tiny-kimi-linear's published checkpoint with its dense layer 0's MLP where transformers'
    save_pretrained writes it, `block_sparse_moe.{gate,up,down}_proj` (its conversion renames every
    block_sparse_moe. to mlp. on load and back on save), one model.safetensors; `drop` left out."""
    tensors = {name.replace("layers.0.mlp.", "layers.0.block_sparse_moe."): a
               for name, a in stored_tensors(published).items()}
    return saved_as_one_file(published, folder, {name: a for name, a in tensors.items() if name != drop})


def test_a_checkpoint_as_transformers_saves_it_runs_as_the_published_one(tmp_path):
    """The same logits; inspect lists the dense MLP by the names the file holds, nothing wrong; a
    missing projection is named as stored (tests/reference/test_transformers_saved_checkpoints.py
    runs what transformers itself saves)."""
    published = tmp_path / "published"
    assert stepper("synth", "--model", "tiny-kimi-linear", "--out", published, "--seed", 5).returncode == 0
    saved = as_transformers_saves_it(published, tmp_path / "saved")

    def logits(folder) -> np.ndarray:
        rec = Recorder()
        run(RunSpec(model=str(folder), prompt_len=5, decode=1, seed=5), [rec])
        return np.concatenate([v[0] for n, v in rec.tensors().items() if n.endswith(".logits") and ".layers." not in n])

    assert np.array_equal(logits(saved), logits(published))
    inspected = stepper("inspect", saved, "--plain")
    assert inspected.returncode == 0 and "problem" not in inspected.stdout and "!" not in inspected.stdout
    assert "  block_sparse_moe.down_proj.weight " in inspected.stdout.split("layer 1")[0]
    broken = as_transformers_saves_it(published, tmp_path / "broken", "model.layers.0.block_sparse_moe.up_proj.weight")
    assert one_line(stepper("run", "--model", broken)) == (
        f"stepper: error: {broken}: 'model.layers.0.block_sparse_moe.up_proj.weight' is missing (expected shape "
        "[272, 160])")
