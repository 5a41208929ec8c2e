"""The MLA families of stepper/families, every named tensor against transformers' own model of
each family (helpers.hf_families: from_pretrained on the checkpoint `stepper synth` writes in the
family's published layout, float32), prefill then cached decode steps, at position 0 and past the
YaRN / query-scale boundary, both MLA paths (transformers' naive tensors left out of the absorbed
comparison); relative error <= 1e-5 per tensor and the same experts chosen (helpers.compare)."""

import json
import os

import numpy as np
import pytest

if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

from helpers.compare import compare
from helpers.configs import family_preset
from helpers.hf_families import hf_family_trace

from stepper import catalog
from stepper.seams.trace import Recorder, unphased
from stepper.session import RunSpec, open_checkpoint, run
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.synth_checkpoint import synth_checkpoint

PROMPT = (17, 402, 999, 3, 256, 77, 640)
FAMILIES = ("tiny-sarvam", "tiny-youtu", "tiny-glm4-flash", "tiny-axk1", "tiny-mistral4")
CASES = [(0, 2, "naive"), (4093, 3, "naive"), (4093, 3, "absorb")]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mla-families")
    return {name: synth_checkpoint(SyntheticWeights(family_preset(name), seed=3), folder / name) for name in FAMILIES}


def traces(folder, start_pos: int, decode: int, attn: str):
    rec = Recorder()
    result = run(RunSpec(model=str(folder), ids=PROMPT, start_pos=start_pos, decode=decode, attn=attn), [rec])
    steps = [np.array([[t]]) for t in result.generated] or None
    ref = hf_family_trace(folder, np.array([PROMPT]), start_pos=start_pos, decode_ids=steps)
    mine = rec.tensors()
    if attn == "absorb":  # transformers has no absorbed path: its naive tensors are left out of it
        ref = {n: v for n, v in ref.items() if n in mine}
        mine = {n: v for n, v in mine.items() if n in ref}
    return mine, ref


def catalogued(name: str, attn: str) -> set[str]:
    """Every name the model emits for this config (its layers' derived from the code), each with
    its catalogue entry."""
    cfg = family_preset(name)
    cat = catalog.load()
    names = {e["name"] for layer in range(cfg.num_hidden_layers) for e in cat.layer_sequence(cfg, layer, attn)}
    assert all(cat.entry(n) is not None for n in names), [n for n in names if cat.entry(n) is None]
    return names | {e["name"] for e in cat.entries if e["scope"] == "global"}


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("start_pos, decode, attn", CASES)
def test_every_tensor_matches_the_familys_transformers_model(checkpoints, name, start_pos, decode, attn):
    mine, ref = traces(checkpoints[name], start_pos, decode, attn)
    assert list(mine) and set(mine) == set(ref), sorted(set(mine) ^ set(ref))
    failures = {n: why for n in mine if (why := compare(n, mine, ref))}
    assert not failures, failures
    if attn == "naive":  # every tensor the catalogue lists for this config was compared
        compared = {unphased(n).split(".", 2)[-1] if unphased(n).startswith("layers.") else unphased(n) for n in mine}
        assert catalogued(name, attn) <= compared, catalogued(name, attn) - compared
    assert sum(n.endswith("mlp.gate.topk_idx") for n in mine) or name == "tiny-youtu"  # the routers were compared
    if name == "tiny-youtu" and attn == "naive":  # the pad token (999, the prompt's third) has a zeroed row
        assert not mine["prefill.embed"][0, 2].any() and mine["prefill.embed"][0, 1].any()
        assert not mine["prefill.logits"][..., 999].any()
    if name == "tiny-axk1":  # no bias: the experts are chosen by the scores, the MoE's output normalised
        layer = f"{'prefill.' if decode else ''}layers.1."
        assert np.array_equal(mine[layer + "mlp.gate.scores_for_choice"], mine[layer + "mlp.gate.scores"])
        assert np.array_equal(mine[layer + "mlp_output"], mine[layer + "mlp.post_mlp_layernorm"])
    if name in ("tiny-axk1", "tiny-mistral4"):  # the group rule at work: a token's k best experts span a dropped group
        layer = f"{'prefill.' if decode else ''}layers.1.mlp.gate."
        scores = mine[layer + ("scores" if name == "tiny-axk1" else "softmax_scores")]
        mask = mine[layer + "group_mask"]
        groups_of_best = np.argsort(-scores, axis=1)[:, :4] // (scores.shape[1] // mask.shape[1])  # [N, k]
        assert (np.take_along_axis(mask, groups_of_best, axis=1) == 0).any()
    if name == "tiny-mistral4":  # queries past position 4096 scaled by 1 + 0.1 ln 2, those before by 1
        scales = np.concatenate([v for n, v in mine.items() if n.endswith("layers.0.self_attn.q_position_scale")])
        assert set(np.round(scales, 6)) == ({1.0, np.float32(1 + 0.1 * np.log(2)).round(6)} if start_pos else {1.0})


def test_mistral_small_4_as_published_a_vision_language_wrapper(checkpoints, tmp_path):
    """transformers' own Mistral3ForConditionalGeneration around the tiny Mistral 4 text model
    (its weights those of the text checkpoint), saved by save_pretrained: stepper reads the text
    model under language_model. and runs it as it runs the text checkpoint; the vision tower's and
    projector's tensors are never read."""
    import torch
    from helpers.hf_families import load
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    text = load(checkpoints["tiny-mistral4"])
    vision = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2, "head_dim": 16, "image_size": 32, "patch_size": 16}
    wrapped = Mistral3ForConditionalGeneration(Mistral3Config(text_config=text.config.to_dict(), vision_config=vision,
                                                              tie_word_embeddings=False))
    with torch.no_grad():
        wrapped.model.language_model.load_state_dict(text.model.state_dict())
        wrapped.lm_head.weight.copy_(text.lm_head.weight)
    wrapped.to(torch.bfloat16).save_pretrained(tmp_path / "published")  # BF16, as the text checkpoint
    config = json.loads((tmp_path / "published" / "config.json").read_text())
    assert config["model_type"] == "mistral3" and config["text_config"]["model_type"] == "mistral4"

    def logits(model):
        rec = Recorder()
        run(RunSpec(model=str(model), ids=PROMPT, start_pos=4093, decode=1), [rec])
        return {n: v for n, v in rec.tensors().items() if n.endswith(".logits") and ".layers." not in n}

    mine, text_only = logits(tmp_path / "published"), logits(checkpoints["tiny-mistral4"])
    assert len(mine) == 2 and all(np.array_equal(mine[n], text_only[n]) for n in mine)
    cfg = open_checkpoint(tmp_path / "published").config
    assert cfg.wrapper.model_type == "mistral3" and "vision_config" in cfg.wrapper.unused_fields
    assert not open_checkpoint(tmp_path / "published").problems(range(cfg.num_hidden_layers), with_globals=True)
