"""A checkpoint holding only some layers, as `stepper synth --layers A:B` writes one.

A layer with no tensor at all in the checkpoint was left out on purpose: one problem says which
layers are there and how to look at them, instead of one problem per tensor of every absent layer
(68,809 of them for Kimi K2 holding one layer). A layer holding some of its tensors keeps its
per-tensor problems.
"""

from __future__ import annotations

from stepper.weights.names import layer_prefix

GLOBALS = "embedding, norm or lm_head"


def spans(layers: list[int]) -> list[range]:
    """Sorted layers as runs of consecutive ones: [1, 2, 5] -> [range(1, 3), range(5, 6)]."""
    runs: list[range] = []
    for layer in layers:
        if runs and runs[-1].stop == layer:
            runs[-1] = range(runs[-1].start, layer + 1)
        else:
            runs.append(range(layer, layer + 1))
    return runs


def span_text(runs: list[range]) -> str:
    """'layer 1', 'layers 1..2', 'layers 0..3, 7'."""
    parts = [str(r.start) if len(r) == 1 else f"{r.start}..{r.stop - 1}" for r in runs]
    plural = len(runs) > 1 or len(runs[0]) > 1
    return f"layer{'s' if plural else ''} {', '.join(parts)}"


def partial_text(present: list[int], n_layers: int, has_globals: bool) -> str:
    """The one problem of a checkpoint missing whole layers (or all of its embedding, norm and
    lm_head): the layers it holds, and the options that look at them."""
    every = f"0..{n_layers - 1}"
    if not present:
        holds = f"holds no tensor of layers {every}" + ("" if has_globals else f" nor the {GLOBALS}")
        return f"{holds} (names look like '{layer_prefix(0)}input_layernorm.weight')"
    runs = spans(present)
    holds = f"holds only {span_text(runs)} of {every}" if len(present) < n_layers else f"holds layers {every}"
    holds += "" if has_globals else f", no {GLOBALS}"
    first = runs[0]
    from_start = has_globals and first.start == 0 and first.stop < n_layers  # a model run needs the embedding
    run = f"--layers 0:{first.stop}" if from_start else f"--layer {first.start}"
    return f"{holds}: inspect with --layers {first.start}:{first.stop}, run with {run}"
