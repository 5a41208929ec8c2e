"""What `--only` keeps of the names a run will emit (stepper.planning.names), and the check that a
`--show` picture has a shown tensor to be drawn from."""

from __future__ import annotations

from collections.abc import Callable

from stepper import catalog
from stepper.config import Config
from stepper.errors import StepperError
from stepper.planning.names import picture_tensors
from stepper.seams.trace import matches, unphased
from stepper.views.family_pictures import undrawable
from stepper.views.scale_grids import part_of

GLOB = set("*?[")


def only_filter(patterns: list[str], names: list[str], note: Callable[[str], None]) -> Callable[[str], bool]:
    """Which names `--only` keeps. A bare name that is a global tensor's (`logits`, `norm`) keeps
    that global only, not every layer tensor whose name ends the same way (`mlp.gate.logits`, kept
    by that name); another bare name that matches several kinds of tensor is said, with the kinds."""
    globals_ = {unphased(n) for n in names if not unphased(n).startswith("layers.")}
    tests = []
    for pattern in patterns:
        kinds = sorted({catalog.key_of(n) for n in names if matches(n, [pattern])})
        if GLOB & set(pattern) or len(kinds) < 2:
            tests.append(lambda name, p=pattern: matches(name, [p]))
        elif pattern in globals_:  # what was meant; the layers' tensors go by their own names
            tests.append(lambda name, p=pattern: unphased(name) == p)
        else:
            note(f"--only {pattern} matches {len(kinds)} kinds of tensor: {', '.join(kinds)}")
            tests.append(lambda name, p=pattern: matches(name, [p]))
    return lambda name: not tests or any(test(name) for test in tests)


def check_pictures(kinds: set[str], kept: list[str], cfg: Config) -> None:
    """Refuse a --show picture that no shown tensor can give, saying why."""
    keys = {catalog.key_of(name) for name in kept}
    if "routing" in kinds and (why := undrawable("routing", cfg)):
        raise StepperError(f"--show routing: {why}")
    for kind, needed in picture_tensors(cfg).items():
        if kind in kinds and not keys & set(needed):
            raise StepperError(f"--show {kind}: it is drawn from {' or '.join(needed)}, and this run shows "
                               f"none (choose layers or an --only that include {needed[0]})")
    if "scales" in kinds and (why := undrawable("scales", cfg)):
        raise StepperError(f"--show scales: {why}")
    if "scales" in kinds and not any(part_of(key) for key in keys):
        raise StepperError("--show scales: a weight's grid is drawn at its layer's attention or MLP tensors, and this "
                           "run shows none (choose layers or an --only that include one, e.g. '*self_attn.q_a')")
