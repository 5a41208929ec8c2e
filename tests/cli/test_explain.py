"""`stepper explain`, `stepper tree` and the debugger's `e` as a user meets them: what a query
finds, the run's own sizes in the texts, and citations that name their own file's lines."""

from __future__ import annotations

import io
import re

import pytest
from helpers.cli import stepper
from rich.console import Console

import stepper as api
from stepper import catalog
from stepper.presets import PRESETS, V4_PRESETS, preset
from stepper.session import preset_config
from stepper.views.explain import explain_text
from stepper.views.tree import layer_tree


def printed(renderables) -> str:
    console = Console(file=io.StringIO(), width=200, no_color=True, highlight=False, markup=False)
    for r in renderables:
        console.print(r)
    return console.file.getvalue()


def explained(query: str, model: str = "tiny") -> str:
    """What `stepper explain QUERY --model MODEL` prints for the entries it finds, made in-process."""
    cat = catalog.around(preset(model))
    return printed(explain_text(cat, entry, preset(model)) for entry in cat.find(query))


def titles(out: str) -> list[str]:
    """The entries an explain printed: each starts with its catalogue name (or a sublayer's name of
    it: `sub1.self_attn.q`) alone on a line."""
    names = set(catalog.load().names())
    return [line for line in out.splitlines() if line in names or re.fullmatch(r"sub\d\.[\w.]+", line)
            and catalog.key_of(line) in names]


def test_a_weight_name_explains_the_tensors_computed_from_it():
    out = stepper("explain", "model.layers.1.self_attn.q_a_proj.weight", "--plain")
    assert out.returncode == 0, out.stderr
    assert titles(out.stdout) == ["self_attn.q_a"]
    gate = explained("model.layers.1.mlp.gate")
    assert titles(gate) == ["mlp.gate.logits", "mlp.gate.topk_idx", "mlp.gate.topk_weight"]


def test_a_word_explains_every_name_containing_it_and_the_texts_use_the_runs_sizes():
    out = explained("topk")
    assert titles(out) == ["mlp.gate.topk_idx", "mlp.gate.topk_weight", "self_attn.indexer.topk_idx",
                           "self_attn.indexer.exact_topk_idx", "self_attn.indexer.reused_topk_idx"]
    assert "k (chosen experts = 4)" in out and "Each token runs 4 of the 32 routed experts" in out
    full = explained("topk_idx", "kimi-k2")
    assert "k (chosen experts = 8)" in full and "Each token runs 8 of the 384 routed experts" in full


def test_a_typo_gets_the_nearest_names_and_the_debugger_explains_with_the_runs_sizes():
    bad = stepper("explain", "compresed_kv")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().startswith("stepper: error: no tensor named 'compresed_kv' in the catalogue; did you "
                                         "mean compressed_kv"), bad.stderr
    out = stepper("step", "--plain", "--break", "layers.0.self_attn.k_pe",
                  stdin="e compresed_kv\ne q_pe_rope\ne layers.9.x\nq\n")
    assert out.returncode == 0, out.stderr
    assert "(stepper) e layers.9.x\nlayers.9.x: layer 9 out of range: model tiny has layers 0..2\n" in out.stdout
    assert "no tensor named 'compresed_kv' in the catalogue; did you mean compressed_kv" in out.stdout
    assert "dims i and i + 8 form the pair" in out.stdout  # the tiny run's 16 rope dims, not Kimi K2's 64


def citation_blocks(out: str) -> dict[str, list[str]]:
    """Each citation header line ('modeling_deepseek.py  line 775  (...)') -> the lines under it."""
    blocks: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if re.match(r"^(modeling_deepseek\.py|transformers \S+|DeepSeek inference/model\.py)  lines? \d", line):
            current = line
            blocks[current] = []
        elif current is not None and line.startswith("    "):
            blocks[current].append(line)
        else:
            current = None
    return blocks


def test_each_citation_names_its_own_files_lines():
    out = stepper("explain", "kv_a", "--plain").stdout
    assert "lines 775-775" not in out
    blocks = citation_blocks(out)
    (mds,) = [h for h in blocks if h.startswith("modeling_deepseek.py")]
    assert mds == "modeling_deepseek.py  line 775  (moonshotai/Kimi-K2-Instruct@fd1984e2b7a3)"  # the model's own
    assert blocks[mds] == ["     775          compressed_kv = self.kv_a_proj_with_mqa(hidden_states)"]
    blocks = citation_blocks(stepper("explain", "k_pe", "--plain").stdout)
    assert blocks["modeling_deepseek.py  lines 776-779  (moonshotai/Kimi-K2-Instruct@fd1984e2b7a3)"] == [  # every line
        "     776          compressed_kv, k_pe = torch.split(",
        "     777              compressed_kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1",
        "     778          )",
        "     779          k_pe = k_pe.view(bsz, q_len, 1, self.qk_rope_head_dim).transpose(1, 2)"]
    out = explained("q_pe_rope")
    assert "359" not in out  # modeling_deepseek.py's apply_rotary_pos_emb lines are printed nowhere
    (hf,) = [h for h in citation_blocks(out) if h.startswith("transformers modeling_deepseek_v3.py")]
    assert hf.startswith("transformers modeling_deepseek_v3.py  lines 453-456  (transformers 5.24.0)")
    assert "rope_interleave" in citation_blocks(out)[hf][0]


def test_tree_describes_q_without_another_models_sizes():
    out = re.sub(r"[\s│]+", " ", printed([layer_tree(catalog.load(), preset("tiny"), 1, "naive")]))
    assert "self_attn.q [B, 4 heads, T, 48 q/k head dims] Per-head queries: q_b_proj output viewed as " \
           "[B, T, H, qk_head]" in out
    assert "64-dim" not in out and "192]" not in out



def test_every_entry_of_each_familys_catalogue_is_explained_with_its_dims_defined():
    """`e` at any stop and `stepper explain NAME`: every entry the catalogue of each tiny preset
    searches renders, each of its dims defined there (DeepSeek-V4's indexer once named dims only the
    V3.2 indexer's part defined, and `e` ended the session with a KeyError)."""
    for model in [m for m in [*PRESETS, *V4_PRESETS] if m.startswith("tiny")]:
        cfg = preset_config(model)
        cat = catalog.around(cfg)
        for entry in cat.raw["tensors"]:
            undefined = [s for s in entry["dims"] if s not in cat.raw["dims"]]
            assert not undefined, (model, entry["name"], undefined)
            assert entry["name"] in printed([explain_text(cat, entry, cfg)])
    out = stepper("explain", "attn.indexer.q", "--model", "tiny-v4-indexer")
    assert out.returncode == 0 and "Hi (index heads = 8)" in out.stdout, out.stderr


def test_an_entry_the_model_never_emits_says_which_model_does():
    """Kimi K2's catalogue shares the residual stream with Kimi Linear's: `state` finds KDA's entry,
    shown with tiny-kimi-linear's sizes under a line saying tiny does not emit it."""
    out = stepper("explain", "state", "--plain")
    assert out.returncode == 0 and out.stdout.splitlines()[0] == (
        "model tiny does not emit it: a tensor of tiny-kimi-linear's, shown with its sizes (stepper explain "
        "self_attn.state --model tiny-kimi-linear)")
    assert "does not emit" not in stepper("explain", "state", "--model", "tiny-kimi-linear", "--plain").stdout
    assert "does not emit" not in stepper("explain", "k_pe", "--plain").stdout


@pytest.mark.parametrize(("name", "emitter", "sizes"), [
    ("hc_attn.comb", "tiny-v4", "n (residual streams = 4), n (residual streams = 4)"),  # another stream's family
    ("self_attn.state", "tiny-kimi-linear", "Hk (KDA heads = 4), K (KDA key dims = 32)"),  # the same stream's
    ("mlp.zero_expert_output", "tiny-longcat", "d (hidden = 256)"),  # an MLA variant's: not tiny's hidden 320
])
def test_another_familys_tensor_is_shown_alike_with_the_sizes_of_a_model_that_emits_it(name, emitter, sizes):
    """One behaviour for every tensor of another family (docs/usage.md): exit 0, a first line naming
    the model that emits it, and its entry with that model's sizes."""
    out = stepper("explain", name, "--model", "tiny", "--plain")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == (f"model tiny does not emit it: a tensor of {emitter}'s, shown with its sizes "
                        f"(stepper explain {name} --model {emitter})")
    assert lines[2] == name
    shape = next(line for line in lines if line.startswith("shape "))
    assert sizes in shape and "hidden = 320" not in out.stdout
    own = stepper("explain", name, "--model", emitter, "--plain").stdout
    assert "does not emit" not in own and shape in own.splitlines()  # the sizes its own model gives


def test_an_entry_without_a_model_names_its_dims_and_fields():
    entry = catalog.load().entry("mlp.zero_expert_output")
    text = printed([explain_text(catalog.load(), entry, None)])
    assert "d (hidden)" in text and "{" not in text.split("stepper emits it")[0]


def test_the_names_fixtures_verify_prints_are_explained_as_the_tensors_they_hold():
    """Another implementation's name as verify prints it (#n a variable's n-th value, {i} the layer,
    a step's prefix): which of stepper's tensors it holds, from the naming tables; one without its
    #n stands for each of its values."""
    cases = {"layers.1.attn.kv#2": ["self_attn.compressed_kv"], "prefill.layers.1.attn.kv#3": ["self_attn.kv"],
             "q_pe#2": ["self_attn.q_pe_rope"],
             "kv_cmpr-1": ["self_attn.compressed_kv", "self_attn.compressed_kv_norm"],
             "model.layers.1.mlp.gate[0]": ["mlp.gate.logits"],
             "attn.kv": ["self_attn.kv_a", "self_attn.compressed_kv", "self_attn.kv"]}
    for query, tensors in cases.items():
        out = stepper("explain", query, "--plain")
        assert out.returncode == 0, (query, out.stderr)
        notes = [line for line in out.stdout.splitlines() if line.startswith(query + " is ")]
        assert [note.rsplit(": ", 1)[1] for note in notes] == tensors if query != "attn.kv" else \
            sorted({note.rsplit(": ", 1)[1] for note in notes}) == sorted(tensors), (query, notes)
        headings = [line for line in out.stdout.splitlines() if line in tensors]
        assert headings == list(dict.fromkeys(tensors)), (query, headings)
    assert "is inference's layers.{i}.attn.kv#2 (inference/model.py:" in stepper("explain", "attn.kv#2").stdout
    assert " is " not in stepper("explain", "kv", "--plain").stdout.splitlines()[0]  # stepper's own name first


@pytest.mark.parametrize("name, model, said", [
    ("layers.0.self_attn.indexer.q_rope", "tiny-glm5", "turns its first 16 dims in interleaved pairs (2i, 2i+1)"),
    ("layers.0.self_attn.indexer.k_rope", "tiny-glm5", "k_norm[..., :rope][..., 0::2]"),
    ("layers.0.self_attn.q_pe_rope", "tiny-minicpm3", "no gather of evens and odds"),
    ("rope_cos", "tiny-minicpm3", "LongRoPE divides each pair's frequency"),
    ("logits", "tiny-minicpm3", "lm_head is the embedding matrix itself"),
    ("logits", "tiny-youtu", "lm_head is the embedding matrix itself"),
    ("layers.3.self_attn.q_pe", "tiny-kimi-linear", "use no position encoding (mla_use_nope)"),
    ("mlp.gate.scores_for_choice", "tiny-axk1", "router has no load-balancing bias"),
    ("mlp.gate.topk_idx", "tiny-mistral4", "this router has no e_score_correction_bias"),
    ("mlp.gate.topk_idx", "tiny-axk2", "scores_for_choice, 0.0), num_experts_per_tok"),
    ("mlp.gate.topk_weight", "tiny-longcat", "not divided by their sum (norm_topk_prob false)"),
    ("rope_cos", "tiny-youtu", "no YaRN (rope_scaling unset)"),  # said: factor = (not set) ...
    ("embed", "tiny-youtu", "zeroes the pad token's row (id 999)"),
    ("layers.1.self_attn.attn_scores", "tiny-glm4-flash", "no YaRN, so no mscale multiplies it"),
])
def test_explain_notes_where_a_family_computes_a_tensor_otherwise(name, model, said):
    """The catalogue's texts are DeepSeek's: GLM-5's indexer rope (pairs, not halves), MiniCPM3's
    rotate_half and LongRoPE, a tied lm_head were explained as DeepSeek computes them."""
    out = stepper("explain", name, "--model", model, "--plain")
    assert out.returncode == 0, out.stderr
    assert said in " ".join(out.stdout.split()), out.stdout
    deepseek = stepper("explain", name, "--model", "tiny-v32", "--plain").stdout
    assert "\nnote " not in deepseek


@pytest.mark.parametrize("name, model, own, deepseeks", [
    ("rope_cos", "tiny-glm4-flash", "rope_cos = cat(cos(freqs), cos(freqs)) Only the", "factor = (not set)"),
    ("rope_cos", "tiny-youtu", "rope_theta = 1600000, no frequency is divided", "inv_freq_yarn"),
    ("rope_cos", "tiny-glm5", "pair i turns by rope_theta^(-2i/16) radians", "mscale(factor, mscale)"),
    ("rope_sin", "tiny-axk1", "rope_sin = cat(sin(freqs), sin(freqs)) Same angles", "mscale(factor, mscale)"),
    ("rope_cos", "tiny-minicpm3", "long_factor[i] once it is past", "factor = (not set)"),
    ("rope_sin", "tiny-minicpm3", "rope_sin = cat(sin(freqs), sin(freqs)) * attention_factor", "[evens | odds]"),
    ("layers.0.self_attn.q_pe_rope", "tiny-minicpm3", "out[i] = x[i] cos - x[i + 8] sin", "q_pe[..., 0::2]"),
    ("layers.0.self_attn.k_pe_rope", "tiny-minicpm3", "rotate_half(k_pe) * rope_sin", "k_pe[..., 0::2]"),
    ("mlp.gate.scores_for_choice", "tiny-axk1", "scores_for_choice = scores (no", "+ e_score_correction_bias"),
    ("mlp.gate.scores_for_choice", "tiny-mistral4", "best 4 of the kept groups", "load balancer"),
    ("mlp.gate.topk_weight", "tiny-mistral4", "gather(softmax_scores, topk_idx)", "sigmoid"),
    ("layers.1.mlp.gate.group_mask", "tiny-mistral4", "a score of 0.0 before top-k (transformers' file for this model)",
     "This project follows transformers 5.x"),  # its file fills 0.0; the text said transformers' gave -inf
    ("mlp.gate.topk_weight", "tiny-longcat", "share of the softmax the 3 chosen", "norm_topk_prob;"),
    ("logits", "tiny-youtu", "logits = norm @ embed_tokens.weight^T", "separate matrix"),
    ("logits", "tiny-minicpm3", "logits = norm_scaled @ embed_tokens.weight^T", "separate matrix"),
    ("layers.1.self_attn.attn_scores", "tiny-glm4-flash", "softmax_scale = qk_head_dim^-0.5 The scale", "1.8133"),
    ("layers.1.self_attn.query_states", "tiny-mistral4", "cat(q_nope, q_pe_rope, dim=-1) * q_position_scale[t]",
     "dim=-1) [B, H, T, qk_head_dim]"),
    ("self_attn.q_position_scale", "tiny-mistral4", ("1 for positions 0 to 4095 and 1 + beta ln(n + 1) in the "
                                                     "n-th block of 4096 positions after them (beta = 0.1)"),
     "mistral4's"),
    ("layers.1.self_attn.q_nope_absorbed", "tiny-mistral4", "the scores read this tensor times q_position_scale",
     "nothing"),
    ("layers.3.self_attn.query_states", "tiny-kimi-linear", "query_states = cat(q_nope, q_pe, dim=-1)", "q_pe_rope"),
    ("layers.3.self_attn.key_states", "tiny-kimi-linear", "cat(k_nope, k_pe.expand(B, H, T, rope)", "k_pe_rope"),
    ("layers.3.self_attn.attn_scores", "tiny-kimi-linear", "softmax_scale = qk_head_dim^-0.5 The scale", "1.8133"),
    ("layers.3.self_attn.k_pe", "tiny-kimi-linear", "so it holds no position", "interleaved pair layout"),
    ("layers.3.self_attn.q_pe", "tiny-kimi-linear", "(never rotated: no q_pe_rope)", "interleaved pairs"),
    ("layers.3.self_attn.q", "tiny-kimi-linear", "q = (input_layernorm @ q_proj.weight^T)", "get rotated"),
    ("layers.3.self_attn.kv_a", "tiny-kimi-linear", "one 16-dim key part shared by all heads", "rotary key"),
    ("layers.0.self_attn.attn_output", "tiny-kimi-linear", "attn_output = gated_output.transpose(1, 2)", "Kimi K2"),
    ("layers.0.input_layernorm", "tiny-kimi-linear", "In a KDA layer it feeds q_proj, k_proj, v_proj", "q_a_proj"),
    ("embed", "tiny-kimi-linear", "No layer of this model rotates anything", "through RoPE"),
    ("layers.0.self_attn.indexer.q_rope", "tiny-glm5", "cat(x * rope_cos + rotate_half(x) * rope_sin, q[..., rope:])",
     "rotates dims (i, i + rope/2)"),
    ("layers.0.self_attn.q_pe", "tiny-minicpm3", "dim i with dim i + 8", "interleaved pairs"),
    ("layers.0.self_attn.k_pe", "tiny-minicpm3", "turns in two halves as stored", "interleaved pair layout"),
    ("layers.1.mlp_output", "tiny-axk1", "rms_norm(routed_output + shared_output)", "mlp_output = routed_output +"),
    ("layers.1.output", "tiny-minicpm3", "output = attn_residual + mlp_scaled", "attn_residual + mlp_output"),
    ("layers.1.output", "tiny-longcat", ("output = sub1.attn_residual + sub1.mlp_output + mlp.routed_output The "
                                         "layer's last addition takes three terms"), "The second residual addition"),
    ("layers.1.sub1.mlp_output", "tiny-longcat", "(each sublayer's own dense MLP)", "routed_output + shared_output"),
    ("layers.1.sub0.post_attention_layernorm", "tiny-longcat", "the second sublayer's feeds only",
     "every chosen expert and the shared expert"),
    ("layers.1.mlp.gate.topk_idx", "tiny-axk2", "an expert of a dropped group outranks a kept one", "(in Kimi K2"),
    ("layers.1.mlp.gate.scores_for_choice", "tiny-axk2", "this router sets the experts of the dropped groups to 0.0",
     "give the experts of dropped groups -inf"),
    ("layers.1.mlp.gate.group_mask", "tiny-axk2", "get a score of 0.0 in the choice (topk_idx), not -inf",
     "give the experts of dropped groups -inf"),
    ("layers.3.self_attn.compressed_kv", "tiny-kimi-linear", "the 16-dim key part k_pe, which no RoPE turns",
     "rotary key"),
    ("input_layernorm", "tiny-v2", "feeds both q_proj (this model has no query latent", "q_a_proj"),
    ("input_layernorm", "deepseek-v2-lite", "the tensor q_proj and kv_a_proj_with_mqa read", "down-projections"),
    ("input_layernorm", "tiny-sarvam", "feeds both q_proj (this model has no query latent", "q_a_proj"),
    ("mlp.gate.topk_idx", "tiny-v2", "topk(softmax_scores, num_experts_per_tok).indices", "biased scores"),
    ("mlp.gate.topk_idx", "deepseek-v2", "a group judged by its single best score (group_max)", "biased scores"),
    ("mlp.gate.group_mask", "deepseek-v2", "as every softmax score is above 0", "biased score is negative"),
    ("mlp.shared_output", "tiny-v2", "n_shared_experts = 2 (in Kimi K2 and DeepSeek-V3: 1)", "as do Kimi K2"),
])
def test_explain_gives_a_familys_own_formula_and_explanation(name, model, own, deepseeks):
    """The formula and the explanation were DeepSeek's for every model: YaRN's cosines with
    "factor = (not set)" for a model without YaRN, the gather of evens and odds for MiniCPM3's
    halves, a bias that the router has not, a separate lm_head for a tied one."""
    out = stepper("explain", name, "--model", model, "--plain", env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    said = " ".join(out.stdout.split())
    assert own in said, said
    assert deepseeks not in said, said


@pytest.mark.parametrize("name, model, cited, line", [
    ("layers.1.self_attn.query_states", "tiny-mistral4", "transformers modeling_mistral4.py lines 476-482",
     "query_states = query_states * get_llama_4_attn_scale("),
    ("layers.3.self_attn.kv_a", "tiny-kimi-linear", "transformers modeling_kimi_linear.py line 285",
     "compressed_kv = self.kv_a_proj_with_mqa(hidden_states)"),
    ("layers.1.mlp.gate.topk_idx", "tiny-glm4-flash", "transformers modeling_glm4_moe_lite.py", "topk_indices"),
    ("layers.1.self_attn.kv_a", "tiny-v2", "transformers modeling_deepseek_v2.py", "self.kv_a_proj_with_mqa("),
    ("logits", "tiny-mistral-large4", "transformers modeling_mistral_large4.py lines 1114-1116",
     "logits = torch.tanh(logits)"),
])
def test_a_family_cites_its_own_transformers_file(name, model, cited, line):
    """Every family's explain cited DeepSeek-V3's lines (modeling_deepseek.py, modeling_deepseek_v3.py)."""
    out = stepper("explain", name, "--model", model, "--plain", env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    said = " ".join(out.stdout.split())
    assert f"{cited} " in said and line in said, said
    assert "modeling_deepseek.py" not in said and "modeling_deepseek_v3.py" not in said, said
    kimi_k2 = stepper("explain", catalog.key_of(name), "--plain").stdout
    assert "modeling_deepseek_v3.py" in kimi_k2 and "modeling_deepseek.py" in kimi_k2


@pytest.mark.parametrize("name, model, called, line", [
    ("layers.1.self_attn.q_nope", "tiny-glm4-flash", "q_pass", "q_pass, q_rot = torch.split("),
    ("layers.1.self_attn.k_pe", "tiny-mistral4", "k_rot", "kv_pass, k_rot = torch.split("),
    ("layers.1.self_attn.compressed_kv", "tiny-axk2", "kv_pass", "kv_pass, k_rot = torch.split("),
    ("layers.1.mlp.gate.logits", "tiny-longcat", "router_logits", "router_logits = F.linear("),
    ("layers.1.mlp.gate.topk_weight", "tiny-glm5", "topk_weights", "topk_weights = scores.gather("),
    ("layers.1.self_attn.q_a", "tiny-youtu", "q_states (inner self.q_a_proj(hidden_states), unnamed)",
     "q_states = self.q_b_proj("),
    ("layers.1.self_attn.q_nope", "tiny-v2", "q_nope", "q_nope, q_pe = torch.split("),  # its file's name is DeepSeek's
    ("layers.1.self_attn.kv_a", "tiny-axk1", "compressed_kv (the whole kv_a_proj_with_mqa output, before the split)",
     "compressed_kv = self.kv_a_proj_with_mqa("),
])
def test_the_references_name_is_the_familys_own_files(name, model, called, line):
    """"The references call it" gave modeling_deepseek.py's name (q_nope) over a cited line of the
    family's own file that names it otherwise (q_pass)."""
    out = stepper("explain", name, "--model", model, "--plain", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stdout.splitlines() if line.startswith("the references call it")]
    assert said == [f"the references call it  {called}"], said
    assert line in out.stdout


@pytest.mark.parametrize("name, line", [
    ("layers.1.output", "522          hidden_states = residual + hidden_states + shortcut_mlp_output"),
    ("layers.1.sub0.output", "501          hidden_states = residual + hidden_states"),
    ("layers.1.sub0.attn_residual", "494          hidden_states = residual + hidden_states"),
    ("layers.1.sub1.attn_residual", "516          hidden_states = residual + hidden_states"),
    ("layers.1.sub0.mlp_output", "500          hidden_states = self.mlps[0](hidden_states)"),
    ("layers.1.sub1.mlp_output", "521          hidden_states = self.mlps[1](hidden_states)"),
    ("layers.1.sub0.self_attn.q_a", "397          q_states = self.q_b_proj(self.q_a_layernorm(self.q_a_proj("),
    ("layers.1.sub1.self_attn.k_pe", "402          kv_pass, k_rot = torch.split(compressed_kv, "),
    ("layers.1.sub0.self_attn.compressed_kv_norm", "403          k_pass = self.kv_a_layernorm(kv_pass)"),
    ("layers.1.sub1.self_attn.q_pe_rope", "415          q_rot, k_rot = apply_rotary_pos_emb_interleave("),
    ("layers.0.sub0.input_layernorm", "483          hidden_states = self.input_layernorm[0](hidden_states)"),
    ("layers.0.sub1.input_layernorm", "505          hidden_states = self.input_layernorm[1](hidden_states)"),
    ("layers.1.sub0.post_attention_layernorm",
     "497          hidden_states = self.post_attention_layernorm[0](hidden_states)"),
    ("layers.1.sub1.post_attention_layernorm",
     "519          hidden_states = self.post_attention_layernorm[1](hidden_states)"),
])
def test_a_longcat_sublayers_tensor_cites_that_sublayers_line(name, line):
    """LongCat's layer writes each sublayer's residual sums on lines of their own; the layer's output,
    sub0's and both residuals cited DeepSeek-V3's lines, and sub0's mlp_output and norms sub1's lines."""
    out = stepper("explain", name, "--model", "tiny-longcat", "--plain", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "transformers modeling_longcat_flash.py" in out.stdout and line in out.stdout
    assert "modeling_deepseek" not in out.stdout


def test_the_debugger_explains_a_longcat_sublayers_tensor_as_that_sublayers():
    """The debugger's `e` looked up the stop's catalogue key (output), not its name: sub0's output
    was explained as the layer's, and sub0's norm cited sub1's line."""
    out = stepper("step", "--plain", "--model", "tiny-longcat", "--break", "layers.0.sub0.output",
                  stdin="e\ne layers.0.sub0.input_layernorm\nq\n", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    stop, norm = out.stdout.split("(stepper) e")[1:3]
    assert stop.startswith("\nsub0.output\nThe first sublayer's output") and "line 501" in stop
    assert norm.split("\n")[1] == "sub0.input_layernorm" and "self.input_layernorm[0](hidden_states)" in norm


@pytest.mark.parametrize("name, model", [
    ("layers.1.mlp.gate.topk_idx", "tiny-axk2"), ("layers.1.self_attn.key_states", "tiny-glm5"),
    ("rope_cos", "tiny-mistral4"), ("layers.1.self_attn.kv", "tiny-longcat"),
])
def test_a_name_the_familys_cited_line_does_not_give_is_not_given(name, model):
    """Where the family's first cited line does not assign the tensor (axk2's topk_idx cites the group
    mask's lines; its variable is topk_indices), DeepSeek's name (topk_idx) was shown over it: no name is."""
    out = stepper("explain", name, "--model", model, "--plain", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "the references call it" not in out.stdout and "transformers modeling_" in out.stdout
    kimi_k2 = stepper("explain", catalog.key_of(name), "--plain", env={"COLUMNS": "200"}).stdout
    assert "the references call it" in kimi_k2


def test_axk2s_router_cites_its_fill_of_the_dropped_groups():
    said = stepper("explain", "layers.1.mlp.gate.topk_idx", "--model", "tiny-axk2", "--plain",
                   env={"COLUMNS": "200"}).stdout
    assert "transformers modeling_axk2.py  lines 322-328" in said
    assert "scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), 0.0)" in said


def test_a_tensor_no_family_file_computes_keeps_deepseeks_citation():
    """The absorbed path is DeepSeek's inference code alone: Mistral 4 cites it as Kimi K2 does."""
    said = " ".join(stepper("explain", "self_attn.attn_output_latent", "--model", "tiny-mistral4", "--plain")
                    .stdout.split())
    assert "DeepSeek inference/model.py line 491" in said and "modeling_mistral4.py" not in said


@pytest.mark.parametrize("parameter", ["model.layers.1.mlp.experts.gate_up_proj",
                                       "model.layers.1.mlp.experts.down_proj", "mlp.experts.gate_up_proj"])
def test_mistral4s_fused_experts_lead_to_the_routed_output(parameter):
    """The names `stepper inspect` lists for Mistral 4's experts were refused as no parameter of the layer."""
    out = stepper("explain", parameter, "--model", "tiny-mistral4", "--plain")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("mlp.routed_output\n")


@pytest.mark.parametrize("parameter, entry, why", [
    ("model.layers.0.post_mlp_layernorm.weight", "mlp.post_mlp_layernorm",
     "Dense layers add their MLP's output unnormalised"),
    ("model.layers.1.mlp.gate.e_score_correction_bias", "mlp.gate.scores_for_choice", "this router adds no bias"),
])
def test_a_parameter_an_axk1_checkpoint_holds_unread_is_explained(parameter, entry, why):
    """A dense layer's post_mlp_layernorm (published) and a MoE router's zero bias (transformers'
    save) are listed by `stepper inspect`; explain answers with the entry that says why no run reads them."""
    out = stepper("explain", parameter, "--model", "tiny-axk1", "--plain")
    assert out.returncode == 0, out.stderr
    said = " ".join(out.stdout.split())
    assert out.stdout.startswith(entry + "\n")
    assert why in said


@pytest.mark.parametrize("query, model, sub, sublayers", [
    ("layers.0.sub2.self_attn.q", "tiny-longcat", "sub2", "sub0 and sub1"),
    ("layers.0.sub0.self_attn.q", "tiny-v3", "sub0", "none (only LongCat-Flash's layers have two)"),
    ("sub1.self_attn.q", "tiny-glm5", "sub1", "none (only LongCat-Flash's layers have two)"),
])
def test_a_sublayer_the_model_has_not_is_refused_in_one_line(query, model, sub, sublayers):
    """These were answered with self_attn.q's entry, as if the model had that sublayer."""
    out = stepper("explain", query, "--model", model, "--plain")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"stepper: error: {query}: model {model} has no sublayer {sub}; its layers' sublayers: {sublayers}"]
    assert stepper("explain", "layers.1.sub1.self_attn.q", "--model", "tiny-longcat").returncode == 0


@pytest.mark.parametrize("query", ["layers.1.sub0.output", "sub0.output", "sub0.outp*"])
def test_a_sublayers_output_is_explained_as_that_sublayers(query):
    """LongCat's first sublayer ends in sub0.output (its residual sum, the second sublayer's input):
    asked by name it was given the layer's output (sub1's sum plus the MoE's), and a glob said no
    preset emits it."""
    out = stepper("explain", query, "--model", "tiny-longcat", "--plain")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("sub0.output\nThe first sublayer's output: attn_residual + mlp_output")
    assert "formula sub0.output = sub0.attn_residual + sub0.mlp_output\n" in out.stdout
    assert "d (hidden = 256)" in out.stdout and "does not emit" not in out.stdout
    assert "mlp.routed_output" not in out.stdout.split("\n\n")[0]  # the head: not the layer's output


@pytest.mark.parametrize("query, near", [
    ("layers.1.sub1.output", "sub0.output, sub1.mlp_output"),
    ("sub1.output", "sub0.output, sub1.mlp_output, sub0.mlp_output"),
    ("layers.1.sub0.mlp.routed_output", "mlp.routed_output, sub0.mlp_output, sub1.mlp_output"),  # beside the sublayers
])
def test_a_sublayers_name_no_layer_makes_is_no_tensor(query, near):
    """LongCat's second sublayer ends in no sub1.output (the layer's output adds the MoE's to its sum):
    `layers.1.sub1.output` was answered with the layer's output, as a name of a tensor no run makes."""
    out = stepper("explain", query, "--model", "tiny-longcat", "--plain")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"stepper: error: no tensor named '{query}' in the catalogue; did you mean {near}? (stepper tree lists them)"]
    debugged = stepper("step", "--plain", "--model", "tiny-longcat", "--break", "layers.1.output",
                       stdin=f"e {query}\nq\n")
    assert f"(stepper) e {query}\nno tensor named '{query}' in the catalogue; did you mean {near}?" in debugged.stdout
    with pytest.raises(KeyError, match="no tensor named"):
        api.run(model="tiny-longcat", layer=1, prompt_len=2).explain(query)


def test_a_glob_lists_what_it_matches_of_the_models_tensors_a_sublayers_too():
    """`sub1.*` listed the whole catalogue (its scope was dropped, leaving `*`); a glob matching
    no tensor of the model was answered with another family's entries or 'no tensor named'."""
    def listed(query: str, model: str) -> list[str]:
        out = stepper("explain", query, "--model", model, "--plain")
        assert out.returncode == 0, out.stderr
        return titles(out.stdout)

    sublayer = listed("sub1.*", "tiny-longcat")  # headed by the names the glob matched, as the user wrote them
    assert sublayer[:3] == ["sub1.input_layernorm", "sub1.self_attn.q_a", "sub1.self_attn.q_a_norm"]
    assert sublayer[-4:] == ["sub1.mlp.gate_proj", "sub1.mlp.up_proj", "sub1.mlp.act", "sub1.mlp_output"]
    assert not {"embed", "hidden_states", "mlp.gate.logits", "output"} & {catalog.key_of(n) for n in sublayer}
    assert listed("sub0.*", "tiny-longcat") == [n.replace("sub1.", "sub0.") for n in sublayer] + ["sub0.output"]
    assert listed("layers.1.sub1.self_attn.q_*", "tiny-longcat") == [
        "sub1.self_attn.q_a", "sub1.self_attn.q_a_norm", "sub1.self_attn.q_nope", "sub1.self_attn.q_pe",
        "sub1.self_attn.q_nope_scaled", "sub1.self_attn.q_pe_scaled", "sub1.self_attn.q_nope_absorbed",
        "sub1.self_attn.q_pe_rope"]
    assert listed("*.q_a_norm", "tiny-longcat") == ["self_attn.q_a_norm"]  # both sublayers': the catalogue's name
    said = " ".join(stepper("explain", "sub1.self_attn.q_a*", "--model", "tiny-longcat", "--plain").stdout.split())
    assert "sub1.self_attn.q_a Query down-projection" in said and "stepper emits it stepper/model/" in said
    assert listed("layers.0.*_conv", "tiny-kimi-linear") == ["self_attn.q_conv", "self_attn.k_conv",
                                                             "self_attn.v_conv"]
    kv = stepper("explain", "*.kv#2", "--model", "tiny-v4", "--plain").stdout
    assert "*.kv#2 matches inference's layers.{i}.attn.kv#2 (inference/model.py:508): attn.kv" in kv
    assert titles(kv) == ["attn.kv", "attn.compressor.pooled", "attn.indexer.compressor.pooled"]
    window = stepper("explain", "layers.0.*.kv#2", "--model", "tiny-v4", "--plain").stdout  # no compressor
    assert titles(window) == ["attn.kv"] and "compressor" not in window, window  # the table's names too


@pytest.mark.parametrize("query, model, said", [
    ("sub1.mlp.gate.*", "tiny-longcat", ("no tensor of model tiny-longcat matches 'sub1.mlp.gate.*' (stepper tree"
                                        " lists them)")),
    ("hc_attn.*", "tiny", "no tensor of model tiny matches 'hc_attn.*'; tiny-v4's do (give --model tiny-v4)"),
    ("attn_hc.mix*", "tiny-v4", ("no tensor of model tiny-v4 matches 'attn_hc.mix*'; tiny-hy4's do (give --model"
                                 " tiny-hy4)")),
    ("*.state", "tiny-glm5", ("no tensor of model tiny-glm5 matches '*.state'; tiny-kimi-linear's do (give --model"
                             " tiny-kimi-linear)")),
])
def test_a_glob_matching_no_tensor_of_the_model_is_refused_in_one_line(query, model, said):
    out = stepper("explain", query, "--model", model, "--plain")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [f"stepper: error: {said}"]


def test_a_refused_glob_runs_only_the_presets_whose_catalogue_it_matches(monkeypatch):
    """A glob no tensor matches traced the layers of every tiny preset (17) before it was refused."""
    from stepper.views import explain as view

    asked = []
    monkeypatch.setattr(view, "matching", lambda cat, cfg, query: asked.append(cfg.name) or [])
    assert view.unmatched(preset("tiny"), "zz*", "give --model {}").endswith("(stepper tree lists them)")
    assert asked == []
    view.unmatched(preset("tiny"), "hc_attn.*", "give --model {}")
    assert asked and all(name.startswith("tiny-v4") for name in asked)


def test_tree_and_the_debugger_describe_a_tensor_as_the_family_computes_it():
    """tree and the debugger's stop line and `w` said DeepSeek's words for every family: YaRN
    cosines for a model without YaRN, pairs for a model that turns halves, renormalised weights
    for a router that does not renormalise (catalog/notes: the families' own words)."""
    def row(out: str, name: str) -> str:
        return next(line for line in out.splitlines() if f"── {name}  " in line)

    minicpm3 = stepper("tree", "--model", "tiny-minicpm3", "--plain").stdout
    assert row(minicpm3, "self_attn.q_pe").endswith("Rotary part of each query head before RoPE, as stored: dim i "
                                                    "turns with dim i + rope/2")
    assert row(minicpm3, "hidden_states").endswith("(embed_scaled for layer 0)")
    longcat = stepper("tree", "--model", "tiny-longcat", "--plain").stdout
    assert row(longcat, "mlp.gate.topk_weight").endswith("softmax scores of the chosen, not renormalised, times "
                                                         "routed_scaling_factor")
    assert row(longcat, "sub0.output").endswith("The first sublayer's output: attn_residual + mlp_output, the "
                                                "second sublayer's input")
    assert "the MoE's output beside them" in row(longcat, "output")
    kda = stepper("tree", "--model", "tiny-kimi-linear", "--layer", "3", "--plain").stdout
    assert "turns it by no RoPE" in row(kda, "self_attn.q_pe") and "k_pe_rope" not in row(kda, "self_attn.key_states")
    deepseek = stepper("tree", "--model", "tiny", "--plain").stdout
    assert "interleaved pair layout" in row(deepseek, "self_attn.q_pe")

    stop = stepper("step", "--model", "tiny-youtu", "--plain", "--break", "rope_cos", stdin="q\n").stdout
    assert "Cosines for this step's positions, cat(freqs, freqs) layout: no YaRN, no mscale" in stop
    assert "YaRN cosines" in stepper("step", "--plain", "--break", "rope_cos", stdin="q\n").stdout
    where = stepper("step", "--model", "tiny-longcat", "--plain", "--break", "layers.0.mlp.gate.topk_weight",
                    stdin="w\nq\n").stdout
    assert where.count("softmax scores of the chosen, not renormalised") == 2  # the stop line, and w's ▶ row
    assert "normalised to sum 1" not in where


@pytest.mark.parametrize("name, model, own", [
    ("layers.1.sub1.self_attn.q", "tiny-longcat", "model.layers.{i}.self_attn.1.q_b_proj"),
    ("layers.0.self_attn.q_proj", "tiny-kimi-linear", "model.layers.{i}.self_attn.q_proj"),
    ("layers.1.self_attn.q", "tiny-glm5", "model.layers.{i}.self_attn.q_b_proj"),
    ("layers.1.self_attn.head_gate", "tiny-ling3", "model.layers.{i}.self_attn.g_proj"),
    ("layers.1.self_attn.q", "tiny-mistral-large4", "model.language_model.layers.{i}.self_attn.q_proj"),
])
def test_a_family_of_its_own_file_is_pointed_to_its_names_not_given_deepseeks(name, model, own):
    """The aliases line gave DeepSeek-V3's module names for every family (LongCat's sub1 query is
    transformers' `self_attn.1.q_b_proj`, not `self_attn.q_b_proj`); a family transformers writes in a
    file of its own is pointed to the command listing its names, and that command lists the name."""
    said = stepper("explain", name, "--model", model, "--plain", env={"COLUMNS": "200"})
    aliases = [line for line in said.stdout.splitlines() if line.startswith("aliases ")]
    assert said.returncode == 0 and aliases == [
        f"aliases this model's names in other implementations: stepper fixtures names --model {model}"], aliases
    listed = stepper("fixtures", "names", "--model", model, "--names", "transformers", "--plain",
                     env={"COLUMNS": "200"}).stdout
    assert own in listed
    deepseek = stepper("explain", "layers.1.self_attn.q", "--model", "tiny", "--plain", env={"COLUMNS": "200"}).stdout
    assert "aliases hf_module: model.layers.{i}.self_attn.q_b_proj (output" in deepseek


def test_deepseek_v2s_choice_of_experts_cites_both_of_its_routers():
    """V2-Lite's router is greedy, V2's group-limited: the citation showed the group-limited branch alone."""
    out = stepper("explain", "layers.1.mlp.gate.topk_idx", "--model", "tiny-v2", "--plain", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "modeling_deepseek_v2.py  lines 102-115" in out.stdout
    assert 'if self.topk_method == "greedy":' in out.stdout and "topk_indices = torch.topk(scores" in out.stdout


def test_longcats_moe_output_counts_its_zero_experts():
    """LongCat's routed_output said 'only the chosen 3 of 8 run for a token', as if it had no zero experts."""
    out = stepper("explain", "layers.1.mlp.routed_output", "--model", "tiny-longcat", "--plain")
    assert out.returncode == 0, out.stderr
    assert "chooses 3 of the 12 experts its router scores: 8 real ones" in out.stdout
    assert "a zero expert (topk_idx >= n_routed_experts): expert(x) = x" in out.stdout
    assert "3 of 8 run" not in out.stdout


@pytest.mark.parametrize("model, kda_lines, mla_lines", [
    ("tiny-kimi-linear", ("line 713", "line 714"), ("line 313", "line 314")),
    ("tiny-ling3", ("line 785", "line 786"), ("line 406", "line 421")),
])
def test_a_kda_layers_merged_heads_and_o_proj_cite_the_kda_lines_not_mlas(model, kda_lines, mla_lines):
    """self_attn.attn_output and self_attn.o_proj are named alike in both kinds of layer: asked about a
    KDA layer (0), explain cites the delta attention's lines, about an MLA layer (its last) MLA's."""
    mla = preset(model).num_hidden_layers - 1
    for layer, lines in ((0, kda_lines), (mla, mla_lines)):
        for name, line in zip(("attn_output", "o_proj"), lines):
            out = stepper("explain", f"layers.{layer}.self_attn.{name}", "--model", model, "--plain")
            assert out.returncode == 0 and f"modeling_{preset(model).model_type}.py  {line}" in out.stdout, out.stdout
