"""`stepper explain` and `stepper tree`: the catalogue of named tensors, one entry or a layer's list."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from stepper import catalog
from stepper.cli.common import ModelOpt, PlainOpt, user_errors
from stepper.config import Config
from stepper.errors import StepperError
from stepper.fixtures.implementation_names import explained
from stepper.session import RunSpec, check_layer, check_refused, command_line, load_model, takes
from stepper.views.compare import compared_layer, comparison
from stepper.views.explain import also_named, found_texts, looked_up
from stepper.views.sinks import line_width, print_fitted, print_whole, styles
from stepper.views.tree import layer_kind, layer_tree


def explain_command(
    name: Annotated[str, typer.Argument(metavar="NAME",
        help="A tensor name (layers.1.self_attn.k_pe, k_pe), a glob ('*gate*'), a word of names (topk), a checkpoint "
             "parameter (model.layers.1.self_attn.q_a_proj.weight: the tensors computed from it) or another "
             "implementation's name (kv_cmpr, model.layers.1.self_attn.kv_a_proj_with_mqa).",
                                                             show_default=False)],
    model: ModelOpt = "tiny",
    plain: PlainOpt = False,
) -> None:
    """The catalogue entry of a tensor: what it is, its formula and shape, the reference lines."""
    with user_errors():
        cfg = load_model(model, 0).config
        found = looked_up(cfg, name, explained)
        console = Console(**styles(plain), highlight=False, markup=False, soft_wrap=True)
        for text in found_texts(found):  # a terminal's lines broken at spaces, a pipe's kept whole
            print_fitted(console, text)
            console.print()
        if also := also_named(found.cat, name, found.entries):
            print_fitted(console, also)


def tree_command(
    model: ModelOpt = "tiny",
    layer: Annotated[int | None, typer.Option(
        metavar="N", help="Only layer N's kind (dense or MoE; a family's own: KDA or MLA, V4's compression).")] = None,
    attn: Annotated[str | None, typer.Option(
        metavar="naive|absorb", show_default="naive", help="Which attention tensors to list (a family with one "
        "attention path, DeepSeek-V4's, takes no such option, as run refuses it; with --compare, the model that has "
        "the choice takes it).")] = None,
    plain: PlainOpt = False,
    compare: Annotated[str | None, typer.Option(
        metavar="NAME|PATH", help="Another model: show where its layer differs from --model's (tensors one has and "
        "the other lacks, shapes, formulas reading a differing config field).")] = None,
    everything: Annotated[bool, typer.Option("--all", help="With --compare: list the tensors alike in both too.")
                          ] = False,
) -> None:
    """The structure of a layer: every named tensor in order, its shape for this model, what it is."""
    with user_errors():
        if everything and compare is None:  # the tensors alike in both: there is no second model to be alike to
            raise StepperError("--all lists the tensors alike in both models of --compare: add --compare NAME|PATH")
        cfg = load_model(model, 0).config
        asked, attn = attn, attn or "naive"  # asked: --attn as given, None when it is not
        if attn not in ("naive", "absorb"):
            raise StepperError(f"--attn must be naive or absorb, got '{attn}'")
        other = load_model(compare, 0).config if compare is not None else None
        refuse_attn(asked, cfg, *([other] if other else []))
        if layer is not None:
            check_layer(layer, cfg)
        console = Console(**styles(plain), highlight=False, markup=False)
        if other is not None:  # two models side by side (views.compare)
            if layer is not None:
                check_layer(layer, other)
            layers = (compared_layer(cfg, layer), compared_layer(other, layer))
            print_whole(console, comparison(catalog.load(), cfg, other, layers, attn, everything, line_width(console)))
            return
        kinds = {layer_kind(cfg, i): i for i in range(cfg.num_hidden_layers)}
        layers = [layer] if layer is not None else sorted(kinds.values())
        for i in layers:
            print_whole(console, layer_tree(catalog.load(), cfg, i, attn))


def refuse_attn(attn: str | None, *cfgs: Config) -> None:
    """--attn given (None: not) where no model of those listed has a choice of attention path (DeepSeek-V4
    has one): refused in the one line `stepper run` and `step` give (session.check_refused). A
    comparison of a model with a choice and one without takes it for the first."""
    if attn is None:
        return
    if not any(takes(cfg, "attn") for cfg in cfgs):
        check_refused(RunSpec(attn=attn), cfgs[0], command_line)
