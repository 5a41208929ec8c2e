"""DeepSeek-V2-Lite and V3.2 fixtures, named as their implementations name things, verify.

For DeepSeek's V3.2 inference/model.py the table below is written here from the source
(deepseek-ai/DeepSeek-V3.2-Exp at 3b99a53: each entry its name, line and layout), independently
of stepper's naming tables; the dump is built from the fixture's tensors that way and must verify
with no divergence in prefill (MLA's MHA branch) and decode (its absorbed branch), and a perturbed
tensor is named as the first divergence. For transformers, the real DeepseekV2ForCausalLM and
DeepseekV32ForCausalLM run on each fixture's weights with a forward hook on every module of the
fixture's layer, and that dump verifies.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from test_naming import (
    as_is,
    before_mask,
    check_source_dump,
    heads_after,
    interleaved,
    inverted,
    merged,
    n_rows,
    new_only,
    per_head,
    perturbed,
)

from stepper import families
from stepper.fixtures import verify
from stepper.fixtures.aliases import tables
from stepper.fixtures.fixture import load
from stepper.fixtures.show import summary_line
from stepper.weights.checkpoint import SCALE, Checkpoint
from stepper.weights.names import weight_shapes

ROOT = Path(__file__).resolve().parents[2]


def future_slots(a, c):  # the reference's -1 slots hold a masked (future) position in the source
    out = np.array(a, copy=True)
    out[out < 0] = c.other("self_attn.indexer.mask").shape[-1] - 1
    return out


# ---------------------------------------------------------------------------------------------
# DeepSeek-V3.2-Exp inference/model.py at 3b99a5350d260b7c2a357e82362305509e2d0724 (blob 9d672e5a):
# name, line, fixture tensor (@prefill: steps of more than one token, where MLA takes its MHA
# branch; @decode: one-token steps, its absorbed branch; @last, @grouped as in test_naming),
# layout, path, layers.

INFERENCE_V32 = [
    ("h#1", 893, "embed", as_is, "both", "all"),
    ("h#2", 895, "mlp_output@last", as_is, "both", "all"),
    ("residual#2", 895, "attn_residual@last", as_is, "both", "all"),
    ("h#3", 896, "norm", as_is, "both", "all"),
    ("logits", 897, "logits", lambda a, c: a[:, -1], "both", "all"),
    ("layers.{i}.x#2", 836, "input_layernorm", as_is, "both", "all"),
    ("layers.{i}.residual#2", 836, "hidden_states", as_is, "both", "all"),
    ("layers.{i}.x#3", 837, "self_attn.o_proj", as_is, "both", "all"),
    ("layers.{i}.x#4", 838, "post_attention_layernorm", as_is, "both", "all"),
    ("layers.{i}.residual#3", 838, "attn_residual", as_is, "both", "all"),
    ("layers.{i}.x#5", 839, "mlp_output", as_is, "both", "all"),
    ("layers.{i}.attn.x#1", 537, "input_layernorm", as_is, "both", "all"),
    ("layers.{i}.attn.qr", 552, "self_attn.q_a_norm", as_is, "both", "all"),
    ("layers.{i}.attn.q#1", 553, "self_attn.q", merged, "both", "all"),
    ("layers.{i}.attn.q#2", 554, "self_attn.q", heads_after, "both", "all"),
    ("layers.{i}.attn.q_nope#1", 555, "self_attn.q_nope", heads_after, "both", "all"),
    ("layers.{i}.attn.q_pe#1", 555, "self_attn.q_pe", heads_after, "both", "all"),
    ("layers.{i}.attn.q_pe#2", 556, "self_attn.q_pe_rope", interleaved(heads_after), "both", "all"),
    ("layers.{i}.attn.kv#1", 557, "self_attn.kv_a", as_is, "both", "all"),
    ("layers.{i}.attn.kv#2", 558, "self_attn.compressed_kv", as_is, "both", "all"),
    ("layers.{i}.attn.k_pe#1", 558, "self_attn.k_pe", lambda a, c: a[:, 0], "both", "all"),
    ("layers.{i}.attn.kv#3", 559, "self_attn.compressed_kv_norm", as_is, "both", "all"),
    ("layers.{i}.attn.k_pe#2", 560, "self_attn.k_pe_rope", interleaved(heads_after), "both", "all"),
    # the MHA branch (mask is not None)
    ("layers.{i}.attn.q#3", 564, "self_attn.query_states@prefill", interleaved(heads_after), "both", "all"),
    ("layers.{i}.attn.kv#4", 565, "self_attn.kv@prefill", merged, "both", "all"),
    ("layers.{i}.attn.kv#5", 566, "self_attn.kv@prefill", heads_after, "both", "all"),
    ("layers.{i}.attn.k_nope", 567, "self_attn.k_nope@prefill", heads_after, "both", "all"),
    ("layers.{i}.attn.v", 567, "self_attn.value_states@prefill", new_only, "both", "all"),
    ("layers.{i}.attn.k", 568, "self_attn.key_states@prefill", interleaved(new_only), "both", "all"),
    ("layers.{i}.attn.scores#1", 569, "self_attn.attn_scores@prefill", before_mask, "both", "all"),
    ("layers.{i}.attn.topk_indices", 572, "self_attn.indexer.topk_idx@prefill", future_slots, "both", "all"),
    ("layers.{i}.attn.index_mask#2", 574, "self_attn.indexer.mask@prefill", as_is, "both", "all"),
    ("layers.{i}.attn.scores#2", 575, "self_attn.attn_scores@prefill", heads_after, "both", "all"),
    ("layers.{i}.attn.scores#3", 577, "self_attn.attn_weights@prefill", heads_after, "both", "all"),
    ("layers.{i}.attn.x#2", 578, "self_attn.attn_output@prefill", per_head, "both", "all"),
    ("layers.{i}.attn.x#3", 596, "self_attn.o_proj@prefill", as_is, "both", "all"),
    # the absorbed branch (a one-token step)
    ("layers.{i}.attn.q_nope#2", 584, "self_attn.q_nope_absorbed@decode", heads_after, "absorb", "all"),
    ("layers.{i}.attn.scores#1", 585, "self_attn.attn_scores@decode", before_mask, "both", "all"),
    ("layers.{i}.attn.topk_indices", 589, "self_attn.indexer.topk_idx@decode", future_slots, "both", "all"),
    ("layers.{i}.attn.index_mask#1", 590, "self_attn.indexer.mask@decode", as_is, "both", "all"),
    ("layers.{i}.attn.scores#2", 591, "self_attn.attn_scores@decode", heads_after, "both", "all"),
    ("layers.{i}.attn.scores#3", 593, "self_attn.attn_weights@decode", heads_after, "both", "all"),
    ("layers.{i}.attn.x#2", 594, "self_attn.attn_output_latent@decode", heads_after, "absorb", "all"),
    ("layers.{i}.attn.x#3", 595, "self_attn.attn_output@decode", per_head, "both", "all"),
    ("layers.{i}.attn.x#4", 596, "self_attn.o_proj@decode", as_is, "both", "all"),
    # the Indexer
    ("layers.{i}.attn.indexer.x", 452, "input_layernorm", as_is, "both", "all"),
    ("layers.{i}.attn.indexer.qr", 452, "self_attn.q_a_norm", as_is, "both", "all"),
    ("layers.{i}.attn.indexer.q#1", 455, "self_attn.indexer.q", merged, "both", "all"),
    ("layers.{i}.attn.indexer.q#2", 456, "self_attn.indexer.q", heads_after, "both", "all"),
    ("layers.{i}.attn.indexer.k#1", 460, "self_attn.indexer.k", as_is, "both", "all"),
    ("layers.{i}.attn.indexer.k#2", 461, "self_attn.indexer.k_norm", as_is, "both", "all"),
    ("layers.{i}.attn.indexer.weights#1", 471, "self_attn.indexer.head_weights", as_is, "both", "all"),
    ("layers.{i}.attn.indexer.topk_indices", 476, "self_attn.indexer.topk_idx", future_slots, "both", "all"),
    # MLP, MoE, Gate
    ("layers.{i}.ffn.x#1", 622, "post_attention_layernorm", as_is, "both", "dense"),
    ("layers.{i}.ffn.x#1", 769, "post_attention_layernorm", as_is, "both", "moe"),
    ("layers.{i}.ffn.x#2", 780, "post_attention_layernorm", n_rows, "both", "moe"),
    ("layers.{i}.ffn.weights", 781, "mlp.gate.topk_weight", as_is, "both", "moe"),
    ("layers.{i}.ffn.indices", 781, "mlp.gate.topk_idx", as_is, "both", "moe"),
    ("layers.{i}.ffn.y#2", 789, "mlp.routed_output", n_rows, "both", "moe"),
    ("layers.{i}.ffn.y#3", 790, "mlp_output", n_rows, "both", "moe"),
    ("layers.{i}.ffn.gate.x", 666, "post_attention_layernorm", n_rows, "both", "moe"),
    ("layers.{i}.ffn.gate.scores#1", 676, "mlp.gate.logits", as_is, "both", "moe"),
    ("layers.{i}.ffn.gate.scores#2", 680, "mlp.gate.scores", as_is, "both", "moe"),
    ("layers.{i}.ffn.gate.original_scores", 681, "mlp.gate.scores", as_is, "both", "moe"),
    ("layers.{i}.ffn.gate.scores#3", 683, "mlp.gate.scores_for_choice", as_is, "both", "moe"),  # dim == 7168 only
    ("layers.{i}.ffn.gate.scores#4", 685, "mlp.gate.scores_for_choice@grouped",
     lambda a, c: a.reshape(a.shape[0], c.fixture.config.n_group, -1), "both", "moe"),
    ("layers.{i}.ffn.gate.group_scores", 689, "mlp.gate.group_scores@grouped", as_is, "both", "moe"),
    ("layers.{i}.ffn.gate.mask", 691, "mlp.gate.group_mask@grouped", inverted, "both", "moe"),
    ("layers.{i}.ffn.gate.indices#2", 693, "mlp.gate.topk_idx", as_is, "both", "moe"),
    ("layers.{i}.ffn.gate.weights#3", 697, "mlp.gate.topk_weight", as_is, "both", "moe"),
]


def test_a_v32_inference_model_py_dump_verifies(tmp_path):
    fixture = load(ROOT / "fixtures" / "tiny-v32-indexer")
    dump, verdict = check_source_dump(fixture, INFERENCE_V32, "inference", tmp_path)
    matched = {c.name for c in verdict.checks if c.status == "match"}
    assert {f"{p}.layers.1.self_attn.indexer.{k}" for p in ("prefill", "decode0")
            for k in ("q", "k", "k_norm", "head_weights", "topk_idx", "mask")} <= matched
    layouts = {c.name: c.layout for c in verdict.checks}
    assert "-1 slots" in layouts["prefill.layers.1.self_attn.indexer.topk_idx"]
    assert (fixture.tensors["prefill.layers.1.self_attn.indexer.topk_idx"] < 0).any()  # the slots are there
    assert "new positions only" in layouts["prefill.layers.1.self_attn.key_states"] or \
        layouts["prefill.layers.1.self_attn.key_states"].startswith("[B, T, H, qk_head]")
    bad = verify.verify(fixture, perturbed(dump, "decode0.layers.1.attn.indexer.k#2", tmp_path / "bad.safetensors"),
                        names="inference")
    assert bad.first["name"] == "decode0.layers.1.self_attn.indexer.k_norm"


def test_a_v32_decode_name_is_not_read_in_prefill(tmp_path):
    """x#3 is the projection in a prefill step and the per-head output in a decode step; q#3 (the
    MHA branch's query) exists in prefill only."""
    fixture = load(ROOT / "fixtures" / "tiny-v32-indexer")
    o = fixture.tensors["prefill.layers.1.self_attn.o_proj"]
    per = fixture.tensors["decode0.layers.1.self_attn.attn_output"]
    path = tmp_path / "c.safetensors"
    save_file({"prefill.layers.1.attn.x#3": o, "decode0.layers.1.attn.x#3": per.reshape(1, 1, 4, -1),
               "decode0.layers.1.attn.q#3": np.zeros((1, 1, 4, 48), np.float32)}, str(path))
    verdict = verify.verify(fixture, path, names="inference")
    read = {c.name: c.candidate for c in verdict.checks if c.status == "match"}
    assert read == {"prefill.layers.1.self_attn.o_proj": "prefill.layers.1.attn.x#3",
                    "decode0.layers.1.self_attn.attn_output": "decode0.layers.1.attn.x#3"}
    assert "steps of more than one token; this step has 1" in verdict.unplaced["decode0.layers.1.attn.q#3"]


def test_what_v32_inference_cannot_compare_is_said():
    reasons = {a.name: a.reason for a in tables()["inference"] if "deepseek_v32" in a.model_types and a.reason}
    assert "interleaved pairs" in reasons["layers.{i}.attn.indexer.q_pe#2"]
    assert "Hadamard" in reasons["layers.{i}.attn.indexer.q#4"]
    assert ("FP8" in reasons["layers.{i}.attn.indexer.q_fp8"]
            and "FP8" in reasons["layers.{i}.attn.indexer.index_score#1"])


def test_every_v32_inference_name_of_stepper_table_is_one_this_test_builds():
    written = {name for name, *_ in INFERENCE_V32}
    placed = {a.name for a in tables()["inference"] if a.tensor and "deepseek_v32" in a.model_types}
    assert placed - written == set(), placed - written


def test_a_v3_table_is_not_read_for_another_family(tmp_path):
    """transformers' V3 router hook name means other tensors in V2: the V2 fixture reads V2's table."""
    fixture = load(ROOT / "fixtures" / "tiny-v2-lite")
    sources = {a.source for a in tables()["transformers"] if a.name == "model.layers.{i}.mlp.gate[0]"}
    assert len(sources) == 11  # V3, V2, V3.2, GLM-5, V4, GLM-4.7-Flash, Mistral 4, A.X-K1, A.X-K2, Kimi Linear, Ling 3
    path = tmp_path / "c.safetensors"
    save_file({"prefill.model.layers.1.mlp.gate[0]": fixture.tensors["prefill.layers.1.mlp.gate.logits"]}, str(path))
    verdict = verify.verify(fixture, path, names="transformers")
    assert verdict.read_as["prefill.layers.1.mlp.gate.logits"]["source"].startswith(
        "models/deepseek_v2/modeling_deepseek_v2.py:133 @")


# ---------------------------------------------------------------------------------------------
# transformers: every module of the fixture's layer hooked, no stepper naming involved. A layer
# fixture holds the weights of its layer only: the other layers get zero weights, which makes each
# of them the identity (its attention and MLP add zero to the residual), so the hooked layer sees
# the token embeddings, as the fixture's layer does, and the cache and masks are the model's own.


def hooked_run(fixture):
    if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    import torch
    from helpers.hf_reference import build_hf_model
    from transformers.cache_utils import DynamicCache

    ck = Checkpoint(fixture.weights_path(), families.load_config)
    arrays = {n: np.zeros(shape, np.float32) for n, shape in weight_shapes(fixture.config).items()}
    arrays.update({n: np.array(ck.get(n), dtype=np.float32) for n in ck.weight_map if not n.endswith(SCALE)})
    model = build_hf_model(json.loads((fixture.weights_path() / "config.json").read_text()), arrays)
    run = set(fixture.manifest["run"]["layers_run"])
    dump, phase = {}, [""]

    def save(name, value):
        values = value if isinstance(value, tuple) else (value,)
        for k, v in enumerate(values):
            if torch.is_tensor(v):
                v = torch.view_as_real(v) if v.is_complex() else v
                dump[phase[0] + name + (f"[{k}]" if len(values) > 1 else "")] = v.detach().float().numpy().copy()

    for name, module in model.named_modules():
        parts = name.split(".")
        if parts[1:2] == ["layers"] and len(parts) > 2 and int(parts[2]) not in run:
            continue  # a zero layer
        module.register_forward_hook(lambda m, args, out, name=name: save(name, out))
        module.register_forward_pre_hook(lambda m, args, name=name: save(name + ":input", args[0]) if args else None)
    cache = DynamicCache(config=model.config)
    for step in fixture.manifest["inputs"]["steps"]:
        phase[0] = f"{step['phase']}."
        with torch.no_grad():
            model(input_ids=torch.tensor([step["ids"]]), position_ids=torch.tensor([step["positions"]]),
                  cache=cache, use_cache=True)
    return dump


@pytest.mark.parametrize("name, module, first", [
    ("tiny-v2-lite", "model.layers.1.self_attn.q_proj", "self_attn.q"),
    ("tiny-v32-indexer", "model.layers.1.self_attn.indexer.k_norm", "self_attn.indexer.k_norm"),
])
def test_a_transformers_dump_of_every_module_of_the_layer_verifies(name, module, first, tmp_path):
    fixture = load(ROOT / "fixtures" / name)
    dump = hooked_run(fixture)
    path = tmp_path / "hf.safetensors"
    save_file(dump, str(path))
    verdict = verify.verify(fixture, path, names="transformers")
    assert verdict.count("mismatch") == 0, summary_line(verdict)
    assert verdict.unknown == [] and not verdict.ambiguous, verdict.unknown[:5]
    matched = {c.key for c in verdict.checks if c.status == "match"}
    assert {"self_attn.q", "self_attn.kv", "self_attn.attn_weights", "self_attn.attn_output", "mlp.gate.logits",
            "mlp.gate.topk_idx", "mlp.gate.topk_weight", "mlp.routed_output", "mlp.shared_output", "output"} <= matched
    by_phase = {c.name.split(".")[0] for c in verdict.checks if c.status == "match"}
    assert by_phase == {"prefill", "decode0"}
    if name == "tiny-v32-indexer":
        assert {"rope_cos", "self_attn.indexer.q", "self_attn.indexer.k_norm", "self_attn.indexer.topk_idx"} <= matched
        assert "unmasked" not in verdict.unplaced.get("prefill.model.layers.1.self_attn.indexer.weights_proj", "")
    else:
        assert "complex rotary factors" in verdict.unplaced["prefill.model.rotary_emb"]
    bad = verify.verify(fixture, perturbed(dump, f"decode0.{module}", tmp_path / "bad.safetensors"),
                        names="transformers")
    assert bad.first["name"] == f"decode0.layers.1.{first}"


def test_only_the_reference_s_minus_one_index_slots_are_left_out(tmp_path):
    """The -1 slots take any value; a chosen position elsewhere that differs is a divergence."""
    fixture = load(ROOT / "fixtures" / "tiny-v32-indexer")
    idx = fixture.tensors["prefill.layers.1.self_attn.indexer.topk_idx"]
    free = np.where(idx < 0, 7, idx)
    wrong = free.copy()
    wrong[0, 3, 0] = (wrong[0, 3, 0] + 1) % 4
    for array, status in ((free, "match"), (wrong, "mismatch")):
        path = tmp_path / f"{status}.safetensors"
        save_file({"prefill.layers.1.attn.indexer.topk_indices": np.ascontiguousarray(array)}, str(path))
        checks = [c for c in verify.verify(fixture, path, names="inference").checks if c.status != "missing"]
        assert [c.status for c in checks] == [status], checks


def test_every_transformers_entry_is_at_a_line_that_calls_its_module():
    """Read against the installed transformers: each name's line calls that module (the dense
    MLP's projections and act_fn share one line)."""
    transformers = pytest.importorskip("transformers")
    folder = Path(transformers.__file__).parent
    assert transformers.__version__ == "5.24.0"
    for alias in tables()["transformers"]:
        line = (folder / alias.file).read_text(encoding="utf-8").split("\n")[alias.line - 1]
        parent, _, module = alias.name.removesuffix(":input").split("[")[0].rpartition(".")
        # a decoder layer is called by its loop variable: `decoder_layer(` (MLA's), `layer(` (V4's); a
        # ModuleList's item by its index (LongCat's `self.self_attn[0](`); Kimi K2.5's embed_tokens by the
        # accessor that returns it
        called = {"{i}": ["layer("], "rotary_emb": ["self.rotary_emb("],
                  "embed_tokens": ["embed_tokens(", "self.get_input_embeddings()("]}.get(module, [f"{module}("])
        if module.isdigit():
            called = [f"{parent.rsplit('.', 1)[-1]}[{module}]("]
        assert any(call in line for call in called), (alias.file, alias.name, alias.line, line.strip())
