"""A port's dump, named and laid out as its own code names and lays it out, verifies.

For DeepSeek-V3's inference/model.py and llama.cpp, the tables below are written here from the
sources (each entry: the name, the line that assigns or emits it, and how that code lays the
value out), independently of stepper's naming tables; the candidate is built from a fixture's
tensors that way, and verify must place every one of them with no divergence, in prefill and
decode, naive and absorbed attention, and name a perturbed tensor as the first divergence. For
transformers, the real DeepseekV3ForCausalLM runs on a fixture's weights with a forward hook on
every module, and that dump verifies.
"""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from stepper.fixtures import verify
from stepper.fixtures.aliases import tables
from stepper.fixtures.fixture import load
from stepper.fixtures.show import summary_line
from stepper.weights.checkpoint import SCALE, Checkpoint

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ["tiny-prefill-decode", "tiny-absorb", "tiny-v3-grouped"]
FILES = {"inference": "inference/model.py", "llama.cpp": "src/models/deepseek2.cpp"}  # where a bare line is

# ---------------------------------------------------------------------------------------------
# How the sources lay values out, from the fixture's [B, H, T, X] / [B, T, X] / [N, X] tensors


def heads_after(a, c):  # [B, H, T, X] -> [B, T, H, X]
    return a.transpose(0, 2, 1, 3)


def merged(a, c):  # [B, H, T, X] -> [B, T, H*X]
    b, h, t, x = a.shape
    return a.transpose(0, 2, 1, 3).reshape(b, t, h * x)


def pairs_side_by_side(a, rope):
    """[x0 x1 .. | y0 y1 ..] rotated halves -> x0 y0 x1 y1 .. (a complex multiply's / ggml's order)"""
    out = np.array(a, copy=True)
    pe = out[..., -rope:]
    side = np.empty_like(pe)
    side[..., 0::2], side[..., 1::2] = pe[..., : rope // 2], pe[..., rope // 2:]
    out[..., -rope:] = side
    return out


def interleaved(layout):
    return lambda a, c: pairs_side_by_side(layout(a, c), c.rope)


def new_only(a, c):  # [B, H, S, X] -> the step's new positions (the last T), [B, T, H, X]
    return a[:, :, -c.t:].transpose(0, 2, 1, 3)


def before_mask(a, c):  # masked entries hold the plain scaled product in the source (any finite value)
    return np.where(np.isinf(a), 3.0, a).transpose(0, 2, 1, 3)


def last_row(a, c):  # Transformer.forward's [:, -1]
    return a[:, -1]


def per_head(a, c):  # [B, T, H*V] -> [B, T, H, V]
    b, t, _ = a.shape
    return a.reshape(b, t, c.heads, -1)


def inverted(a, c):
    return a == 0


def as_is(a, c):
    return a


def n_rows(a, c):  # [B, T, d] -> [N, d]
    return a.reshape(-1, a.shape[-1])


class Step:
    """What a layout needs to know about the tensor's step."""

    def __init__(self, fixture, name):
        cfg = fixture.config
        self.rope, self.heads = cfg.qk_rope_head_dim, cfg.num_attention_heads
        phase = name.split(".", 1)[0] + "." if name.startswith(("prefill.", "decode")) else ""
        self.t = fixture.tensors[phase + "embed"].shape[1] if phase + "embed" in fixture.tensors else \
            next(a.shape[1] for n, a in fixture.tensors.items() if n.startswith(phase) and n.endswith("hidden_states"))
        self.tensors, self.name, self.fixture = fixture.tensors, name, fixture
        yarn = fixture.manifest["config"]["rope_scaling"]
        # DeepSeek's softmax_scale (inference/model.py lines 434-437)
        mscale = 0.1 * yarn["mscale_all_dim"] * math.log(yarn["factor"]) + 1.0 if yarn["factor"] > 1 else 1.0
        self.scale = cfg.qk_head_dim**-0.5 * mscale * mscale

    def other(self, key):
        return self.tensors[self.name.rsplit(key_of(self.name), 1)[0] + key]


def key_of(name):
    rest = name.split("layers.", 1)[1].split(".", 1)[1] if "layers." in name else name.split(".")[-1]
    return rest


# ---------------------------------------------------------------------------------------------
# DeepSeek-V3 inference/model.py at 9b4e9788e4a3a731f7567338ed15d3ec549ce03b: name, line, fixture
# tensor, layout, path (naive / absorb / both), layers (dense / moe / all). The ordinal: a
# function's arguments are first values, each statement that rebinds or updates in place is the
# next (views too), the expert loop is one update.

INFERENCE = [
    ("h#1", 785, "embed", as_is, "both", "all"),
    ("h#2", 791, "output@last", as_is, "both", "all"),  # the layer loop is one update
    ("h#3", 792, "norm", last_row, "both", "all"),
    ("logits", 793, "logits", last_row, "both", "all"),
    ("layers.{i}.x#1", 720, "hidden_states", as_is, "both", "all"),
    ("layers.{i}.x#2", 733, "attn_residual", as_is, "both", "all"),
    ("layers.{i}.x#3", 734, "output", as_is, "both", "all"),
    ("layers.{i}.attn.x#1", 446, "input_layernorm", as_is, "both", "all"),
    ("layers.{i}.attn.q#1", 464, "self_attn.q", merged, "both", "all"),
    ("layers.{i}.attn.q#2", 465, "self_attn.q", heads_after, "both", "all"),
    ("layers.{i}.attn.q_nope#1", 466, "self_attn.q_nope", heads_after, "both", "all"),
    ("layers.{i}.attn.q_pe#1", 466, "self_attn.q_pe", heads_after, "both", "all"),
    ("layers.{i}.attn.q_pe#2", 467, "self_attn.q_pe_rope", interleaved(heads_after), "both", "all"),
    ("layers.{i}.attn.kv#1", 468, "self_attn.kv_a", as_is, "both", "all"),
    ("layers.{i}.attn.kv#2", 469, "self_attn.compressed_kv", as_is, "both", "all"),
    ("layers.{i}.attn.k_pe#1", 469, "self_attn.k_pe", lambda a, c: a[:, 0], "both", "all"),
    ("layers.{i}.attn.k_pe#2", 470, "self_attn.k_pe_rope", interleaved(heads_after), "both", "all"),
    ("layers.{i}.attn.q#3", 472, "self_attn.query_states", interleaved(heads_after), "naive", "all"),
    ("layers.{i}.attn.kv#3", 473, "self_attn.kv", merged, "naive", "all"),
    ("layers.{i}.attn.kv#4", 474, "self_attn.kv", heads_after, "naive", "all"),
    ("layers.{i}.attn.k_nope", 475, "self_attn.k_nope", heads_after, "naive", "all"),
    ("layers.{i}.attn.v", 475, "self_attn.value_states", new_only, "naive", "all"),
    ("layers.{i}.attn.k", 476, "self_attn.key_states", interleaved(new_only), "naive", "all"),
    ("layers.{i}.attn.scores#1", 479, "self_attn.attn_scores", before_mask, "naive", "all"),
    ("layers.{i}.attn.q_nope#2", 483, "self_attn.q_nope_absorbed", heads_after, "absorb", "all"),
    ("layers.{i}.attn.scores#1", 486, "self_attn.attn_scores", before_mask, "absorb", "all"),
    ("layers.{i}.attn.scores#2", 489, "self_attn.attn_scores@masked", heads_after, "both", "all"),
    ("layers.{i}.attn.scores#3", 490, "self_attn.attn_weights", heads_after, "both", "all"),
    ("layers.{i}.attn.x#2", 492, "self_attn.attn_output", per_head, "naive", "all"),
    ("layers.{i}.attn.x#3", 496, "self_attn.o_proj", as_is, "naive", "all"),
    ("layers.{i}.attn.x#2", 494, "self_attn.attn_output_latent", heads_after, "absorb", "all"),
    ("layers.{i}.attn.x#3", 495, "self_attn.attn_output", per_head, "absorb", "all"),
    ("layers.{i}.attn.x#4", 496, "self_attn.o_proj", as_is, "absorb", "all"),
    ("layers.{i}.ffn.x#1", 522, "post_attention_layernorm", as_is, "both", "dense"),
    ("layers.{i}.ffn.x#1", 669, "post_attention_layernorm", as_is, "both", "moe"),
    ("layers.{i}.ffn.x#2", 680, "post_attention_layernorm", n_rows, "both", "moe"),
    ("layers.{i}.ffn.weights", 681, "mlp.gate.topk_weight", as_is, "both", "moe"),
    ("layers.{i}.ffn.indices", 681, "mlp.gate.topk_idx", as_is, "both", "moe"),
    ("layers.{i}.ffn.y#2", 689, "mlp.routed_output", n_rows, "both", "moe"),
    ("layers.{i}.ffn.z", 690, "mlp.shared_output", n_rows, "both", "moe"),
    ("layers.{i}.ffn.gate.x#1", 566, "post_attention_layernorm", n_rows, "both", "moe"),
    ("layers.{i}.ffn.gate.scores#1", 576, "mlp.gate.logits", as_is, "both", "moe"),
    ("layers.{i}.ffn.gate.scores#2", 580, "mlp.gate.scores", as_is, "both", "moe"),
    ("layers.{i}.ffn.gate.original_scores", 581, "mlp.gate.scores", as_is, "both", "moe"),
    ("layers.{i}.ffn.gate.scores#3", 583, "mlp.gate.scores_for_choice", as_is, "both", "moe"),  # dim == 7168 only
    ("layers.{i}.ffn.gate.scores#4", 585, "mlp.gate.scores_for_choice@grouped",
     lambda a, c: a.reshape(a.shape[0], c.fixture.config.n_group, -1), "both", "moe"),
    ("layers.{i}.ffn.gate.group_scores", 589, "mlp.gate.group_scores@grouped", as_is, "both", "moe"),
    ("layers.{i}.ffn.gate.mask", 591, "mlp.gate.group_mask@grouped", inverted, "both", "moe"),
    ("layers.{i}.ffn.gate.indices#2", 593, "mlp.gate.topk_idx", as_is, "both", "moe"),
    ("layers.{i}.ffn.gate.weights#3", 597, "mlp.gate.topk_weight", as_is, "both", "moe"),
]

# ---------------------------------------------------------------------------------------------
# llama.cpp at 07bede6a8f329362c72d46a0bc9756b6a12c22eb, both files read whole at that revision:
# src/models/deepseek2.cpp (a bare line) and src/llama-graph.cpp ("file:line"). Arrays in NumPy
# order, ggml's ne reversed; the batch axis absent.


def lc(layout):
    """A [B, ...] layout without its batch axis."""
    return lambda a, c: layout(a, c)[0]


def padded(fill):
    def build(a, c):  # [B, H, T, S] -> [H, T, n_kv]: n_kv cache cells, 256 at least
        out = np.full(a.shape[1:3] + (256,), fill, np.float32)
        out[..., : a.shape[-1]] = a[0]
        return out
    return build


def raw_kq(a, c):  # K·Q before the scale and the mask (ggml_soft_max_ext applies both)
    out = padded(5.0)(a, c)
    s = a.shape[-1]
    out[..., :s] = np.where(np.isinf(a[0]), -2.0, a[0] / c.scale)
    return out


def heads_first(a, c):  # [B, H, T, X] -> [H, T, X]
    return a[0]


def concat_rope(partner):
    def build(a, c):  # [q_nope_absorbed | q_pe] along the head dim, the pe part rotated in place
        p = c.other(partner)
        first = a[0].transpose(1, 0, 2) if a.ndim == 4 else a[0][:, None]
        pe = p[0].transpose(1, 0, 2)
        return pairs_side_by_side(np.concatenate([first, pe], axis=-1), c.rope)
    return build


LLAMA = [
    ("embd", "src/llama-graph.cpp:1506", "embed", lc(as_is), "both", "all"),
    ("attn_norm-{i}", 53, "input_layernorm", lc(as_is), "both", "all"),
    ("q-{i}#1", 63, "self_attn.q_a", lc(as_is), "both", "all"),
    ("q-{i}#2", 66, "self_attn.q_a_norm", lc(as_is), "both", "all"),
    ("q-{i}#3", 69, "self_attn.q", lc(merged), "both", "all"),
    ("q_nope-{i}", 78, "self_attn.q_nope", lc(heads_after), "both", "all"),
    ("q_pe-{i}#1", 84, "self_attn.q_pe", lc(heads_after), "both", "all"),
    ("kv_cmpr_pe-{i}", 87, "self_attn.kv_a", lc(as_is), "both", "all"),
    ("kv_cmpr-{i}#1", 93, "self_attn.compressed_kv", lc(as_is), "both", "all"),
    ("k_pe-{i}#1", 100, "self_attn.k_pe", lc(heads_after), "both", "all"),
    ("q_pe-{i}#2", 104, "self_attn.q_pe_rope", interleaved(lc(heads_after)), "both", "all"),
    ("k_pe-{i}#2", 108, "self_attn.k_pe_rope", interleaved(lc(heads_after)), "both", "all"),
    ("kv_cmpr-{i}#2", 111, "self_attn.compressed_kv_norm", lc(as_is), "both", "all"),
    ("q_nope_perm-{i}", 116, "self_attn.q_nope", heads_first, "absorb", "all"),
    ("q_nope_absorbed-{i}", 120, "self_attn.q_nope_absorbed", heads_first, "absorb", "all"),
    ("q_nope_absorbed_perm-{i}", 124, "self_attn.q_nope_absorbed", lc(heads_after), "absorb", "all"),
    ("Qcur-{i}", 129, "self_attn.q_nope_absorbed", concat_rope("self_attn.q_pe_rope"), "absorb", "all"),
    ("kv_cmpr_reshape-{i}", 132, "self_attn.compressed_kv_norm", lambda a, c: a[0][:, None], "absorb", "all"),
    ("Kcur-{i}", 136, "self_attn.compressed_kv_norm", concat_rope("self_attn.k_pe_rope"), "absorb", "all"),
    ("Vcur-{i}", 140, "self_attn.compressed_kv_norm", lambda a, c: a[0][:, None], "absorb", "all"),
    ("kv-{i}", 154, "self_attn.kv", lc(merged), "naive", "all"),
    ("k_nope_view-{i}", 161, "self_attn.k_nope", lc(heads_after), "naive", "all"),
    ("Vcur_view-{i}", 168, "self_attn.value_states", lc(new_only), "naive", "all"),
    ("Vcur_cont-{i}", 171, "self_attn.value_states", lc(new_only), "naive", "all"),
    ("Qcur-{i}", 174, "self_attn.query_states", interleaved(lc(heads_after)), "naive", "all"),
    ("Kcur-{i}", 177, "self_attn.key_states", interleaved(lc(new_only)), "naive", "all"),
    ("kq-{i}", "src/llama-graph.cpp:1726", "self_attn.attn_scores", raw_kq, "both", "all"),
    ("kq_soft_max-{i}", "src/llama-graph.cpp:1761", "self_attn.attn_weights", padded(0.0), "both", "all"),
    ("kqv-{i}", "src/llama-graph.cpp:1770", "self_attn.attn_output", lambda a, c: per_head(a, c)[0].transpose(1, 0, 2),
     "naive", "all"),
    ("kqv-{i}", "src/llama-graph.cpp:1770", "self_attn.attn_output_latent", heads_first, "absorb", "all"),
    ("kqv_mla-{i}", "src/llama-graph.cpp:1775", "self_attn.attn_output", lambda a,
     c: per_head(a, c)[0].transpose(1, 0, 2),
     "absorb", "all"),
    ("fattn_mla-{i}", "src/llama-graph.cpp:1717", "self_attn.attn_output", lambda a,
     c: per_head(a, c)[0].transpose(1, 0, 2),
     "absorb", "all"),  # with flash attention, in place of kqv_mla
    ("__fattn__-{i}", "src/llama-graph.cpp:1701", "self_attn.attn_output", lambda a, c: per_head(a, c)[0], "naive",
     "all"),
    ("__fattn__-{i}", "src/llama-graph.cpp:1701", "self_attn.attn_output_latent", lc(heads_after), "absorb", "all"),
    ("kqv_out-{i}", "src/llama-graph.cpp:1942", "self_attn.attn_output", lc(as_is), "naive",
     "all"),  # build_attn, KV cache
    ("kqv_out-{i}", "src/llama-graph.cpp:2029", "self_attn.attn_output", lc(as_is), "absorb",
     "all"),  # build_attn, K-only cache
    ("ffn_inp-{i}", 196, "attn_residual@rows", lc(as_is), "both", "all"),
    ("ffn_norm-{i}", 199, "post_attention_layernorm@rows", lc(as_is), "both", "all"),
    ("ffn_up-{i}", "src/llama-graph.cpp:974", "mlp.up_proj@rows", lc(as_is), "both", "dense"),
    ("ffn_gate-{i}", "src/llama-graph.cpp:996", "mlp.gate_proj@rows", lc(as_is), "both", "dense"),
    ("ffn_swiglu-{i}", "src/llama-graph.cpp:1018", "mlp.act@rows", lc(as_is), "both", "dense"),
    ("ffn_out-{i}", 207, "mlp_output@rows", lc(as_is), "both", "dense"),
    ("ffn_moe_logits-{i}", "src/llama-graph.cpp:1169", "mlp.gate.logits@rows", as_is, "both", "moe"),
    ("ffn_moe_probs-{i}", "src/llama-graph.cpp:1196", "mlp.gate.scores@rows", as_is, "both", "moe"),
    ("ffn_moe_probs_biased-{i}", "src/llama-graph.cpp:1203", "mlp.gate.scores_for_choice@rows", as_is, "both", "moe"),
    ("ffn_moe_topk-{i}", "src/llama-graph.cpp:1245", "mlp.gate.topk_idx@rows", as_is, "both", "moe"),
    ("ffn_moe_weights_scaled-{i}", "src/llama-graph.cpp:1284", "mlp.gate.topk_weight@rows", lambda a, c: a[..., None],
     "both", "moe"),
    ("ffn_moe_out-{i}", 223, "mlp.routed_output@rows", lc(as_is), "both", "moe"),
    ("ffn_shexp-{i}", 233, "mlp.shared_output@rows", lc(as_is), "both", "moe"),
    ("ffn_out-{i}", 236, "mlp_output@rows", lc(as_is), "both", "moe"),
    ("l_out-{i}", 242, "output@rows", lc(as_is), "both", "all"),
    ("result_norm", 251, "norm@rows", lc(as_is), "both", "all"),
    ("result_output", 257, "logits@rows", lc(as_is), "both", "all"),
]


def source_dump(fixture, table):
    """The fixture's tensors named and laid out as `table` says its source does. `@last`: the last
    layer's tensor under a global name; `@masked` / `@prefill`: only steps of more than one token;
    `@decode`: only one-token steps; `@grouped`: only with expert groups; `@rows`: the last layer
    keeps only the output row (the last) in llama.cpp's whole-model run."""
    cfg, run = fixture.config, fixture.manifest["run"]
    attention = {s["phase"]: s["attention"] for s in fixture.manifest["inputs"]["steps"]}
    last = cfg.num_hidden_layers - 1 if run["kind"] == "model" else None
    out, meta = {}, {}
    for name, line, target, build, path, layers in table:
        key, _, flag = target.partition("@")
        for e in fixture.entries:
            if e["key"] != key or attention[e["phase"]] != path and path != "both":
                continue
            layer, phase = e["layer"], e["phase"]
            moe = layer is not None and cfg.is_moe_layer(layer)
            if layers != "all" and (layers == "moe") != moe:
                continue
            if (flag == "last") != ("{i}" not in name and layer is not None) or flag == "last" and layer != last:
                continue
            c = Step(fixture, e["name"])
            if (flag in ("masked", "prefill") and c.t == 1 or flag == "decode" and c.t > 1
                    or flag == "grouped" and cfg.n_group == 1):
                continue
            array = build(fixture.tensors[e["name"]], c)
            if flag == "rows" and (layer is None or layer == last) and run["kind"] == "model":
                array = array[-1:]
            cand = f"{phase}." + (name.replace("{i}", str(layer)) if layer is not None else name)
            out[cand], meta[cand] = np.ascontiguousarray(array), (e["name"], line)
    return out, meta


def check_source_dump(fixture, table, naming, tmp_path):
    """Verify the dump in rounds, each with at most one name per fixture tensor, so that every name
    is compared (a second name of a tensor would only be listed as another name)."""
    dump, meta = source_dump(fixture, table)
    by_target = {}
    for cand, (target, _) in meta.items():
        by_target.setdefault(target, []).append(cand)
    verdicts = []
    for j in range(max(len(v) for v in by_target.values())):
        names = [v[j] for v in by_target.values() if len(v) > j]
        path = tmp_path / f"{naming}{j}.safetensors"
        save_file({n: dump[n] for n in names}, str(path))
        verdict = verify.verify(fixture, path, names=naming)
        assert verdict.count("mismatch") == 0, summary_line(verdict) + str(
            [(c.name, c.candidate, c.layout, c.detail) for c in verdict.checks if c.status == "mismatch"][:5])
        assert not verdict.unplaced, dict(list(verdict.unplaced.items())[:5])
        checks = {c.name: c for c in verdict.checks}
        for cand in names:
            target, line = meta[cand]
            assert checks[target].status == "match" and checks[target].candidate == cand, (cand, checks[target])
            source = verdict.read_as[target]["source"]  # read by the file and line the test's own table gives
            where = line if isinstance(line, str) else f"{FILES[naming]}:{line}"
            assert source.startswith(f"{where} @ "), (cand, source, where)
        verdicts.append(verdict)
    return dump, verdicts[0]


def perturbed(dump, name, path):
    """The dump with one entry of `name` moved by a tenth of the tensor's largest magnitude."""
    changed = dict(dump)
    a = np.array(dump[name], dtype=np.float32, copy=True)
    flat = a.reshape(-1)
    i = int(np.flatnonzero(np.isfinite(flat))[0])
    flat[i] += 0.1 * float(np.abs(flat[np.isfinite(flat)]).max()) + 0.1
    changed[name] = a
    save_file(changed, str(path))
    return path


# ---------------------------------------------------------------------------------------------
# The tests


@pytest.mark.parametrize("name", FIXTURES)
def test_an_inference_model_py_dump_verifies(name, tmp_path):
    fixture = load(ROOT / "fixtures" / name)
    dump, verdict = check_source_dump(fixture, INFERENCE, "inference", tmp_path)
    steps = {s["attention"] for s in fixture.manifest["inputs"]["steps"]}
    layer = 1 if "prefill.layers.1.hidden_states" in fixture.tensors else None
    matched = {c.key for c in verdict.checks if c.status == "match"}
    assert {"self_attn.attn_scores", "self_attn.attn_weights", "mlp.gate.topk_idx"} <= matched
    if "naive" in steps:
        assert {"self_attn.key_states", "self_attn.value_states", "self_attn.query_states"} <= matched
        layouts = {c.name: c.layout for c in verdict.checks}
        assert "new positions only (last 1 of" in layouts[f"decode0.layers.{layer}.self_attn.key_states"]
    if fixture.manifest["run"]["kind"] == "model":
        assert {"embed", "norm", "logits"} <= matched
    target = f"prefill.layers.{layer}.attn.kv#2"
    bad = verify.verify(fixture, perturbed(dump, target, tmp_path / "bad.safetensors"), names="inference")
    assert bad.first["name"] == f"prefill.layers.{layer}.self_attn.compressed_kv"


@pytest.mark.parametrize("name", FIXTURES)
def test_a_llama_cpp_dump_verifies(name, tmp_path):
    fixture = load(ROOT / "fixtures" / name)
    dump, verdict = check_source_dump(fixture, LLAMA, "llama.cpp", tmp_path)
    layer = 1 if "prefill.layers.1.hidden_states" in fixture.tensors else None
    layouts = {c.name: c.layout for c in verdict.checks}
    attended = fixture.tensors[f"decode0.layers.{layer}.self_attn.attn_scores"].shape[-1]
    assert f"first {attended} of 256 cache cells" in layouts[f"decode0.layers.{layer}.self_attn.attn_scores"]
    assert "raw K·Q" in layouts[f"decode0.layers.{layer}.self_attn.attn_scores"]
    if fixture.manifest["run"]["kind"] == "model":
        assert "last position only" in layouts["prefill.logits"]
        assert "last position only" in layouts["prefill.layers.2.output"]
        assert layouts["prefill.layers.1.output"] == "[T, d]"
    if "tiny-absorb" in name:
        path = tmp_path / "qcur.safetensors"
        save_file({f"prefill.Qcur-{layer}": dump[f"prefill.Qcur-{layer}"]}, str(path))
        got = verify.verify(fixture, path, names="llama.cpp").checks
        assert [c.layout for c in got if c.status == "match"] == [
            "[T, H, kv_lora+rope], [q_nope_absorbed | q_pe_rope], rope pairs interleaved"]
    target = f"decode0.kq-{layer}"
    bad = verify.verify(fixture, perturbed(dump, target, tmp_path / "bad.safetensors"), names="llama.cpp")
    assert bad.first["name"] == f"decode0.layers.{layer}.self_attn.attn_scores"


def test_llama_cpp_norm_is_read_as_the_naming_the_candidate_says(tmp_path):
    fixture = load(ROOT / "fixtures" / "tiny-prefill-decode")
    norm = fixture.tensors["prefill.norm"]
    path = tmp_path / "c.safetensors"
    save_file({"prefill.norm": norm, "prefill.result_norm": norm[0]}, str(path))
    default = verify.verify(fixture, path)
    assert "prefill.norm" in default.collisions and default.also == {"prefill.result_norm": "prefill.norm"}
    assert default.count("mismatch") == 0  # its other name compared too, and the same
    as_llama = verify.verify(fixture, path, names="llama.cpp")
    assert "before its weight" in as_llama.unplaced["prefill.norm"]
    assert as_llama.read_as["prefill.norm"]["alias"] == "result_norm"


def test_a_name_of_the_other_attention_path_is_listed_with_the_reason(tmp_path):
    fixture = load(ROOT / "fixtures" / "tiny-prefill-decode")  # naive attention
    path = tmp_path / "c.safetensors"
    q = fixture.tensors["prefill.layers.1.self_attn.q"]
    save_file({"prefill.layers.1.attn.q#2": np.ascontiguousarray(q.transpose(0, 2, 1, 3)),
               "prefill.layers.1.attn.q_nope#2": np.zeros((1, 7, 4, 128), np.float32),
               "prefill.norm-1#2": np.zeros((7, 192), np.float32)}, str(path))
    verdict = verify.verify(fixture, path)
    assert verdict.count("match") == 1
    assert "absorb attention path" in verdict.unplaced["prefill.layers.1.attn.q_nope#2"]
    assert "before the weight" in verdict.unplaced["prefill.norm-1#2"]


def test_a_layout_is_not_a_free_pass(tmp_path):
    """The table's layout is the one compared: scores in the reference's [B, H, T, S] under
    inference/model.py's name, or llama.cpp's rope part in the reference's order, differ."""
    fixture = load(ROOT / "fixtures" / "tiny-prefill-decode")
    scores = fixture.tensors["prefill.layers.1.self_attn.attn_weights"]
    q = fixture.tensors["prefill.layers.1.self_attn.query_states"]
    path = tmp_path / "c.safetensors"
    save_file({"prefill.layers.1.attn.scores#3": scores,
               "prefill.Qcur-1": np.ascontiguousarray(q[0].transpose(1, 0, 2))},
              str(path))
    checks = {c.name: c for c in verify.verify(fixture, path).checks}
    assert checks["prefill.layers.1.self_attn.attn_weights"].status == "mismatch"
    assert checks["prefill.layers.1.self_attn.query_states"].status == "mismatch"


def test_a_second_version_of_a_source_is_known_and_named(tmp_path):
    """llama.cpp builds that put the rope dims first in Qcur: the alternative layout matches and
    the report says so."""
    fixture = load(ROOT / "fixtures" / "tiny-prefill-decode")
    c = Step(fixture, "prefill.layers.1.self_attn.query_states")
    q = interleaved(lc(heads_after))(fixture.tensors["prefill.layers.1.self_attn.query_states"], c)
    path = tmp_path / "c.safetensors"
    save_file({"prefill.Qcur-1": np.ascontiguousarray(np.concatenate([q[..., -c.rope:], q[..., :-c.rope]], -1))},
              str(path))
    check = next(c for c in verify.verify(fixture, path, names="llama.cpp").checks if c.status != "missing")
    assert check.status == "match" and "rope dims first" in check.layout and "builds that" in check.layout


def test_a_table_name_spelt_like_another_canonical_tensor_is_refused(tmp_path):
    from stepper.errors import StepperError
    from stepper.fixtures.aliases import read_table

    table = json.loads((ROOT / "stepper/fixtures/naming/llama.cpp.json").read_text())
    table["names"].append({"name": "logits", "tensor": "norm", "line": 1, "axes": ["T", "d"]})
    (tmp_path / "llama.cpp.json").write_text(json.dumps(table))
    with pytest.raises(StepperError, match="'logits' is also the canonical name of another tensor"):
        read_table(tmp_path / "llama.cpp.json", "llama.cpp")


def test_every_table_entry_names_its_source_line():
    for naming, aliases in tables().items():
        for alias in aliases:
            assert alias.line and alias.file, (naming, alias.name)
            assert alias.tensor or alias.reason


@pytest.mark.parametrize("naming, table", [("inference", INFERENCE), ("llama.cpp", LLAMA)])
def test_every_name_of_stepper_table_is_one_this_test_builds(naming, table):
    """Each name stepper's table places is one of the names written here from the source (the
    llama.cpp embeddings' older name aside), so each is checked by a dump above."""
    written = {name for name, *_ in table}
    placed = {a.name for a in tables()[naming] if a.tensor and "deepseek_v3" in a.model_types}
    assert placed - written == set(), placed - written


# ---------------------------------------------------------------------------------------------
# transformers: every module of the real model hooked, no stepper naming involved


def hooked_run(fixture):
    if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):  # where it is required, a missing torch fails
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    from helpers.hf_reference import build_hf_model

    ck = Checkpoint(fixture.weights_path())
    model = build_hf_model(json.loads((fixture.weights_path() / "config.json").read_text()),
                           {n: np.array(ck.get(n)) for n in ck.weight_map if not n.endswith(SCALE)})
    return every_module(model, fixture.manifest["inputs"]["steps"])


def every_module(model, steps) -> dict[str, np.ndarray]:
    """Each module's output (and first positional input) of a transformers model over a fixture's
    steps with one cache, by `{phase}.{module path}`."""
    import torch
    from transformers.cache_utils import DynamicCache

    dump, phase = {}, [""]

    def save(name, value):
        values = value if isinstance(value, tuple) else (value,)
        for k, v in enumerate(values):
            if torch.is_tensor(v):
                dump[phase[0] + name + (f"[{k}]" if len(values) > 1 else "")] = v.detach().float().numpy().copy()

    for name, module in model.named_modules():
        module.register_forward_hook(lambda m, args, out, name=name: save(name, out))
        module.register_forward_pre_hook(lambda m, args, name=name: save(name + ":input", args[0]) if args else None)
    cache = DynamicCache(config=model.config)
    for step in steps:
        phase[0] = f"{step['phase']}."
        with torch.no_grad():
            model(input_ids=torch.tensor([step["ids"]]), position_ids=torch.tensor([step["positions"]]),
                  cache=cache, use_cache=True)
    return dump


def test_a_transformers_dump_of_every_module_verifies(tmp_path):
    fixture = load(ROOT / "fixtures" / "tiny-prefill-decode")
    dump = hooked_run(fixture)
    path = tmp_path / "hf.safetensors"
    save_file(dump, str(path))
    verdict = verify.verify(fixture, path, names="transformers")
    assert verdict.count("mismatch") == 0, summary_line(verdict)
    assert verdict.unknown == [] and not verdict.ambiguous, verdict.unknown[:5]
    assert verdict.count("match") >= 150, summary_line(verdict)
    matched = {c.key for c in verdict.checks if c.status == "match"}
    assert {"self_attn.kv", "self_attn.attn_weights", "mlp.gate.topk_weight", "mlp.routed_output", "logits",
            "rope_cos"} <= matched
    layouts = {c.name: c.layout for c in verdict.checks}
    assert "last 1 of 8 positions taken" in layouts["decode0.layers.1.self_attn.kv"]
    why = verdict.unplaced["prefill.model.layers.1.mlp.shared_experts.gate_proj"]
    assert "shared expert" in why
    bad_name = "prefill.model.layers.1.self_attn.kv_a_layernorm"
    bad = verify.verify(fixture, perturbed(dump, bad_name, tmp_path / "bad.safetensors"), names="transformers")
    assert bad.first["name"] == "prefill.layers.1.self_attn.compressed_kv_norm"
