"""`stepper step`: a debugger over the emit seam.

The `Debugger` is a sink. At each named tensor it decides whether to stop (every tensor when
stepping, breakpoints when continuing, one name with `until`); when it stops it shows where the
run is and the tensor, then reads commands until one resumes the run. Commands come from a
`--commands` file, then from a terminal, or line by line from a pipe, so sessions can be
scripted and tested. Every tensor seen stays in the history and can be printed, sliced,
compared, explained or drawn later. The model code knows nothing of this. What the user typed is
echoed, and comes back in messages, with its control characters escaped.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from stepper import catalog
from stepper.config import Config
from stepper.errors import StepperError
from stepper.trace import Event, did_you_mean, held, matches
from stepper.untrusted import shown
from stepper.views import pictures
from stepper.views.explain import explain_text
from stepper.views.sinks import TensorRows
from stepper.views.tree import BLOCKS
from stepper.weights.names import layer_prefix
from stepper.weights.source import WeightSource

PROMPT = "(stepper) "

HELP = (
    "n next (Enter) · c continue · b break GLOB · d delete [GLOB] · u until NAME · "
    "p print NAME[slice] [digits] · e explain [NAME] · w where · x compare A B · h history · "
    "s show attention|routing|hist|scales [NAME] · q quit · ? help"
)


class Quit(Exception):
    """Raised through the model run to end it early."""


class CommandSource:
    """Command lines: a script first, then a terminal (with a prompt) or a pipe (echoed)."""

    def __init__(self, console: Console, stdin: IO[str], interactive: bool, script: list[str] | None = None):
        self.console = console
        self.stdin = stdin
        self.interactive = interactive
        self.script = list(script or [])

    def read(self) -> str | None:
        """The next command, or None at the end of input."""
        return self.ask(PROMPT)

    def ask(self, prompt: str) -> str | None:
        """The next line typed after `prompt` (a command, a prediction), or None at the end of input."""
        if self.script:
            return self._echo(self.script.pop(0), prompt)
        if self.interactive:
            try:
                return self.console.input(prompt)
            except EOFError:
                return None
        line = self.stdin.readline()
        return None if not line else self._echo(line.rstrip("\n"), prompt)

    def _echo(self, line: str, prompt: str = PROMPT) -> str:
        self.console.print(Text(prompt, style="bold") + Text(shown(line)))
        return line


@dataclass
class Debugger:
    """The sink that stops, shows and takes commands."""

    console: Console
    cfg: Config
    commands: CommandSource
    weights: WeightSource | None = None
    breakpoints: list[str] = field(default_factory=list)
    until: str | None = None
    on_stop: Callable[[Event], None] | None = None  # e.g. a JSON Lines writer
    names: list[str] | None = None  # every name the run emits, when known: b and u check theirs against them
    stepping: bool = True
    history: dict[str, Event] = field(default_factory=dict)
    current: Event | None = None
    skipped: int = 0
    stops: int = 0

    def __post_init__(self) -> None:
        self.catalog = catalog.load()
        self.rows = TensorRows(self.console, self.cfg)
        self.stepping = not (self.breakpoints or self.until)

    # -- the sink ----------------------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        self.history[event.name] = event
        self.current = event
        if not self.should_stop(event):
            self.skipped += 1
            return
        self.show(event)
        self.repl()

    def should_stop(self, event: Event) -> bool:
        if self.until is not None:
            if not matches(event.name, [self.until]):
                return False
            self.until = None
            return True
        return self.stepping or matches(event.name, self.breakpoints)

    def show(self, event: Event) -> None:
        if self.skipped:
            self.console.print(f"({self.skipped} tensors passed)", style="dim")
            self.skipped = 0
        self.console.print(self.breadcrumb(event), style="bold magenta")
        self.console.print(self.rows.render(event), soft_wrap=True)
        entry = self.catalog.entry(event.key)
        if entry:
            self.console.print(f"    {entry['description']}", style="italic")
        if self.on_stop:
            self.on_stop(event)
        if self.stops == 0:
            self.console.print(Text(HELP, style="dim"))
        self.stops += 1

    def breadcrumb(self, event: Event) -> str:
        parts = [] if event.phase is None else [event.phase]
        if event.layer is None:
            parts.append("model")
        else:
            parts.append(f"layer {event.layer} ({'MoE' if self.cfg.is_moe_layer(event.layer) else 'dense'})")
        entry = self.catalog.entry(event.key)
        block = BLOCKS.get(entry["block"], entry["block"]) if entry else None
        if block and block != parts[-1]:
            parts.append(block)
        parts.append(event.key if block == BLOCKS["router"] else event.key.rpartition(".")[2])
        return " › ".join(parts)

    # -- commands ----------------------------------------------------------------------------

    def repl(self) -> None:
        while True:
            line = self.commands.read()
            if line is None:
                self.console.print("(end of commands: quitting)", style="dim")
                raise Quit
            try:
                if self.execute(line):
                    return
            except StepperError as e:
                self.error(e)

    def error(self, e: StepperError) -> None:
        """A command's problem, in red; the session goes on."""
        self.console.print(shown(e, lines=True), style="red")

    def execute(self, line: str) -> bool:
        """Run one command; True when the run should resume."""
        word, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        handler = COMMANDS.get(word)
        if handler is None:
            self.console.print(Text(f"unknown command '{shown(word)}'", style="red"))
            self.console.print(Text(HELP, style="dim"))
            return False
        return bool(handler(self, rest))

    def cmd_next(self, _: str) -> bool:
        self.stepping = True
        return True

    def cmd_continue(self, _: str) -> bool:
        self.stepping = False
        return True

    def cmd_break(self, arg: str) -> None:
        if arg:
            self.check_matches("b", arg)
            self.breakpoints.append(arg)
        self.show_breakpoints()

    def cmd_delete(self, arg: str) -> None:
        if arg and arg not in self.breakpoints:
            raise StepperError(f"no breakpoint '{arg}' (breakpoints: {', '.join(self.breakpoints) or 'none'})")
        self.breakpoints = [b for b in self.breakpoints if arg and b != arg]
        self.show_breakpoints()

    def show_breakpoints(self) -> None:
        self.console.print(f"breakpoints: {shown(', '.join(self.breakpoints) or 'none')}")

    def cmd_until(self, arg: str) -> bool:
        if not arg:
            raise StepperError("until needs a name or glob, e.g. u attn_weights")
        if self.names is not None and not any(matches(n, [arg]) for n in self.names if n not in self.history):
            self.check_matches("u", arg)
            raise StepperError(f"u {arg}: every tensor it matches has passed (h lists them)")
        self.until = arg
        return True

    def check_matches(self, command: str, pattern: str) -> None:
        """A pattern must match a name of the run (when the run's names are known), or it would do nothing."""
        if self.names is not None and not any(matches(name, [pattern]) for name in self.names):
            raise StepperError(f"{command} {pattern}: matches no tensor of this run{did_you_mean(pattern, self.names)}")

    def cmd_print(self, arg: str) -> None:
        target, digits = split_digits(arg)
        name, index = split_index(target)
        event = self.resolve(name)
        if index is None and not held(event.array):
            raise StepperError(f"{event.name} {list(event.array.shape)} is made a tile at a time, never held: "
                               f"print a slice of it, e.g. p {name or event.key}[0, 0, 0, :8]")
        array = take(event.array, index)
        shape = "x".join(map(str, np.shape(array))) or "scalar"
        self.console.print(f"{event.name}{index or ''}  [{shape}]  {np.asarray(array).dtype}", style="bold")
        text = np.array2string(np.asarray(array), precision=digits, max_line_width=max(40, self.console.width),
                               threshold=256, edgeitems=4, floatmode="fixed" if digits is not None else "maxprec")
        self.console.print(text, highlight=False, soft_wrap=True)

    def cmd_explain(self, arg: str) -> None:
        key = catalog.key_of(self.resolve(arg).name) if not arg or self._seen(arg) else arg
        entries = self.catalog.find(key)
        if not entries:
            raise StepperError(f"no catalogue entry for '{key}' (try a name like self_attn.k_pe or a glob)")
        for entry in entries:
            self.console.print(explain_text(self.catalog, entry, self.cfg))

    def cmd_where(self, _: str) -> None:
        self.console.print(self.where_tree())

    def cmd_compare(self, arg: str) -> None:
        names = arg.split()
        if len(names) != 2:
            raise StepperError("compare takes two tensors: x NAME_A NAME_B")
        a, b = (self.resolve(n) for n in names)
        self.console.print(compare_text(a, b))

    def cmd_history(self, arg: str) -> None:
        events = list(self.history.values())
        count = int(arg) if arg.isdigit() else 20
        for event in events[-count:]:
            self.console.print(f"  {event.name}  {list(event.array.shape)}", highlight=False)
        if len(events) > count:
            self.console.print(f"  ({len(events) - count} earlier; h N shows more)", style="dim")

    def cmd_show(self, arg: str) -> None:
        what, _, name = arg.partition(" ")
        pictures_ = {"attention": self.show_attention, "routing": self.show_routing,
                     "hist": self.show_histogram, "scales": self.show_scales}
        if what not in pictures_:
            raise StepperError("show what? s attention | s routing | s hist [NAME] | s scales WEIGHT")
        pictures_[what](name.strip())

    def cmd_quit(self, _: str) -> None:
        raise Quit

    def cmd_help(self, _: str) -> None:
        self.console.print(Text(HELP))

    # -- pictures ----------------------------------------------------------------------------

    def show_attention(self, name: str) -> None:
        event = self.resolve(name or "self_attn.attn_weights")
        self.console.print(pictures.attention_heatmap(event.array, title=event.name))

    def show_routing(self, name: str) -> None:
        idx = self.resolve(name or "mlp.gate.topk_idx")
        weight = self.resolve(idx.name.replace("topk_idx", "topk_weight"))
        self.console.print(pictures.routing_map(idx.array, weight.array, self.cfg.n_routed_experts))

    def show_histogram(self, name: str) -> None:
        event = self.resolve(name)
        self.console.print(pictures.histogram(event.array, title=event.name))

    def show_scales(self, name: str) -> None:
        if self.weights is None or not hasattr(self.weights, "stored"):
            raise StepperError("no stored weights to show scales of in this run")
        if not name:
            raise StepperError("s scales needs a weight, e.g. s scales self_attn.kv_a_proj_with_mqa.weight")
        layer = self.current.layer if self.current and self.current.layer is not None else 0
        full = name if name.startswith(("model.", "lm_head")) else layer_prefix(layer) + name
        stored = self.weights.stored(full)
        if stored.scale_inv is None:
            raise StepperError(f"'{full}' is stored as {stored.dtype}: only F8_E4M3 weights have block scales")
        self.console.print(pictures.scale_grid(np.asarray(stored.scale_inv, dtype=np.float32), title=full))

    # -- names -------------------------------------------------------------------------------

    def resolve(self, name: str) -> Event:
        """A tensor seen so far: the current one, a full name, or a name in the current scope."""
        if not name:
            if self.current is None:
                raise StepperError("no tensor yet")
            return self.current
        if name in self.history:
            return self.history[name]
        for candidate in self._scoped(name):
            if candidate in self.history:
                return self.history[candidate]
        for event in reversed(self.history.values()):
            if matches(event.name, [name]):
                return event
        raise StepperError(f"no tensor '{name}' seen yet (h lists them)")

    def _seen(self, name: str) -> bool:
        try:
            self.resolve(name)
        except StepperError:
            return False
        return True

    def _scoped(self, name: str) -> list[str]:
        if self.current is None:
            return []
        phase = f"{self.current.phase}." if self.current.phase else ""
        layer = f"layers.{self.current.layer}." if self.current.layer is not None else ""
        return [f"{phase}{layer}{name}", f"{phase}{name}"]

    def where_tree(self) -> Tree:
        event = self.current
        if event is None or event.layer is None:
            tree = Tree("model")
            for e in self.history.values():
                tree.add(Text(f"✓ {e.name}", style="dim"))
            return tree
        seen = {e.key for e in self.history.values() if e.layer == event.layer and e.phase == event.phase}
        kind = "MoE" if self.cfg.is_moe_layer(event.layer) else "dense"
        root = Tree(Text(f"{event.phase + ' · ' if event.phase else ''}layer {event.layer} ({kind})", style="bold"))
        branch, current = root, None
        for entry in self.catalog.layer_sequence(self.cfg, event.layer, "absorb" if "q_nope_absorbed" in str(seen) else "naive"):
            block = BLOCKS.get(entry["block"], entry["block"])
            if block != current:  # consecutive tensors of one block share a branch, in execution order
                branch, current = root.add(block), block
            key = entry["name"]
            if key == event.key:
                branch.add(Text(f"▶ {key}  {entry['description']}", style="bold yellow"))
            elif key in seen:
                branch.add(Text(f"✓ {key}", style="green"))
            else:
                branch.add(Text(f"· {key}", style="dim"))
        return root


COMMANDS: dict[str, Callable[[Debugger, str], Any]] = {}
for _names, _method in (
    (("", "n", "next"), Debugger.cmd_next),
    (("c", "continue"), Debugger.cmd_continue),
    (("b", "break"), Debugger.cmd_break),
    (("d", "delete"), Debugger.cmd_delete),
    (("u", "until"), Debugger.cmd_until),
    (("p", "print"), Debugger.cmd_print),
    (("e", "explain"), Debugger.cmd_explain),
    (("w", "where"), Debugger.cmd_where),
    (("x", "compare"), Debugger.cmd_compare),
    (("h", "history"), Debugger.cmd_history),
    (("s", "show"), Debugger.cmd_show),
    (("q", "quit"), Debugger.cmd_quit),
    (("?", "help"), Debugger.cmd_help),
):
    COMMANDS.update(dict.fromkeys(_names, _method))


# ---------------------------------------------------------------------------------------------
# Helpers that read like the commands they serve


def split_digits(arg: str) -> tuple[str, int | None]:
    """'k_pe[0, :4] 6' -> ('k_pe[0, :4]', 6): a trailing integer after the closing bracket is the precision."""
    head, _, tail = arg.rpartition(" ")
    if head and tail.isdigit() and (head.rstrip().endswith("]") or "[" not in head):
        return head.strip(), int(tail)
    return arg.strip(), None


def split_index(text: str) -> tuple[str, str | None]:
    """'self_attn.k_pe[0,0,:, :8]' -> ('self_attn.k_pe', '[0,0,:, :8]')."""
    if "[" not in text:
        return text, None
    name, _, rest = text.partition("[")
    if not rest.endswith("]"):
        raise StepperError(f"bad slice '{text}': expected NAME[i, a:b, ...]")
    return name.strip(), "[" + rest


def take(array: np.ndarray, index: str | None) -> np.ndarray:
    """array[index] for a NumPy-style index written as text, parsed safely (ints, slices, ...)."""
    if index is None:
        return array
    try:
        node = ast.parse("x" + index, mode="eval").body
        key = _index_value(node.slice)
        return array[key]
    except (SyntaxError, ValueError, IndexError, TypeError) as e:
        raise StepperError(f"bad slice {index} for shape {list(array.shape)}: {e}") from None


def _index_value(node: ast.AST) -> Any:
    if isinstance(node, ast.Tuple):
        return tuple(_index_value(n) for n in node.elts)
    if isinstance(node, ast.Slice):
        return slice(*(None if n is None else _index_value(n) for n in (node.lower, node.upper, node.step)))
    if isinstance(node, ast.Constant) and (isinstance(node.value, int) or node.value is Ellipsis or node.value is None):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_index_value(node.operand)
    raise ValueError("only integers, slices a:b:c, ... and None are allowed")


def compare_text(a: Event, b: Event) -> Text:
    for e in (a, b):
        if not held(e.array):
            raise StepperError(f"{e.name} {list(e.array.shape)} is made a tile at a time, never held: x compares held tensors")
    x, y = np.asarray(a.array, dtype=np.float64), np.asarray(b.array, dtype=np.float64)
    if x.shape != y.shape:
        raise StepperError(f"cannot compare shapes {list(x.shape)} and {list(y.shape)}")
    finite = np.isfinite(x) & np.isfinite(y)
    diff = np.abs(x - y)[finite]
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(y[finite]).max()) if finite.any() else 0.0
    text = Text()
    text.append(f"{a.name}  vs  {b.name}\n", style="bold")
    text.append(f"  max |a - b| {max_abs:.4g}   relative to max |b| {max_abs / scale if scale else 0.0:.4g}")
    text.append(f"   non-finite mismatches {int((np.isfinite(x) != np.isfinite(y)).sum())}")
    return text
