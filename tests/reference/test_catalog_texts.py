"""The catalogue's texts speak of the run's own model: explanations are templates filled with its
config (`stepper.catalog.texts`), and a published model's size appears only where a text says
whose it is ("In Kimi K2 ...", "(in DeepSeek-V3: ...)").

Every text is rendered for a small and a full-size config; outside the published parts, no number
may be one of the other config's sizes that differs from this config's (a hard-coded "64-dim" or
"i + 32" in a tiny run), unless a field of that text produced it for this config."""

from __future__ import annotations

import dataclasses
import re

import pytest
from helpers.configs import family_preset

from stepper import catalog
from stepper.catalog import texts
from stepper.presets import preset

CAT = catalog.around(preset("tiny"))  # the MLA families' texts, rendered with their presets (V4's: its own tests)
TEXTS = ("description", "formula", "explain")
PRESETS = ("tiny", "tiny-v3", "kimi-k2", "deepseek-v3")
PAIRS = [("tiny", "kimi-k2"), ("kimi-k2", "tiny"), ("tiny-v3", "deepseek-v3"), ("deepseek-v3", "tiny-v3")]
MODEL = r"(?:Kimi K2|DeepSeek-V\d|DeepSeek's)"  # Kimi K2(.5), DeepSeek-V2(-Lite), -V3, -V3.2, DeepSeek's code
PUBLISHED = re.compile(rf"\(in {MODEL}[^()]*\)|(?:^|(?<=\. ))In {MODEL}.*?(?:\.(?=\s|$)|$)")
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?!\w)")
DERIVED = {"qk_rope_head_dim / 2", "num_attention_heads * qk_head_dim", "n_routed_experts / n_group"}
CONSTANTS = {"0", "1", "2"}  # dim=-1, sums to 1, topk(2), 0::2: never a size of one model only


def own_words(text: str) -> str:
    """A rendered text without its published parts (the sentences and parentheses naming a model)."""
    return PUBLISHED.sub(" ", text)


def quantities() -> set[str]:
    """Every size expression the catalogue knows (config names, dimension sizes, template fields)
    and a few sizes derived from them that texts quote (rope pairs, all heads' key dims)."""
    dims = {d["size"] for d in CAT.raw["dims"].values() if d["size"] != catalog.RUNTIME
            and all(n in texts.known_names() for n in texts.names_in(d["size"]))}  # MLA's: the presets compared
    used = {f for e in CAT.entries for key in TEXTS for f in texts.fields(e[key])}
    return set(texts.known_names()) | dims | used | DERIVED


def sizes_only_in(other: str, own: str) -> set[str]:
    """The printed values of the quantities where config `other` differs from config `own`."""
    a, b = preset(other), preset(own)
    found = set()
    for q in quantities():
        va, vb = texts.value(q, a), texts.value(q, b)
        if va is not None and va != vb:
            found.add(texts.formatted(va))
    return found - CONSTANTS


def field_numbers(template: str, cfg) -> set[str]:
    """The numbers a template's own fields print for this config."""
    return {n for f in texts.fields(template) for n in NUMBER.findall(texts.formatted(texts.value(f, cfg)))}


@pytest.mark.parametrize(("own", "other"), PAIRS)
def test_no_size_of_another_model_leaks_into_a_runs_texts(own, other):
    cfg, foreign = preset(own), sizes_only_in(other, own)
    assert {"64", "192", "32", "8", "384"} <= sizes_only_in("kimi-k2", "tiny")  # the check has teeth
    problems = []
    for entry in CAT.entries:
        for key in TEXTS:
            template = entry[key]
            rendered = own_words(texts.render(template, cfg))
            leaked = set(NUMBER.findall(rendered)) & foreign - field_numbers(template, cfg)
            if leaked:
                problems.append(f"{entry['name']} {key}: {sorted(leaked)} ({other}'s) in: {rendered}")
    assert not problems, "\n".join(problems)


def test_every_template_field_is_a_config_field():
    problems = []
    for entry in CAT.entries:
        for expression in texts.fields(entry["explain"]):
            unknown = [n for n in texts.names_in(expression) if n not in texts.known_names()]
            if unknown:
                problems.append(f"{entry['name']}: {{{expression}}} reads {unknown}")
        for key in ("description", "formula"):  # shown without a config: no fields
            if "{" in entry[key] or "}" in entry[key]:
                problems.append(f"{entry['name']} {key} has a template field: {entry[key]}")
    assert not problems, "\n".join(problems)
    assert "qk_rope_head_dim" in texts.known_names() and "rope_scaling.factor" in texts.known_names()


def test_an_unknown_field_or_expression_is_refused():
    cfg = preset("tiny")
    with pytest.raises(ValueError, match="qk_rope_dim"):
        texts.render("dims i and i + {qk_rope_dim / 2}", cfg)
    with pytest.raises(ValueError):
        texts.render("{__import__('os')}", cfg)
    with pytest.raises(ValueError):
        texts.render("{hidden_size +}", cfg)


@pytest.mark.parametrize("name", PRESETS)
def test_every_text_renders_for_every_preset(name):
    for cfg in (family_preset(name), dataclasses.replace(family_preset(name), q_lora_rank=None)):
        for entry in CAT.entries:
            rendered = texts.render(entry["explain"], cfg)
            assert "{" not in rendered and "}" not in rendered, (entry["name"], rendered)


def explained(name: str, model: str) -> str:
    return texts.render(CAT.entry(name)["explain"], family_preset(model))


@pytest.mark.parametrize("model", PRESETS)
def test_the_texts_quote_the_runs_own_sizes(model):
    cfg = family_preset(model)
    half, k, e = cfg.qk_rope_head_dim // 2, cfg.num_experts_per_tok, cfg.n_routed_experts
    assert f"dims i and i + {half} form the pair" in explained("self_attn.q_pe_rope", model)
    assert f"Each token runs {k} of the {e} routed experts" in explained("mlp.gate.topk_idx", model)
    assert f"separate {cfg.qk_rope_head_dim}-dim key" in explained("self_attn.k_pe", model)
    heads, qk, v = cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.v_head_dim
    assert f"{heads} x ({qk} + {v}) = {heads * (qk + v)} numbers" in explained("self_attn.compressed_kv", model)
    assert f"qk_head_dim^-0.5 = {qk ** -0.5:.4g}:" in explained("self_attn.attn_scores", model)
    assert f"x{cfg.qk_rope_head_dim - 2} | x1" in explained("self_attn.q_pe", model)
    groups = f"groups of {e // cfg.n_group}"
    assert groups in explained("mlp.gate.group_scores", model)


def test_published_sizes_say_whose_they_are():
    tiny = explained("mlp.gate.topk_idx", "tiny")
    assert "runs 4 of the 32 routed experts" in tiny and "(in Kimi K2: 8 of 384; in DeepSeek-V3: 8 of 256)" in tiny
    assert "8 of 384" not in own_words(tiny)
