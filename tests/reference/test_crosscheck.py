"""Every named tensor against transformers' DeepseekV3ForCausalLM on the same float32 weights.

Two configs: `tiny` (Kimi-style, one expert group, YaRN factor 32 / theta 50000) and `tiny-v3`
(4 groups keep 2, DeepSeek-V3's rope: factor 40, beta 32/1, theta 10000); prefill then cached
decode steps, at position 0, past 0, and past original_max_position_embeddings (4096), on the
naive MLA path and on the absorbed one (transformers has the naive one only: its tensors that the
absorbed path does not make are left out of that comparison, the rest must match as on the naive path).
Relative error = max |stepper - reference| / max |reference| per tensor, at most 1e-5.
"""

import copy
import os

import numpy as np
import pytest

if not os.environ.get("STEPPER_REQUIRE_CROSSCHECK"):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")

from helpers.compare import absorbed_against_naive, compare
from helpers.hf_reference import hf_attention_scaling, hf_inv_freq, hf_softmax_scale, hf_trace

from stepper import catalog
from stepper.families import derive
from stepper.model import Transformer
from stepper.model.rope import rope_inv_freq
from stepper.presets import preset
from stepper.seams.trace import Recorder, unphased
from stepper.session import RunSpec, run
from stepper.weights.names import weight_shapes
from stepper.weights.seeded import SyntheticWeights
from stepper.weights.source import ArrayWeights

PROMPT = (17, 402, 999, 3, 256, 77, 640)


def traces(model: str, start_pos: int, decode: int, seed: int = 0, attn: str = "naive"):
    cfg = preset(model)
    synthetic = SyntheticWeights(cfg, seed)
    arrays = {n: synthetic.get(n) for n in weight_shapes(cfg)}
    rec = Recorder()
    spec = RunSpec(model=model, ids=PROMPT, start_pos=start_pos, decode=decode, attn=attn)
    result = run(spec, [rec], ArrayWeights(cfg, arrays))
    steps = [np.array([[t]]) for t in result.generated] or None
    ref = hf_trace(cfg.to_hf(), arrays, np.array([PROMPT]), start_pos=start_pos, decode_ids=steps)
    return rec.tensors(), ref


@pytest.mark.parametrize("model", ["tiny", "tiny-v3"])
@pytest.mark.parametrize("start_pos, decode", [(0, 2), (37, 1), (4093, 3), (5000, 1)])
def test_every_named_tensor_matches_transformers(model, start_pos, decode):
    mine, ref = traces(model, start_pos, decode)
    assert list(mine) and set(mine) == set(ref), sorted(set(mine) ^ set(ref))
    failures = {name: why for name in mine if (why := compare(name, mine, ref))}
    assert not failures, failures


@pytest.mark.parametrize("model", ["tiny", "tiny-v3"])
@pytest.mark.parametrize("start_pos, decode", [(0, 2), (4093, 3)])
def test_the_absorbed_path_matches_transformers(model, start_pos, decode):
    mine, ref = absorbed_against_naive(*traces(model, start_pos, decode, attn="absorb"))
    # what both make: the attention's scores, weights and output, every layer after it, the logits
    for key in ("self_attn.attn_scores", "self_attn.attn_weights", "self_attn.o_proj", "mlp_output"):
        assert sum(n.endswith(f"layers.2.{key}") for n in mine) == decode + 1, key
    assert sum(n.endswith("logits") and ".layers." not in n for n in mine) == decode + 1
    failures = {name: why for name in mine if (why := compare(name, mine, ref))}
    assert not failures, failures


def test_every_catalogued_name_is_compared():
    mine, _ = traces("tiny", 0, 0)
    compared = {unphased(n).split(".", 2)[-1] if n.startswith("layers.") else n for n in mine}
    cfg, cat = preset("tiny"), catalog.load()
    naive = {e["name"] for layer in range(cfg.num_hidden_layers) for e in cat.layer_sequence(cfg, layer, "naive")}
    naive |= set(derive.global_names(cfg, ("embed", "rope_cos", "rope_sin", "norm", "logits")))
    assert naive <= compared, naive - compared


@pytest.mark.parametrize("model", ["tiny", "tiny-v3", "kimi-k2", "deepseek-v3"])
def test_rope_tables_and_scales_match_transformers(model):
    cfg = preset(model)
    mine = rope_inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling)
    theirs = hf_inv_freq(cfg.to_hf())
    # stepper rounds theta ** (2i/dim) correctly; torch's float32 pow is at most one ulp away
    ulps = np.abs(mine.view(np.int32).astype(np.int64) - theirs.view(np.int32).astype(np.int64))
    assert ulps.max() <= 1, ulps
    model_ = Transformer(SyntheticWeights(cfg))
    assert model_.softmax_scale == pytest.approx(hf_softmax_scale(cfg.to_hf()), rel=1e-12)
    assert model_.rope_mscale == pytest.approx(hf_attention_scaling(cfg.to_hf()), rel=1e-12)


def test_kimi_k25_as_published_gets_transformers_rope_and_scales():
    """Kimi K2.5's config.json (a wrapper whose text_config gives its YaRN as rope_parameters, with
    mscale_all_dim 1, factor 64, theta 50000): stepper's tables and scales against those of
    transformers' own Kimi_K25Config, whose text model is DeepseekV3's."""
    import torch
    from transformers import Kimi_K25Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    from stepper.config import Config
    from tests.model.test_kimi_k25 import k25_raw

    raw = k25_raw()
    text = Kimi_K25Config(**copy.deepcopy(raw)).text_config
    assert type(text).__name__ == "DeepseekV3Config"
    rotary = DeepseekV3RotaryEmbedding(text)
    with torch.device("meta"):
        softmax_scale = DeepseekV3Attention(text, layer_idx=0).scaling

    cfg = Config.from_hf(copy.deepcopy(raw), "k25/config.json")
    model = Transformer(SyntheticWeights(cfg))
    mine, theirs = model.inv_freq, rotary.inv_freq.numpy().astype(np.float32)
    assert mine.shape == theirs.shape == (32,)
    ulps = np.abs(mine.view(np.int32).astype(np.int64) - theirs.view(np.int32).astype(np.int64))
    assert ulps.max() <= 1, ulps
    assert not np.allclose(theirs, 50000.0 ** -(np.arange(0, 64, 2) / 64), rtol=1e-3)  # YaRN changed them
    assert model.rope_mscale == pytest.approx(float(rotary.attention_scaling), rel=1e-12)
    # mscale_all_dim 1: 1/sqrt(192) * (0.1 ln 64 + 1)^2, not 1/sqrt(192)
    assert model.softmax_scale == pytest.approx(softmax_scale, rel=1e-12)
    assert softmax_scale == pytest.approx(192**-0.5 * (0.1 * np.log(64) + 1) ** 2, rel=1e-12)
