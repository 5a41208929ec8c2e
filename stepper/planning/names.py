"""The names a run will emit, known before it starts (from the catalogue), and the check that
every pattern an option gives (`--only`, `--break`, `--until`, `--patch`, `keep=`) matches one of
them: a pattern that matches nothing would otherwise end in a run that shows nothing, or never
stops."""

from __future__ import annotations

from collections.abc import Iterable

from stepper import catalog
from stepper.errors import StepperError
from stepper.families import derive
from stepper.seams.trace import did_you_mean, matches
from stepper.session import Plan, phase_name, step_attn
from stepper.untrusted import cut

PICTURE_TENSORS = {  # the tensors a --show picture is drawn from; one of them must be shown
    "attention": ("self_attn.attn_weights",),
    "routing": ("mlp.gate.topk_idx", "mlp.gate.topk_weight"),
    "hc": ("hc_attn.comb", "hc_ffn.comb"),  # DeepSeek-V4's
    "reach": ("attn.chosen",),
    "state": ("self_attn.state",),  # Kimi Linear's
}
V4_ROUTING = ("ffn.gate.weights", "ffn.gate.hash_idx", "ffn.gate.topk_idx")  # DeepSeek-V4's, by hash or by score


def picture_tensors(cfg) -> dict[str, tuple[str, ...]]:
    """The tensors each --show picture is drawn from, in this model's names (V4's router is `ffn.gate`)."""
    return {**PICTURE_TENSORS, "routing": V4_ROUTING} if cfg.model_type == "deepseek_v4" else PICTURE_TENSORS


def planned_names(plan: Plan) -> list[str]:
    """Every name the run emits, in execution order."""
    spec = plan.spec
    steps = [(phase_name(spec, step), step_attn(spec, step)) for step in range(spec.decode + 1)]
    around = derive.model_names(plan.config)  # embed, rope_cos, ...: what the model's code emits outside its layers
    start = around.start if plan.whole else around.lone if plan.alone else ()
    return catalog.load().run_names(plan.config, steps, plan.layers_shown, start, around.end if plan.whole else (),
                                    spec.index_scoring)


def check_patterns(option: str, patterns: Iterable[str], names: list[str]) -> None:
    """Refuse a pattern that matches no name of the run, with the nearest names."""
    for pattern in patterns:
        if not any(matches(name, [pattern]) for name in names):
            raise StepperError(f"{option} {cut(pattern)}: matches no tensor of this run{did_you_mean(pattern, names)}")
