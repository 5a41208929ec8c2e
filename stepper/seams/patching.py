"""Patches: at a named point of the computation, the model continues with another tensor.

A patch is a glob (matched as `--only` matches: a full name, or a dotted tail such as
`layers.1.mlp.gate.topk_idx` or `*.attn_weights`) and a function `fn(array, name)` returning the
tensor the model goes on with: an array of the same shape and dtype, or None to leave it as it
was (refused if the function changed its copy: that change would be lost). The function gets a
writable copy, so changing it in place never reaches another tensor that shares its memory. A
patched choice of indices is checked where the model makes it (seams.trace.Emitter.choice).
`Patcher` is the sink that applies them through the emit seam (a sink's
replacement is what emit returns to the model).

On the command line a patch is written `NAME=EXPR` (`--patch`, the debugger's `set`), EXPR a small
expression of the tensor `x` read with `ast` and evaluated by hand, never by `eval`: a number
(`0`: every entry), arithmetic with numbers (`x*0.5`, `x+1e-3`, `-x`, `x/2`), or one assignment to a
slice (`x[..., 7]=0`, `x[2]=1.5`, `x[0, :, 3]=x[0, :, 3]*2`).

The helpers of common experiments (zero an expert, silence a head, force the chosen experts, take
the router's bias away) are seams.experiments: each a dict of pattern -> function, its watches
made with `watcher`.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import numpy as np

from stepper.errors import StepperError
from stepper.seams.trace import Event, matches
from stepper.tensors.tensor import held, same_values
from stepper.untrusted import cut, said

PatchFn = Callable[[np.ndarray, str], "np.ndarray | None"]
Patches = Sequence[tuple[str, PatchFn]]  # in the order they apply


def shown_only(pattern: str, name: str) -> str:
    """Why a patch of a tensor the model only shows is refused."""
    return (f"patch {pattern}: {name} is shown only; the model does not read it back, so a patch there would "
            "change nothing (patch a tensor before it)")


class Patcher:
    """Sink replacing every tensor a pattern matches with its function's result (shape and dtype checked).

    Several patterns may match one tensor: they apply in order, each to the result of the one
    before. `applied` lists, per pattern, the names it replaced or watched."""

    def __init__(self, patches: Patches):
        self.patches = list(patches)
        self.applied: dict[str, list[str]] = {pattern: [] for pattern, _ in self.patches}

    def wants(self, event: Event) -> bool:
        """Whether a pattern matches the event: a tensor made only when a sink looks (a delta rule's
        state after every token) is not made for a patch of other tensors."""
        return any(matches(event.name, [pattern]) for pattern, _ in self.patches)

    def __call__(self, event: Event) -> np.ndarray | None:
        array, changed = event.array, False
        matched = [(pattern, fn) for pattern, fn in self.patches if matches(event.name, [pattern])]
        for pattern, fn in sorted(matched, key=lambda patch: is_watcher(patch[1])):  # watchers see what the model reads
            if not event.read:
                raise StepperError(shown_only(pattern, event.name))
            if not held(array):
                raise StepperError(f"patch {pattern}: {event.name} {list(array.shape)} is made a tile at a time (a "
                                   "long attention) and never held, so it cannot be patched: patch the queries or "
                                   "keys it is made from, or run a shorter prompt, whose attention is held whole")
            given = np.array(array, copy=True)
            try:
                result = fn(given, event.name)
            except StepperError:  # a helper's refusal, one line of its own
                raise
            except Exception as error:  # the function's own: its traceback from its frame (api.run), and where
                error.add_note(f"in patch {pattern} on {event.name} {array.dtype}{list(array.shape)}")
                raise
            self.applied[pattern].append(event.name)
            if result is None and not is_watcher(fn) and not same_values(given, array):
                raise StepperError(f"patch {pattern} on {event.name} changed its copy in place and returned None, "
                                   "which leaves the tensor as it was: return the array")
            if result is not None:
                array, changed = checked(pattern, event.name, array, result), True
        return array if changed else None


def raised_in_patch(error: BaseException) -> TracebackType | None:
    """The frames of a patch function that raised `error`, from its own (the model's around it left out)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code is not Patcher.__call__.__code__:
        tb = tb.tb_next
    return None if tb is None else tb.tb_next


def watcher(fn: PatchFn) -> PatchFn:
    """A helper's function that only looks (and returns None): it is called after every patch that
    replaces the tensor, so it sees the tensor the model goes on with, whatever the patches' order."""
    fn.watches = True  # type: ignore[attr-defined]
    return fn


def is_watcher(fn: PatchFn) -> bool:
    return getattr(fn, "watches", False)


def checked(pattern: str, name: str, old: np.ndarray, new: object) -> np.ndarray:
    """A patch's result, if it is an array of the tensor's shape and dtype; else one clear error."""
    if type(new) is not np.ndarray and isinstance(new, np.ndarray):  # a masked array broke a matmul deep inside
        raise StepperError(f"patch {pattern} on {name} returned a {type(new).__name__}; expected a plain np.ndarray "
                           f"of the tensor's shape and dtype, {old.dtype}{list(old.shape)} (a masked array's "
                           ".filled(value) is one)")
    if isinstance(new, np.ndarray) and new.shape == old.shape and new.dtype == old.dtype:
        return new
    got = f"{new.dtype}{list(new.shape)}" if isinstance(new, np.ndarray) else type(new).__name__
    raise StepperError(f"patch {pattern} on {name} returned {got}; expected an array of the tensor's "
                       f"shape and dtype, {old.dtype}{list(old.shape)}")


def as_patches(patch: Mapping[str, PatchFn] | Iterable[Mapping[str, PatchFn]] | None) -> list[tuple[str, PatchFn]]:
    """`patch=`: a dict of pattern -> function (or an EXPR as `--patch` takes it, e.g. "x*0.5"), or
    a list of such dicts (applied in order; the helpers each give one, so several on one tensor
    do not overwrite each other)."""
    if patch is None:
        return []
    groups = [patch] if isinstance(patch, Mapping) else list(patch) if isinstance(patch, (list, tuple)) else None
    if groups is None or not all(isinstance(g, Mapping) for g in groups):
        raise StepperError(f"patch= expects a dict of name pattern -> function (or a list of dicts), "
                           f"got {type(patch).__name__}")
    found = [(pattern, fn) for g in groups for pattern, fn in g.items()]
    for pattern, fn in found:
        if not isinstance(pattern, str) or not pattern or not (callable(fn) or isinstance(fn, str)):
            raise StepperError(f"patch= expects name patterns (strings) mapped to functions fn(array, name) "
                               f"or expressions like 'x*0.5', got {said(pattern)}: {type(fn).__name__}")
    return [(pattern, expression(fn, f"patch= {pattern}=") if isinstance(fn, str) else fn) for pattern, fn in found]


# ---------------------------------------------------------------------------------------------
# NAME=EXPR, read safely


def parse_patch(text: str, option: str = "--patch") -> tuple[str, PatchFn]:
    """'layers.1.mlp.gate.topk_idx=x[..., 0]=3' -> (the pattern, its function); the pattern ends at the first '='."""
    pattern, sep, expr = text.partition("=")
    pattern, expr = pattern.strip(), expr.strip()
    if not sep or not pattern or not expr:
        raise StepperError(f"{option} {text}: expected NAME=EXPR, e.g. 'layers.1.self_attn.attn_weights=x*0.5'")
    return pattern, expression(expr, f"{option} {pattern}=")


def expression(expr: str, where: str = "--patch ", said: str | None = None) -> PatchFn:
    """The function of an EXPR: checked for its form now, evaluated on each tensor it patches.
    `where` begins its error messages (the option and the name, as the user wrote them), and
    `said` is the expression as they wrote it (EXPR itself, cut short where long, unless given)."""
    said = cut(expr, 40) if said is None else said
    if len(expr) > MAX_EXPR:
        raise StepperError(f"{where}{said}: {len(expr)} characters; an expression is at most {MAX_EXPR}")
    try:
        tree = ast.parse(expr, mode="exec")
    except (SyntaxError, RecursionError, MemoryError):  # MemoryError: the parser's own stack, not the machine's
        tree = None
    if tree is not None and nesting(tree) > MAX_NESTING:
        raise StepperError(f"{where}{said}: nested more than {MAX_NESTING} deep (brackets, operators, signs)")
    stmt = tree.body[0] if tree is not None and len(tree.body) == 1 else None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and is_x_slice(stmt.targets[0]):
        target, value = stmt.targets[0], stmt.value
    elif isinstance(stmt, ast.Expr):
        target, value = None, stmt.value
    else:
        raise StepperError(f"{where}{said}: expected a number, arithmetic of x with numbers (x*0.5, x+1e-3) "
                           "or one slice assignment (x[..., 7]=0)")
    try:
        check_form(value)
        if target is not None:
            index_of(target.slice)
    except ValueError as e:
        raise StepperError(f"{where}{said}: {e}") from None

    def apply(x: np.ndarray, name: str) -> np.ndarray:
        try:
            return evaluate_patch(x, target, value)
        except (ValueError, IndexError, TypeError, OverflowError, ZeroDivisionError) as e:
            raise StepperError(f"{where}{said} on {name} {x.dtype}{list(x.shape)}: {e}") from None

    return apply


MAX_EXPR = 1000  # characters of an EXPR: ast's parser fails past 200 brackets, and nests a node per sign
MAX_NESTING = 100  # nodes inside one another: checking and evaluating recurse once per level


def nesting(tree: ast.AST) -> int:
    """How deep the nodes of a parsed expression nest (counted without recursing)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


CONSTANTS = {"nan": float("nan"), "inf": float("inf")}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def is_x_slice(node: ast.AST) -> bool:
    return isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "x"


def check_form(node: ast.AST) -> None:
    """Only x, x[INDEX], numbers (nan and inf too), + - * / and unary minus."""
    if isinstance(node, ast.Name) and node.id in ("x", *CONSTANTS):
        return
    if is_x_slice(node):
        index_of(node.slice)
        return
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return check_form(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        check_form(node.left)
        return check_form(node.right)
    raise ValueError(f"'{ast.unparse(node)}' is not allowed: use x, x[INDEX], numbers, nan, inf and + - * /")


def evaluate_patch(x: np.ndarray, target: ast.Subscript | None, value: ast.AST) -> np.ndarray:
    """The patched tensor: a copy of x with the slice set, or the value everywhere (cast to x's dtype
    only when that loses nothing, so `x*0.5` on integer expert indices is refused, not truncated)."""
    result = np.array(x, copy=True)
    v = np.asarray(evaluate(value, x))
    if not np.can_cast(v, result.dtype, casting="same_kind") and v.dtype != result.dtype:
        raise ValueError(f"it gives {v.dtype} values for a tensor of {result.dtype}")
    if target is None:
        result[...] = v
    else:
        result[index_of(target.slice)] = v
    return result


def evaluate(node: ast.AST, x: np.ndarray) -> Any:
    if isinstance(node, ast.Name):
        return CONSTANTS.get(node.id, x)
    if isinstance(node, ast.Subscript):
        return x[index_of(node.slice)]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp):
        operand = evaluate(node.operand, x)
        return -operand if isinstance(node.op, ast.USub) else operand
    return OPERATORS[type(node.op)](evaluate(node.left, x), evaluate(node.right, x))


def index_of(node: ast.AST) -> Any:
    """A NumPy index written as text: integers, slices a:b:c, ... and None, as a tuple."""
    if isinstance(node, ast.Tuple):
        return tuple(index_of(n) for n in node.elts)
    if isinstance(node, ast.Slice):
        return slice(*(None if n is None else index_of(n) for n in (node.lower, node.upper, node.step)))
    if isinstance(node, ast.Constant) and (type(node.value) is int or node.value is Ellipsis or node.value is None):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -index_of(node.operand)
    raise ValueError(f"index '{ast.unparse(node)}' is not allowed: use integers, slices a:b:c and ...")

