"""The common experiments as patches: drop an expert, silence a head, force the chosen experts,
take the router's bias away, on each family's layers that have what the experiment changes.

A helper gives a dict of pattern -> function (seams.patching) made of forms, one for each kind
of layer it knows, since the families name these tensors apart:

- routers: the MLA families' `mlp.gate.*` (topk_idx, topk_weight, scores_for_choice);
  DeepSeek-V4's `ffn.gate.*`, whose hash layers take their experts from a table by the token id
  (hash_idx) and whose score layers choose the top k of biased_scores (topk_idx), both weighed
  by `weights`;
- heads: MLA's query `self_attn.q` [B, H, T, D] and the merged heads `self_attn.attn_output`
  [B, T, H*Dv] (both of LongCat-Flash's sublayers); V4's `attn.output` [B, H, T, D] and a Kimi
  Linear KDA layer's `self_attn.gated_output` [B, H, T, Dv], each a head per row of axis 1.

Before a run, `fitted` keeps each helper's forms whose every tensor the run has, and refuses a
helper none of whose forms it has, in one line naming the layer (and why, where the layer's kind
rules the experiment out: a hash-routed layer has no bias).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from stepper.errors import StepperError
from stepper.seams.patching import Patches, PatchFn, watcher
from stepper.seams.trace import matches
from stepper.untrusted import said

ROUTER = ("a MoE router (mlp.gate.topk_idx and topk_weight; DeepSeek-V4's ffn.gate.hash_idx or topk_idx, "
          "and weights)")
HEADS = ("an attention's heads (MLA's self_attn.attn_output, DeepSeek-V4's attn.output, "
         "a KDA layer's self_attn.gated_output)")
BIAS = "a router's bias (mlp.gate.scores_for_choice; DeepSeek-V4's score layers' ffn.gate.biased_scores)"
HASHED = ("a hash-routed layer takes its experts from tid2eid's row for each token (ffn.gate.hash_idx), "
          "chosen by no score and no bias")
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class Helper:
    """What a helper's functions share: the call as written, what it patches (in words), its layer
    (a number, or "*" for every layer), its forms (the patterns of each) and, per pattern, why a
    layer that has that tensor has nothing for the helper to patch."""

    call: str
    needs: str
    layer: int | str
    forms: list[list[str]]
    unless: dict[str, str] = field(default_factory=dict)

    def patterns_in(self, names: Sequence[str], model: str) -> set[str]:
        """The patterns of the forms the run has every tensor of; refused if it has none."""
        def has(pattern: str) -> bool:
            return any(matches(name, [pattern]) for name in names)

        fit = [form for form in self.forms if all(map(has, form))]
        if not fit:
            raise StepperError(self.refusal(has, names, model))
        return {pattern for form in fit for pattern in form}

    def refusal(self, has: Callable[[str], bool], names: Sequence[str], model: str) -> str:
        where = f"layer {self.layer} of this run of {model}" if self.layer != "*" else f"this run of {model}"
        why = next((f": {reason}" for pattern, reason in self.unless.items() if has(pattern)), "")
        found = sorted(set().union(*(layers_with(form, names) for form in self.forms)))
        elsewhere = f"; layers with one: {', '.join(map(str, found))}" if found else ""
        return f"{self.call} patches {self.needs}, and {where} has none{why}{elsewhere}"


def layers_with(form: list[str], names: Sequence[str]) -> set[int]:
    """The layers that have every tensor of a form (its patterns taken at any layer)."""
    found: set[int] | None = None
    for pattern in form:
        anywhere = "layers.*." + pattern.removeprefix("layers.").partition(".")[2]
        layers = {int(m.group(1)) for name in names if matches(name, [anywhere]) and (m := LAYER.search(name))}
        found = layers if found is None else found & layers
    return found or set()


def helper(call: str, needs: str, layer: int | str, forms: list[dict[str, PatchFn]],
           unless: dict[str, str] | None = None) -> dict[str, PatchFn]:
    """A helper's patches, its forms merged (a pattern in several forms is one patch), each
    function knowing the helper that made it (for `fitted`)."""
    made = Helper(call, needs, layer, [list(form) for form in forms], unless or {})
    patches = {pattern: fn for form in forms for pattern, fn in form.items()}
    for fn in patches.values():
        fn.helper = made  # type: ignore[attr-defined]
    return patches


def fitted(patches: Patches, names: Sequence[str], model: str) -> list[tuple[str, PatchFn]]:
    """The patches a run applies: of a helper's patterns, those of the forms the run has (the others
    dropped, so a V4 hash layer's patch waits for no topk_idx; a helper's function a user set under
    a pattern of their own is kept); refused for a helper the run has no form of."""
    helpers = {id(made): made for _, fn in patches if (made := getattr(fn, "helper", None))}
    unused = {key: {p for form in made.forms for p in form} - made.patterns_in(names, model)
              for key, made in helpers.items()}
    return [(pattern, fn) for pattern, fn in patches
            if (made := getattr(fn, "helper", None)) is None or pattern not in unused[id(made)]]


def whole_numbers(call: str, **arguments: object) -> None:
    """Refuse a helper's layer, expert or head that is not a whole number >= 0, naming it (2.5 once
    zeroed nothing, and "2" failed inside the run)."""
    for name, value in arguments.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise StepperError(f"{call}: {name} must be a whole number >= 0, got {said(value)}")


def zero_expert(layer: int, expert: int) -> dict[str, PatchFn]:
    """Expert `expert` of layer `layer` contributes nothing: its weight is 0 wherever a token chose
    it (the others keep theirs), so routed_output is the sum of the other experts'. The choice is
    the MLA router's topk_idx, or V4's hash_idx (hash layers) or topk_idx (score layers)."""
    whole_numbers("zero_expert", layer=layer, expert=expert)
    seen: dict[str, np.ndarray] = {}

    @watcher
    def in_range(logits: np.ndarray, name: str) -> None:
        if not 0 <= expert < logits.shape[-1]:
            raise StepperError(f"zero_expert: expert {expert} out of range: layer {layer} has experts "
                               f"0..{logits.shape[-1] - 1}")

    @watcher
    def watch(chosen: np.ndarray, name: str) -> None:
        seen["chosen"] = chosen

    def zero(weight: np.ndarray, name: str) -> np.ndarray:
        weight[seen["chosen"] == expert] = 0
        return weight

    def form(gate: str, choice: str, weights: str) -> dict[str, PatchFn]:
        at = f"layers.{layer}.{gate}."
        return {at + "logits": in_range, at + choice: watch, at + weights: zero}

    return helper(f"zero_expert({layer}, {expert})", ROUTER, layer, [
        form("mlp.gate", "topk_idx", "topk_weight"), form("ffn.gate", "hash_idx", "weights"),
        form("ffn.gate", "topk_idx", "weights")])


def zero_head(layer: int, head: int) -> dict[str, PatchFn]:
    """Head `head` of layer `layer` is silent: its output, which the output projection reads, is 0.
    MLA: its v_head columns of attn_output (the number of heads read from the query [B, H, T, qk_head];
    each of LongCat-Flash's two attention sublayers). V4: its row of attn.output [B, H, T, D] (so of
    output_turned_back too, which wo_a reads by groups of heads). KDA: its row of gated_output."""
    whole_numbers("zero_head", layer=layer, head=head)
    seen: dict[str, int] = {}

    def in_range(heads: int) -> None:
        if not 0 <= head < heads:
            raise StepperError(f"zero_head: head {head} out of range: layer {layer} has heads 0..{heads - 1}")

    @watcher
    def watch(q: np.ndarray, name: str) -> None:
        seen["heads"] = q.shape[1]

    def silence_columns(out: np.ndarray, name: str) -> np.ndarray:  # [B, T, H * v_head]
        in_range(seen["heads"])
        v_head = out.shape[-1] // seen["heads"]
        out[..., head * v_head:(head + 1) * v_head] = 0
        return out

    def silence_row(out: np.ndarray, name: str) -> np.ndarray:  # [B, H, T, D]
        in_range(out.shape[1])
        out[:, head] = 0
        return out

    at = f"layers.{layer}."
    return helper(f"zero_head({layer}, {head})", HEADS, layer, [
        {at + "*self_attn.q": watch, at + "*self_attn.attn_output": silence_columns},
        {at + "attn.output": silence_row}, {at + "self_attn.gated_output": silence_row}])


def force_experts(layer: int, experts: Sequence[int] | np.ndarray) -> dict[str, PatchFn]:
    """Every token of layer `layer` chooses `experts` (k of them, best first), or per token the rows
    of an [N, k] array; their weights are then computed from the router's scores as usual. In a
    DeepSeek-V4 hash layer the choice forced is the table's (hash_idx), as if tid2eid held these
    rows for the run's tokens: the gate's scores still weigh them."""
    whole_numbers("force_experts", layer=layer)
    chosen = np.asarray(experts)
    if chosen.dtype.kind not in "iu":
        raise StepperError(f"force_experts: experts are whole numbers (expert indices), got {chosen.dtype} values")
    chosen = chosen.astype(np.int64)

    def force(idx: np.ndarray, name: str) -> np.ndarray:
        forced = np.broadcast_to(chosen, idx.shape) if chosen.shape in (idx.shape, idx.shape[-1:]) else None
        if forced is None:
            raise StepperError(f"force_experts: {name} has shape {list(idx.shape)} (tokens x chosen experts); "
                               f"got experts of shape {list(chosen.shape)}")
        return np.array(forced)

    return helper(f"force_experts({layer}, ...)", ROUTER, layer, [
        {f"layers.{layer}.{choice}": force} for choice in ("mlp.gate.topk_idx", "ffn.gate.hash_idx",
                                                            "ffn.gate.topk_idx")])


def zero_router_bias(layer: int | str = "*") -> dict[str, PatchFn]:
    """The router of layer `layer` (every layer with a bias: "*") chooses by the unbiased scores, as if
    e_score_correction_bias were 0: scores_for_choice (V4: biased_scores) is replaced by the scores
    (a sigmoid's or, LongCat's, a softmax's; V4's sqrt-softplus). A V4 hash layer has no bias to
    take away, nor has a router that chooses by its scores alone (Mistral 4, A.X-K1): each is refused."""
    seen: dict[str, np.ndarray] = {}

    @watcher
    def watch(scores: np.ndarray, name: str) -> None:
        if name.endswith(("gate.scores", "gate.softmax_scores")):  # not group_scores
            seen["scores"] = scores

    def unbiased(biased: np.ndarray, name: str) -> np.ndarray:
        if np.array_equal(biased, seen["scores"]):  # else a silent no-op
            raise StepperError(f"zero_router_bias({layer!r}): {name} is the scores themselves: this router has no "
                               "bias to take away, or its bias is 0 (Mistral 4 and A.X-K1 have none)")
        return np.array(seen["scores"])

    at = f"layers.{layer}."
    return helper(f"zero_router_bias({layer!r})", BIAS, layer, [
        {at + "mlp.gate.*scores": watch, at + "mlp.gate.scores_for_choice": unbiased},
        {at + "ffn.gate.scores": watch, at + "ffn.gate.biased_scores": unbiased}],
        unless={at + "ffn.gate.hash_idx": HASHED})
