"""`stepper tree --model A --compare B`: where two families' layers differ, from the catalogue and
the two configs."""

import re

import pytest
from helpers.cli import one_line, stepper
from helpers.configs import family_preset
from helpers.terminal import on_terminal

from stepper import catalog
from stepper.session import preset_config
from stepper.views.compare import compared_layer, differing_fields, merged, read_fields


def rows(out: str) -> dict[str, str]:
    """The tensors table's rows, as a pipe has them (a row a line, cells two spaces or more apart):
    name -> the rest of its line."""
    found = {}
    for line in out.splitlines():
        cells = re.split(r" {2,}", line.strip())
        if len(cells) >= 3 and ("." in cells[0] or cells[0].endswith("output")) and cells[1][0] in "[—":
            found[cells[0]] = " | ".join(cells[1:])
    return found


def config_rows(out: str) -> dict[str, list[str]]:
    """The config fields' rows: field -> its two values."""
    return {cells[0]: cells[1:] for line in out.splitlines() if len(cells := re.split(r" {2,}", line.strip())) == 3}


def test_the_tensors_one_family_has_and_the_other_lacks_and_the_formulas_that_change():
    out = stepper("tree", "--model", "tiny-v3", "--compare", "tiny-mistral4", "--plain", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    table = rows(out.stdout)
    assert table["self_attn.q_position_scale"].startswith("— | [T] | only in tiny-mistral4")
    assert table["mlp.gate.scores"].startswith("[N, 32] | — | only in tiny-v3")
    assert table["mlp.gate.softmax_scores"].startswith("— | [N, 16] | only in tiny-mistral4")
    assert "formula reads router_bias" in table["mlp.gate.scores_for_choice"]
    assert "self_attn.kv_a" not in table  # alike in both: not listed
    fields = config_rows(out.stdout)
    assert fields["scoring_func"] == ["'sigmoid'", "'softmax'"]
    assert fields["rope_scaling.factor"] == ["40.0", "8.0"] and "rope_scaling.beta_fast" not in fields  # alike
    assert fields["query_scale"] == ["None", "QueryScale"] and fields["query_scale.beta"] == ["—", "0.1"]
    listed = list(fields)
    assert listed.index("query_scale") + 1 == listed.index("query_scale.beta")  # a setting under its field


@pytest.mark.parametrize("other", ["tiny-mistral4", "tiny-v4", "tiny-kimi-linear", "tiny-glm5"])
def test_at_80_columns_no_word_is_cut_or_broken(other):
    """docs/usage.md: on a terminal, lines break between words, none is dropped: each word on the
    screen is a word of the piped output (tensor names, config fields and models were folded)."""
    screen = on_terminal("tree", "--model", "tiny-v3", "--compare", other, "--plain", columns=80)
    assert screen.code == 0 and "…" not in screen.text
    assert max(map(len, screen.lines)) <= 80
    words = set(stepper("tree", "--model", "tiny-v3", "--compare", other, "--plain").stdout.split())
    broken = [w for line in screen.lines for w in line.split() if w not in words]
    assert not broken, broken
    assert any(line.startswith("mlp.gate.scores_for_choice ") for line in screen.lines)


def test_a_dense_family_against_a_moe_one_and_every_tensor_with_all():
    out = stepper("tree", "--model", "tiny-youtu", "--compare", "tiny-axk1", "--all", "--plain", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    table = rows(out.stdout)
    assert table["mlp.gate_proj"].startswith("[B, T, 544] | — | only in tiny-youtu")
    assert table["mlp.post_mlp_layernorm"].startswith("— | [B, T, 320] | only in tiny-axk1")
    assert table["self_attn.kv_a"] == "[B, T, 144] | [B, T, 144]"  # alike: listed with --all


def test_the_compared_layers_and_the_merged_order():
    assert compared_layer(family_preset("tiny-youtu"), None) == 0
    assert compared_layer(family_preset("tiny-axk1"), None) == 1
    assert merged(["a", "b", "d"], ["a", "c", "d", "e"]) == ["a", "c", "b", "d", "e"]  # c right after a, it follows a
    fields = differing_fields(family_preset("tiny-v3"), family_preset("tiny-axk1"))
    assert set(fields) >= {"router_bias", "moe_output_norm", "model_type"} and "name" not in fields
    entry = catalog.load().entry("mlp.gate.scores_for_choice")
    assert read_fields(entry, fields) == ["router_bias"]


def test_a_bad_other_model_is_one_line():
    out = stepper("tree", "--compare", "no-such-model")
    assert "no-such-model" in one_line(out)


def test_families_with_configs_of_their_own_compare_their_fields_side_by_side():
    """DeepSeek-V4's and Kimi Linear's configs have fields MLA's has not, and lack some of its: a
    field only one side has is — on the other."""
    fields = differing_fields(family_preset("tiny-v3"), preset_config("tiny-v4"))
    assert fields["hc_mult"] == ("—", 4) and fields["kv_lora_rank"] == (128, "—")
    fields = differing_fields(family_preset("tiny-kimi-linear"), preset_config("tiny-v4"))
    assert fields["kda_layers"][1] == "—" and fields["sliding_window"][0] == "—"
    out = stepper("tree", "--model", "tiny-v3", "--compare", "tiny-kimi-linear", "--plain", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    table = rows(out.stdout)
    assert table["mlp.gate.scores"].startswith("[N, 32] | [N, 16] |")
    assert config_rows(out.stdout)["kda_layers"] == ["—", "(0, 1, 2)"]
    out = stepper("tree", "--model", "tiny-v4", "--compare", "tiny-v4-indexer", "--layer", "1", "--plain",
                  env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert rows(out.stdout)["attn.indexer.q"] == "[B, 2, T, 16] | [B, 8, T, 16] | shape; formula reads index_n_heads"


def test_through_a_pipe_trees_and_tables_keep_every_line_whole():
    """A pipe has no width: a tree's descriptions and a table's cells are not cut at 80 columns,
    and no line ends in padding."""
    tree = stepper("tree", "--model", "tiny-v4", "--layer", "1", "--plain").stdout.splitlines()
    assert not [line for line in tree if line.endswith(" ")] and max(map(len, tree)) > 80
    assert any(line.endswith("the indexer's picks (CSA) or every visible one (HCA); -1 none") for line in tree)
    compared = stepper("tree", "--model", "tiny-v3", "--compare", "tiny-mistral4", "--plain").stdout
    assert "\nrope_scaling.factor                           40.0           8.0\n" in compared


def test_a_family_stating_its_own_values_shows_them_not_a_dash():
    """Kimi Linear's config class states its model_type and its router (sigmoid scores, a bias) and
    inherits MLA's switches: compared with tiny-v3, those are its values, not — (absent)."""
    out = stepper("tree", "--model", "tiny-kimi-linear", "--compare", "tiny-v3", "--plain", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    fields = config_rows(out.stdout)
    assert fields["model_type"] == ["'kimi_linear'", "'deepseek_v3'"]
    for same in ("scoring_func", "router_bias", "topk_method", "rope_theta", "moe_layer_freq", "wrapper", "int4"):
        assert same not in fields, (same, fields.get(same))  # alike in both
    assert fields["kda_layers"] == ["(0, 1, 2)", "—"]  # a field only Kimi Linear's file sets


def test_a_class_default_of_one_family_is_no_difference_from_another():
    """tiny-v4 against tiny: MLA's switches at their defaults (a wrapper, INT4, MiniCPM3's scalings,
    LongCat's zero experts) are not fields V4 lacks; what V4's file sets and MLA's has not is."""
    out = stepper("tree", "--model", "tiny-v4", "--compare", "tiny", "--plain", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    fields = config_rows(out.stdout)
    for idle in ("wrapper", "int4", "zeroed_pad_row", "scale_emb", "q_gate", "zero_experts", "shortcut_moe",
                 "topk_method", "router_bias", "norm_topk_prob", "n_group", "quantization.fmt"):
        assert idle not in fields, (idle, fields.get(idle))
    assert fields["hc_mult"] == ["4", "—"] and fields["kv_lora_rank"] == ["—", "128"]
    assert fields["scoring_func"] == ["'sqrtsoftplus'", "'sigmoid'"]
    assert fields["model_type"] == ["'deepseek_v4'", "'kimi_k2'"]


@pytest.mark.parametrize("model, other, tensor, field", [
    ("tiny-minicpm3", "tiny-youtu", "self_attn.q_pe_rope", "rope_interleave"),  # rotate_half, no gather
    ("tiny-minicpm3", "tiny-youtu", "self_attn.k_pe_rope", "longrope"),  # LongRoPE's angles
    ("tiny-glm5", "tiny-v32", "self_attn.indexer.k_rope", "indexer_rope_interleave"),  # pairs, not halves
    ("tiny-axk2", "tiny-v32", "mlp.gate.topk_idx", "masked_groups_zero"),  # dropped groups 0.0, not -inf
])
def test_a_tensor_a_family_computes_otherwise_is_not_alike(model, other, tensor, field):
    """These differ in how the tensor is computed, not in its shape: they were counted 'alike in both'."""
    out = stepper("tree", "--model", model, "--compare", other, "--plain", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert field in rows(out.stdout)[tensor].split("formula reads ")[1]


def test_tiny_glm5_is_glm5_at_a_small_size():
    """Against the published GLM-5 only sizes differ, and the two choices its preset's comment
    gives (one dense layer, layer 2 shared): none of tiny-v32's YaRN, FP8, groups or eps."""
    out = stepper("tree", "--model", "glm-5", "--compare", "tiny-glm5", "--plain", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    sizes = {"vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
             "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
             "v_head_dim", "n_routed_experts", "num_experts_per_tok", "index_n_heads", "index_head_dim", "index_topk"}
    fields = config_rows(out.stdout)
    assert set(fields) - {"config field", "tensor"} == sizes | {"first_k_dense_replace", "index_reused_layers"}
    assert fields["index_reused_layers"] == ["()", "(2,)"]


def test_a_layer_of_sublayers_is_lined_up_with_a_layer_of_none_row_by_row():
    """LongCat's sub0./sub1. tensors were listed as 'only in' it, beside the other family's same
    tensors listed as 'only in' that one: its attention, norms and MLP never lined up."""
    out = stepper("tree", "--model", "tiny-longcat", "--compare", "tiny", "--plain")
    assert out.returncode == 0, out.stderr
    table = rows(out.stdout)
    assert not [name for name in table if name.startswith("sub")]
    assert table["self_attn.q_a"] == "[B, T, 96] ×2 | [B, T, 192] | shape; formula reads hidden_size, q_lora_rank"
    assert table["self_attn.q"] == "[B, 4, T, 48] ×2 | [B, 4, T, 48] | formula reads q_lora_rank"
    assert "self_attn.q_nope" not in table  # alike but for the ×2, which the line above says once
    assert table["mlp.gate.logits"].startswith("[N, 12] | [N, 32] | shape")  # the MoE beside them: once
    assert table["mlp.gate_proj"].startswith("[B, T, 352] ×2 | — | only in tiny-longcat")
    said = ("tiny-longcat's layer runs 2 sublayers (sub0., sub1.): a sublayer's tensor is on the row of tiny's of "
            "the same name, ×2 after its shape when each sublayer emits it")
    assert out.stdout.splitlines()[1] == said and out.stdout.count("sublayers") == 1
    reverse = rows(stepper("tree", "--model", "tiny-glm5", "--compare", "tiny-longcat", "--all", "--plain").stdout)
    assert reverse["self_attn.q_nope"] == "[B, 4, T, 32] | [B, 4, T, 32] ×2"
    same = stepper("tree", "--model", "tiny-longcat", "--compare", "tiny-longcat", "--all", "--plain").stdout
    assert "×" not in same and "sublayers" not in same and "sub1.self_attn.q" in rows(same)


def test_all_without_compare_is_refused():
    """`tree --all` printed the layer as plain `tree` does, the option read by nothing."""
    assert one_line(stepper("tree", "--all", "--plain")) == (
        "stepper: error: --all lists the tensors alike in both models of --compare: add --compare NAME|PATH")
