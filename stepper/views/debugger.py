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
import io
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import IO, Any

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from stepper import catalog
from stepper.config import Config
from stepper.errors import StepperError
from stepper.seams.trace import Event, did_you_mean, matches
from stepper.tensors.tensor import held
from stepper.text import Tokens
from stepper.untrusted import cut, shown
from stepper.views import attention_map, histogram_picture, kda_state, routing_map, scale_grids
from stepper.views.debug_set import set_tensor
from stepper.views.explain import Reading, found_texts, looked_up
from stepper.views.family_pictures import drawn_pictures, pictures_of, undrawable
from stepper.views.sinks import (
    TensorRows,
    key_labels,
    line_width,
    print_fitted,
    print_picture,
    print_whole,
    print_wrapped,
    token_rows,
    wrap_fields,
)
from stepper.views.summary import number
from stepper.views.tree import BLOCKS, block_title, layer_kind
from stepper.views.v4_pictures import V4Pictures, choice_of, routing_picture
from stepper.weights.names import layer_prefix, layer_shapes, storage_dtype
from stepper.weights.source import WeightSource

PROMPT = "(stepper) "

HELP = (
    "n next (Enter) · c continue · b break GLOB · d delete [GLOB] · u until NAME · "
    "p print NAME[slice] [digits] · e explain [NAME] · w where · x compare A B · h history · "
    "s show {pictures} [NAME] · set NAME[slice] = VALUE · q quit · ? help · help CMD one command"
)
PICTURE_WORDS = "attention|routing|hist|scales"  # an MLA model's, when it has a router and FP8 weights
PICTURE_MORE = {  # what each picture of `s` draws, as help s tells it (an MLA or Kimi Linear model's)
    "attention": "the attention weights as heat maps per head (with DeepSeek-V3.2's indexer, which positions it "
                 "kept beside one head's weights)",
    "routing": "the router's token x expert map (at or after topk_weight)", "hist": "a histogram of a tensor",
    "scales": "an FP8 weight's block scales",
    "state": "a KDA layer's state per head, one head's heat map, each token's write and the decays (a slice such as "
             "self_attn.state_per_token[0, 1, 5] draws that head's state after token 5)",
}
V4_PICTURE_WORDS = "reach|hc|routing|hist"  # DeepSeek-V4 has none of MLA's attention tensors
PICTURE_ARGS = {"hist": " [NAME]", "scales": " WEIGHT", "state": " [NAME]", "reach": " [NAME]", "hc": " [NAME]"}
FAMILY_PICTURES = {  # what a picture of one family's tensors draws: asked of another model, it is refused
    "attention": "MLA's attention weights over positions (self_attn.attn_weights)",
    "state": "Kimi Linear's delta-rule state (self_attn.state)",
    "reach": "what a DeepSeek-V4 query attends (attn.chosen)",
    "hc": "how DeepSeek-V4's residual streams mix (hc_attn.comb)",
}
PICTURE_HINTS = {"reach": "what a query attends", "hc": "how the residual streams mix"}  # said with V4's own
V4_MODEL_TYPE = "deepseek_v4"


def print_help_line(console: Console, text: str = HELP.format(pictures=PICTURE_WORDS), style: str = "dim") -> None:
    """A one-line list of commands, wrapped between its items on a terminal."""
    items = [Text(item, style=style) for item in text.split(" · ")]
    console.print(wrap_fields(items, line_width(console), "", "", sep=" · "), soft_wrap=True)


def crumb(key: str) -> str:
    """A tensor's last breadcrumb, its name inside its block: `k_pe` for self_attn.k_pe, and
    `indexer.chosen` for attn.indexer.chosen, apart from attn.chosen (LongCat's subN. left out)."""
    parts = key.split(".")
    if parts[0].startswith("sub") and parts[0][3:].isdigit():
        parts = parts[1:]
    return ".".join(parts[1:]) or parts[0]


class Quit(Exception):
    """Raised through the model run to end it early."""


class CommandSource:
    """Command lines: a script first, then a terminal (with a prompt, line editing and history
    through Python's readline where it is present) or a pipe (each line echoed after its prompt).

    `before_input` runs before each line is read: the progress bars leave the screen, so a prompt
    or a question never shares its line with one.
    """

    def __init__(self, console: Console, stdin: IO[str], interactive: bool, script: list[str] | None = None,
                 before_input: Callable[[], None] | None = None):
        self.console = console
        self.stdin = stdin
        self.interactive = interactive
        self.script = list(script or [])
        self.before_input = before_input
        self.editing = interactive and line_editing() and console.file is sys.stdout and sys.stdout.isatty()

    def read(self) -> str | None:
        """The next command, or None at the end of input."""
        return self.ask(PROMPT)

    def ask(self, prompt: str) -> str | None:
        """The next line typed after `prompt` (a command, a prediction), or None at the end of input."""
        if self.before_input is not None:
            self.before_input()
        if self.script:
            return self._echo(self.script.pop(0), prompt)
        while self.interactive:
            try:
                return self._typed(prompt)
            except EOFError:
                return None
            except KeyboardInterrupt:  # at the prompt, as other debuggers: the line is dropped, the prompt comes again
                self.console.print("^C", highlight=False)  # the cursor is after what was typed: the message below it
                self.console.print(Text("(line dropped: q or Ctrl-D quits)", style="dim"))
        line = self.stdin.readline()
        return None if not line else self._echo(line.rstrip("\n"), prompt)

    def _typed(self, prompt: str) -> str:
        """A line typed at the terminal: with readline, input() draws the prompt itself, so that
        editing and history redraw the line correctly."""
        if not self.editing:
            return self.console.input(prompt)
        line = input(prompt)
        if self.console.record:  # the session's export shows the prompt and what was typed
            screen, self.console.file = self.console.file, io.StringIO()
            try:
                self._echo(line, prompt)
            finally:
                self.console.file = screen
        return line

    def _echo(self, line: str, prompt: str = PROMPT) -> str:
        self.console.print(Text(prompt, style="bold") + Text(shown(line)))
        return line


def line_editing() -> bool:
    """Whether input() edits lines and keeps a history (Python's readline module is present)."""
    try:
        import readline  # noqa: F401  (importing it is what turns editing on for input())
    except ImportError:
        return False
    return True


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
    replaced: np.ndarray | None = None  # what `set` made of the current tensor: the run continues from it
    tokens: Tokens | None = None  # with a text prompt: the texts that label token-indexed tensors
    read: Reading | None = None  # how e reads a query (views.explain.looked_up; None: the catalogue's names)

    def __post_init__(self) -> None:
        self.catalog = catalog.around(self.cfg)  # what a query about this model's tensors finds
        self.rows = TensorRows(self.console, self.cfg, self.tokens)
        self.stepping = not (self.breakpoints or self.until)
        self.v4 = self.cfg.model_type == V4_MODEL_TYPE  # DeepSeek-V4: other names, other pictures

    # -- the sink ----------------------------------------------------------------------------

    def __call__(self, event: Event) -> np.ndarray | None:
        self.history[event.name] = event
        self.current = event
        if not self.should_stop(event):
            self.skipped += 1
            return None
        self.show(event)
        self.repl()
        replaced, self.replaced = self.replaced, None
        return replaced

    def should_stop(self, event: Event) -> bool:
        if self.until is not None:
            if not matches(event.name, [self.until]):
                return False
            self.until = None
            return True
        return self.stepping or matches(event.name, self.breakpoints)

    def show(self, event: Event) -> None:
        if self.commands.before_input is not None:
            self.commands.before_input()  # no progress bar among the lines of a stop
        if self.skipped:
            self.console.print(passed(self.skipped), style="dim")
            self.skipped = 0
        print_wrapped(self.console, self.breadcrumb(event), style="bold magenta")
        self.console.print(self.rows.render(event), soft_wrap=True)
        if self.catalog.entry(event.key):
            print_wrapped(self.console, Text(self.catalog.description(event.name, self.cfg), style="italic"),
                          indent=4)
        if self.on_stop:
            self.on_stop(event)
        if self.stops == 0:
            print_help_line(self.console, self.help_line())
        self.stops += 1

    def breadcrumb(self, event: Event) -> str:
        parts = [] if event.phase is None else [event.phase]
        if event.layer is None:
            parts.append("model")
        else:
            parts.append(f"layer {event.layer} ({layer_kind(self.cfg, event.layer)})")
        entry = self.catalog.entry(event.key)
        block = block_title(self.cfg, event.layer, entry["block"]) if entry else None
        if block and block != parts[-1]:
            parts.append(block)
        parts.append(event.key if block == BLOCKS["router"] else crumb(event.key))
        return " › ".join(parts)

    # -- commands ----------------------------------------------------------------------------

    def repl(self) -> None:
        while True:
            line = self.commands.read()
            if line is None:
                said = "Ctrl-D" if self.commands.interactive else "end of commands"
                self.console.print(f"({said}: quitting)", style="dim")
                raise Quit
            try:
                if self.execute(line):
                    return
            except StepperError as e:
                self.error(e)

    def error(self, e: StepperError) -> None:
        """A command's problem, in red; the session goes on."""
        print_fitted(self.console, Text(shown(e, lines=True), style="red"))

    def execute(self, line: str) -> bool:
        """Run one command; True when the run should resume."""
        word, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        command = COMMANDS.get(word)
        if command is None:
            print_fitted(self.console, Text(f"unknown command '{shown(word)}'", style="red"))
            print_help_line(self.console, self.help_line())
            return False
        return bool(command.run(self, rest))

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
        print_fitted(self.console, f"breakpoints: {shown(', '.join(self.breakpoints) or 'none')}")

    def cmd_until(self, arg: str) -> bool:
        if not arg:
            raise StepperError(f"until needs a name or glob, e.g. {self.example('u')}")
        if self.names is not None and not any(matches(n, [arg]) for n in self.names if n not in self.history):
            self.check_matches("u", arg)
            raise StepperError(f"u {arg}: every tensor it matches has passed (h lists them)")
        self.until = arg
        return True

    def check_matches(self, command: str, pattern: str) -> None:
        """A pattern must match a name of the run (when the run's names are known), or it would do nothing."""
        if self.names is not None and not any(matches(name, [pattern]) for name in self.names):
            near = did_you_mean(pattern, self.names)
            raise StepperError(f"{command} {cut(pattern)}: matches no tensor of this run{near}")

    def cmd_print(self, arg: str) -> None:
        target, digits = split_digits(arg)
        name, index = split_index(target)
        event = self.resolve(name)
        if index is None and not (held(event.array) or event.array.small):
            raise StepperError(f"{event.name} {list(event.array.shape)} is made a tile at a time, never held: "
                               f"print a slice of it, e.g. p {name or event.key}[0, 0, 0, :8]")
        array = np.asarray(take(event.array, index))
        shape = "x".join(map(str, np.shape(array))) or "scalar"
        print_fitted(self.console, f"{event.name}{index or ''}  [{shape}]  {array.dtype}", style="bold")
        text = np.array2string(array, precision=digits, max_line_width=max(40, self.console.width),
                               threshold=256, edgeitems=4, floatmode="fixed" if digits is not None else "maxprec")
        lines = text.split("\n")
        if len(lines) > PRINTED_LINES:  # NumPy elides only axes longer than 8: a [1, 4, 7, 32, 32] is 500 lines
            text = "\n".join(lines[:PRINTED_LINES])
        self.console.print(text, highlight=False, soft_wrap=True)
        if len(lines) > PRINTED_LINES:
            leading = ", ".join(["0"] * max(1, np.ndim(array) - 2))
            print_fitted(self.console, Text(f"... {len(lines) - PRINTED_LINES} more lines: print a slice, e.g. "
                                            f"p {target}[{leading}]" if index is None else
                                            f"... {len(lines) - PRINTED_LINES} more lines: print a smaller slice",
                                            style="dim"))
        if self.tokens is not None:
            self.print_tokens(event, index)

    def print_tokens(self, event: Event, index: str | None) -> None:
        """Which tokens a printed tensor's (or slice's) token axes hold: its positions T or tokens N
        (the step's own) or its attended positions S (every token so far)."""
        dims = self.catalog.dims(event.key, event.array.shape, self.cfg, event.layer)
        for axis, dim in enumerate(dims):
            if dim.symbol not in ("T", "N", "S"):
                continue
            steps = range(dim.size) if dim.symbol == "S" else self.tokens.of_step(event.phase, dim.size)
            grid = np.broadcast_to(np.arange(dim.size).reshape([-1 if a == axis else 1 for a in range(len(dims))]),
                                   event.array.shape)
            kept = np.unique(take(grid, index)) if index else range(dim.size)
            labels = self.tokens.numbered([steps[int(i)] for i in kept])
            labels = labels if len(labels) <= 24 else [*labels[:16], f"… {len(labels) - 20} more …", *labels[-4:]]
            print_fitted(self.console, Text(f"{dim.symbol} ({dim.label}): " + " · ".join(labels), style="dim"))

    def cmd_explain(self, arg: str) -> None:
        name = self.resolve(arg).name if not arg or self._seen(arg) else arg  # whole: a LongCat sublayer's sub0.
        for text in found_texts(looked_up(self.cfg, name, self.read)):  # as `stepper explain` shows it
            print_fitted(self.console, text)

    def cmd_where(self, _: str) -> None:
        print_whole(self.console, self.where_tree())  # on a terminal its labels wrap at words

    def cmd_compare(self, arg: str) -> None:
        targets = split_args(arg)
        if len(targets) != 2:
            raise StepperError(f"compare takes two tensors or slices: x A B, e.g. {self.example('x')}")
        (label_a, a), (label_b, b) = (self.sliced(target) for target in targets)
        self.console.print(compare_text(label_a, a, label_b, b, line_width(self.console)), soft_wrap=True)

    def sliced(self, target: str) -> tuple[str, np.ndarray]:
        """'kv_a[..., :128]' -> ('layers.0.self_attn.kv_a[..., :128]', that slice of the tensor)."""
        name, index = split_index(target)
        event = self.resolve(name)
        if index is None and not (held(event.array) or event.array.small):
            raise StepperError(f"{event.name} {list(event.array.shape)} is made a tile at a time, never held: "
                               f"compare a slice of it, e.g. {name or event.key}[0, 0, 0, :8]")
        return event.name + (index or ""), np.asarray(take(event.array, index))

    def cmd_history(self, arg: str) -> None:
        events = list(self.history.values())
        if arg and not (arg.isdigit() and int(arg) > 0):
            raise StepperError(f"h {arg}: h N lists the latest N tensors (h alone: 20), e.g. h 50")
        count = int(arg) if arg else 20
        for event in events[-count:]:
            self.console.print(f"  {event.name}  {list(event.array.shape)}", highlight=False)
        if len(events) > count:
            self.console.print(f"  ({len(events) - count} earlier; h N shows more)", style="dim")

    def told(self, command: Command) -> Command:
        """A command as its help tells it for this model: its examples in the names the model emits
        (at_its_layers), s with the pictures the model draws."""
        return self.at_its_layers(self.in_its_names(command))

    def in_its_names(self, command: Command) -> Command:
        """A command's examples in the names of this model's family, s with the pictures it draws."""
        if self.v4:
            return replace(command, **V4_HELP.get(command.names[0], {}))
        if command.names[0] == "x":  # the latent is kv_a's first kv_lora_rank columns
            return replace(command, examples=(f"x compressed_kv kv_a[..., :{self.cfg.kv_lora_rank}]",
                                              *command.examples[1:]))
        if command.names[0] != "s":
            return command
        own, weight = self.picture_words().split("|"), self.fp8_weight()
        named = {"hist": " self_attn.kv", "scales": f" {weight}"}  # an example's tensor or weight
        return replace(command, what="draw a picture: " + " or ".join([", ".join(own[:-1]), own[-1]]),
                       more="; ".join(f"{word}: {PICTURE_MORE[word]}" for word in own) + ".",
                       examples=tuple(f"s {word}" + named.get(word, "") for word in own if word != "scales" or weight))

    def at_its_layers(self, command: Command) -> Command:
        """A command whose examples name layer 2 and the router's choice, at a layer this model has
        (its last, with fewer than three) and, where it has no router, at its attention's latent."""
        layer, routed = min(2, self.cfg.num_hidden_layers - 1), "routing" in drawn_pictures(self.cfg)

        def fitted(example: str) -> str:
            example = example.replace("layers.2.", f"layers.{layer}.")
            return example if routed else example.replace("mlp.gate.topk_idx", "self_attn.compressed_kv")

        return replace(command, examples=tuple(fitted(example) for example in command.examples))

    def example(self, word: str) -> str:
        """The first example of a command, in this model's names: what a refusal points at."""
        return self.told(COMMANDS[word]).examples[0]

    def fp8_weight(self) -> str | None:
        """The first weight of the current layer (or layer 0) stored in FP8, named within its layer."""
        layer = self.current.layer if self.current and self.current.layer is not None else 0
        names = [name for name in layer_shapes(self.cfg, layer) if storage_dtype(self.cfg, name) == "F8_E4M3"]
        return names[0].removeprefix(layer_prefix(layer)) if names else None

    def help_line(self) -> str:
        """The commands in one line, with the pictures this model has."""
        return HELP.format(pictures=self.picture_words())

    def picture_words(self) -> str:
        """The pictures this model's tensors make, as the help lists them."""
        return V4_PICTURE_WORDS if self.v4 else "|".join(drawn_pictures(self.cfg))  # as run --show takes them

    def cmd_show(self, arg: str) -> None:
        what, _, name = arg.partition(" ")
        pictures_ = {"attention": self.show_attention, "routing": self.show_routing, "hist": self.show_histogram,
                     "scales": self.show_scales, "state": self.show_state, "reach": self.show_reach, "hc": self.show_hc}
        if what not in pictures_:
            raise StepperError("show what? " + " | ".join(f"s {word}" + PICTURE_ARGS.get(word, "")
                                                          for word in self.picture_words().split("|")))
        own = self.picture_words().split("|")
        if what not in own and what in pictures_of(self.cfg):  # its family's, but the model has nothing it draws
            raise StepperError(f"s {what}: {undrawable(what, self.cfg)}")
        if what in FAMILY_PICTURES and what not in own:
            whose = "DeepSeek-V4" if self.v4 else "this model"
            listed = ", ".join(f"s {word}" + (f" ({PICTURE_HINTS[word]})" if word in PICTURE_HINTS else "")
                               for word in own)
            raise StepperError(f"s {what} draws {FAMILY_PICTURES[what]}, a tensor {whose} does not emit: "
                               f"its pictures are {listed}")
        pictures_[what](name.strip())

    def cmd_quit(self, _: str) -> None:
        raise Quit

    def cmd_help(self, arg: str) -> None:
        if not arg:
            self.console.print("commands (the letter or the word; help CMD tells more of one):", style="bold")
            grid = Table.grid(padding=(0, 2))
            grid.add_column(no_wrap=True)
            grid.add_column()
            for command in map(self.told, TABLE):
                example = next((e for e in command.examples if e not in command.names), None)
                grid.add_row(Text("  ") + usage_text(command),
                             Text(command.what) + (Text(f"\ne.g. {example}", style="dim") if example else Text()))
            self.console.print(grid, soft_wrap=False)
            return
        command = COMMANDS.get(arg.strip())
        if command is None:
            raise StepperError(f"no command '{arg.strip()}' (? lists them)")
        command = self.told(command)
        self.console.print(usage_text(command), soft_wrap=True)
        print_wrapped(self.console, command.what + ". " + command.more, indent=2)
        for example in command.examples:
            self.console.print(Text("  e.g. ", style="dim") + Text(example, style="bold"), soft_wrap=True)

    # -- pictures ----------------------------------------------------------------------------

    def show_attention(self, name: str) -> None:
        key = catalog.key_of(self.current.key) if self.current is not None else ""  # LongCat's sub0. left out
        at_indexer = not name and key.startswith("self_attn.indexer.")
        if at_indexer and not self._seen(self.current.name.replace(key, "self_attn.attn_weights")):
            raise StepperError("s attention draws this layer's attention weights beside the indexer's choice; "
                               "they come after the indexer: u attn_weights, then s attention")
        event = self.resolve(name or "self_attn.attn_weights")
        if catalog.key_of(event.key) != "self_attn.attn_weights":  # LongCat's sub0./sub1. left out
            raise StepperError(f"s attention draws attention weights (self_attn.attn_weights, each row summing to "
                               f"1), not {event.name}: s hist {name} draws any tensor's values")
        print_picture(self.console, attention_map.attention_heatmap(event.array, title=event.name,
                                                               token_labels=key_labels(self.tokens, event.array)))
        mask = self.history.get(event.name.replace("self_attn.attn_weights", "self_attn.indexer.mask"))
        if mask is not None and mask.array.shape[1:] == event.array.shape[2:]:
            picture = attention_map.indexer_map(mask.array, event.array, title=event.name + " · indexer")
            print_picture(self.console, picture)

    def show_routing(self, name: str) -> None:
        if self.v4:
            return self.show_v4_routing(name)
        idx = self.resolve(name or "mlp.gate.topk_idx")
        if not self._seen(idx.name.replace("topk_idx", "topk_weight")):
            raise StepperError(f"s routing draws {idx.name} with its topk_weight, which comes next: n, then s routing")
        weight = self.resolve(idx.name.replace("topk_idx", "topk_weight"))
        later = (f" (the latest router seen; {self.current.phase}'s comes later in its step)"
                 if not name and self.current is not None and self.current.phase != idx.phase else "")
        print_fitted(self.console, Text(f"{idx.name} · {weight.key}{later}", style="bold"))
        rows = token_rows(self.tokens, idx.phase, len(idx.array))
        print_picture(self.console, routing_map.routing_map(idx.array, weight.array, self.cfg.router_experts, rows,
                                                              self.cfg.zero_experts))

    def show_v4_routing(self, name: str) -> None:
        """A DeepSeek-V4 layer's router choice (hash_idx or topk_idx) with its weights: at a router
        tensor, its layer's; else the one NAME names, or the latest seen."""
        at_router = not name and self.current is not None and self.current.key.startswith("ffn.gate.")
        event = self.current if at_router else self.resolve(name or "ffn.gate.weights")
        if not event.key.startswith("ffn.gate.") or event.layer is None:
            raise StepperError(f"s routing draws a DeepSeek-V4 layer's router choice (ffn.gate.hash_idx or topk_idx "
                               f"with ffn.gate.weights), not {event.name}")
        scope = event.name.removesuffix(event.key)
        keys = (choice_of(self.cfg, event.layer), "ffn.gate.weights")
        chosen, weights = (self.history.get(scope + key) for key in keys)
        if chosen is None or weights is None:
            raise StepperError(f"s routing draws {scope}ffn.gate.weights with the experts they weigh, not seen yet: "
                               "u ffn.gate.weights, then s routing")
        rows = token_rows(self.tokens, weights.phase, len(weights.array))
        print_picture(self.console, routing_picture(chosen.name, chosen.array, weights.array,
                                                    self.cfg.router_experts, rows))

    def show_histogram(self, name: str) -> None:
        event = self.resolve(name)
        print_picture(self.console, histogram_picture.histogram(event.array, title=event.name))

    def show_state(self, name: str) -> None:
        """A KDA layer's state (self_attn.state, or a slice of state_per_token / state_per_chunk),
        with the layer's writes and decays when they were seen (views.kda_state)."""
        target, index = split_index(name)
        event = self.resolve(target or "self_attn.state")
        extra = [self.history.get(event.name.replace(event.key, key))
                 for key in ("self_attn.delta", "self_attn.forget_gate")]
        try:
            drawn = kda_state.state_pictures(take(event.array, index), event.name + (index or ""),
                                             *(None if e is None else e.array for e in extra))
        except ValueError as e:
            raise StepperError(str(e)) from None
        for picture in drawn:
            print_picture(self.console, picture)

    def show_reach(self, name: str) -> None:
        """What a DeepSeek-V4 layer's last query attends: its window, the entries kept and dropped."""
        event = self.resolve(name or "attn.chosen")
        if event.key != "attn.chosen":
            raise StepperError(f"s reach draws a DeepSeek-V4 layer's attn.chosen, not {event.name}")
        V4Pictures(self.console, self.cfg, {"reach"}, self.prompt_length(event, "reach"))(event)

    def prompt_length(self, event: Event, picture: str) -> int:
        """The prompt's length, from the prefill's tensor of the event's name (its positions 0..T-1)."""
        prefill = self.history.get(event.name.replace(f"{event.phase}.", "prefill.", 1)) if event.phase else event
        if prefill is None:
            raise StepperError(f"s {picture} needs the prefill's {event.key} of this layer, not seen in this run")
        return prefill.array.shape[1]

    def show_hc(self, name: str) -> None:
        """A DeepSeek-V4 hyper-connection's comb matrix at the last position, with its pre and post
        weights and the streams it mixes."""
        event = self.resolve(name or "hc_attn.comb")
        if event.key not in ("hc_attn.comb", "hc_ffn.comb"):
            raise StepperError(f"s hc draws a DeepSeek-V4 layer's hc_attn.comb or hc_ffn.comb, not {event.name}")
        drawer = V4Pictures(self.console, self.cfg, {"hc"}, self.prompt_length(event, "hc"))
        scope = event.name.removesuffix(event.key)
        site = event.key.removesuffix(".comb")
        for key in ("streams", "attn_streams", f"{site}.pre", f"{site}.post"):  # what the picture draws beside comb
            if scope + key in self.history:
                drawer(self.history[scope + key])
        drawer(event)

    def show_scales(self, name: str) -> None:
        if self.v4:
            raise StepperError("s scales draws an MLA checkpoint's FP8 block scales; a DeepSeek-V4 weight's FP8 block "
                               "or FP4 group: stepper fp8 --weight NAME --model MODEL")
        if self.weights is None or not hasattr(self.weights, "stored"):
            raise StepperError("no stored weights to show scales of in this run")
        if not name:
            weight = self.fp8_weight()
            raise StepperError("s scales needs a weight" + (f", e.g. s scales {weight}" if weight else
                                                            " stored in FP8 (none in this layer)"))
        layer = self.current.layer if self.current and self.current.layer is not None else 0
        full = name if name.startswith(("model.", "lm_head")) else layer_prefix(layer) + name
        stored = self.weights.stored(full)
        if stored.scale_inv is None:
            raise StepperError(f"'{full}' is stored as {stored.dtype}: only F8_E4M3 weights have block scales")
        print_picture(self.console, scale_grids.scale_grid(np.asarray(stored.scale_inv, dtype=np.float32), title=full))

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
        if self.names is not None and not self.emits(name):
            raise StepperError(f"no tensor '{cut(name)}' in this run{did_you_mean(name, self.names)} (h lists those "
                               "seen)")
        raise StepperError(f"no tensor '{cut(name)}' seen yet (h lists them)")

    def emits(self, name: str) -> bool:
        """Whether the run emits a tensor of this name (or glob), as far as is known (True if not)."""
        return self.names is None or any(matches(n, [name]) or n.endswith("." + name) for n in self.names)

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
        if event is None or event.layer is None:  # the model's own tensors (embed, rope, norm, logits) seen so far
            tree = Tree("model")
            for e in self.history.values():
                if e is event:
                    tree.add(Text(f"▶ {e.name}", style="bold yellow"))
                elif e.layer is None and (event is None or e.phase == event.phase):
                    tree.add(Text(f"✓ {e.name}", style="green"))
            return tree
        seen = {e.key for e in self.history.values() if e.layer == event.layer and e.phase == event.phase}
        kind = layer_kind(self.cfg, event.layer)
        root = Tree(Text(f"{event.phase + ' · ' if event.phase else ''}layer {event.layer} ({kind})", style="bold"))
        branch, current = root, None
        fp8 = any(n.endswith("indexer.q_rotated") for n in self.names or ())  # the run scores its indexer in FP8
        attn = "absorb" if "q_nope_absorbed" in str(seen) else "naive"
        for entry in self.catalog.layer_sequence(self.cfg, event.layer, attn, "fp8" if fp8 else "exact"):
            block = block_title(self.cfg, event.layer, entry["block"])
            if block != current:  # consecutive tensors of one block share a branch, in execution order
                branch, current = root.add(block), block
            key = entry["name"]
            if key == event.key:
                branch.add(Text(f"▶ {key}  {self.catalog.description(key, self.cfg)}", style="bold yellow"))
            elif key in seen:
                branch.add(Text(f"✓ {key}", style="green"))
            else:
                branch.add(Text(f"· {key}", style="dim"))
        return root


@dataclass(frozen=True)
class Command:
    """One debugger command: its names, how it is written, what it does, and examples."""

    names: tuple[str, ...]
    usage: str
    what: str
    more: str
    examples: tuple[str, ...]
    run: Callable[[Debugger, str], Any]


TABLE = (
    Command(("n", "next", ""), "n, Enter", "stop at the next tensor",
            "Stepping goes on one named tensor at a time, in execution order.", ("n",), Debugger.cmd_next),
    Command(("c", "continue"), "c", "run on to the next breakpoint",
            "With no breakpoint left, the run goes to its end.", ("c",), Debugger.cmd_continue),
    Command(("b", "break"), "b [GLOB]", "add a breakpoint at every tensor matching GLOB; b alone lists them",
            "A glob matches a full name or its dotted tail, so k_pe stops at every layer's self_attn.k_pe.",
            ("b mlp.gate.topk_idx", "b layers.2.*"), Debugger.cmd_break),
    Command(("d", "delete"), "d [GLOB]", "delete the breakpoint GLOB; d alone deletes them all",
            "The glob is written as it was given to b.", ("d mlp.gate.topk_idx", "d"), Debugger.cmd_delete),
    Command(("u", "until"), "u NAME", "run until the next tensor matching NAME and stop there",
            "Breakpoints are not stopped at on the way.", ("u attn_weights", "u layers.2.output"), Debugger.cmd_until),
    Command(("p", "print"), "p [NAME][slice] [digits]", "print a tensor seen so far, or a NumPy-style slice of it",
            "NAME may be short (self_attn.k_pe means the current layer's); a trailing number gives the digits "
            "after the point. p alone prints the current tensor.",
            ("p self_attn.k_pe[0, 0, :2, :4] 3", "p attn_weights[0, 1, -1]"), Debugger.cmd_print),
    Command(("e", "explain"), "e [NAME]", "explain a tensor: catalogue text, formula, where stepper emits it, "
            "the reference source lines", "e alone explains the current tensor.",
            ("e", "e self_attn.k_pe_rope"), Debugger.cmd_explain),
    Command(("w", "where"), "w", "where the run is: the layer's tensors, done, current and to come",
            "The tree follows the layer's execution order.", ("w",), Debugger.cmd_where),
    Command(("x", "compare"), "x A B", "compare two tensors or slices of the same shape",
            "Prints the largest absolute difference, the largest |b|, their ratio, and how many entries differ.",
            ("x compressed_kv kv_a[..., :128]", "x attn_residual hidden_states"),
            Debugger.cmd_compare),
    Command(("h", "history"), "h [N]", "list the last N tensors seen (20 by default)",
            "Every tensor seen stays printable with p.", ("h", "h 100"), Debugger.cmd_history),
    Command(("s", "show"), "s PICTURE [NAME]", "draw a picture: attention, routing, hist or scales",
            "; ".join(f"{word}: {PICTURE_MORE[word]}" for word in PICTURE_WORDS.split("|")) + ".",
            ("s attention", "s routing", "s hist self_attn.kv", "s scales self_attn.kv_a_proj_with_mqa.weight"),
            Debugger.cmd_show),
    Command(("set",), "set NAME[slice] = VALUE", "change the current tensor (or a slice of it) before the run goes on",
            "NAME is the current tensor's name, short or full, or left out; VALUE a number, or arithmetic of x, the "
            "tensor as it was, with numbers (x*0.5, x[0, 1] + 1e-3). Everything computed after this stop is "
            "computed from the changed tensor.", ("set attn_weights[0, 0, -1] = 0", "set [..., 3] = x*2"), set_tensor),
    Command(("q", "quit"), "q", "end the run", "Nothing is written but an --export.", ("q",), Debugger.cmd_quit),
    Command(("?", "help"), "?, help [CMD]", "list the commands, or tell more of one",
            "CMD is the letter or the word.", ("?", "help x"), Debugger.cmd_help),
)
COMMANDS: dict[str, Command] = {name: command for command in TABLE for name in command.names}
V4_HELP = {  # what a command's help says in the names and pictures of a DeepSeek-V4 run (TABLE's are MLA's)
    "b": {"examples": ("b ffn.gate.topk_idx", "b layers.2.*"),
          "more": "A glob matches a full name or its dotted tail, so kv_rope stops at every layer's attn.kv_rope."},
    "d": {"examples": ("d ffn.gate.topk_idx", "d")},
    "u": {"examples": ("u attn.weights", "u layers.2.ffn_streams")},
    "p": {"examples": ("p attn.kv[0, :2, :4] 3", "p attn.weights[0, 1, -1]"),
          "more": "NAME may be short (attn.kv means the current layer's); a trailing number gives the digits after "
                  "the point. p alone prints the current tensor."},
    "e": {"examples": ("e", "e attn.kv_rope")},
    "x": {"examples": ("x attn.kv attn.kv_rope", "x attn_streams streams")},
    "s": {"what": "draw a picture: reach, hc, routing or hist",
          "more": "reach: what a layer's last query attends (window, entries kept and dropped); hc: a "
                  "hyper-connection's comb matrix with its pre and post weights; routing: a layer's router choice "
                  "as a token x expert map, by a hash of the token or by score (at or after ffn.gate.weights); "
                  "hist: a histogram of a tensor.",
          "examples": ("s reach", "s hc", "s routing", "s hist attn.kv")},
    "set": {"examples": ("set attn.weights[0, 0, -1] = 0", "set [..., 3] = x*2")},
}


def usage_text(command: Command) -> Text:
    words = [n for n in command.names if len(n) > 1]
    return Text(command.usage, style="bold") + Text(f" ({', '.join(words)})" if words else "", style="dim")


def passed(n: int) -> str:
    return f"({n} tensor{'s' if n != 1 else ''} passed)"


# ---------------------------------------------------------------------------------------------
# Helpers that read like the commands they serve


MAX_DIGITS = 16  # past float64's; a float32 holds about 9
PRINTED_LINES = 60  # the most of an array `p` prints; a slice shows the rest


def split_digits(arg: str) -> tuple[str, int | None]:
    """'k_pe[0, :4] 6' -> ('k_pe[0, :4]', 6): a trailing integer after the closing bracket is the
    number of digits shown, 0 to MAX_DIGITS."""
    head, _, tail = arg.rpartition(" ")
    if head and tail.lstrip("-").isdigit() and (head.rstrip().endswith("]") or "[" not in head):
        digits = int(tail) if len(tail) <= 3 else MAX_DIGITS + 1
        if not 0 <= digits <= MAX_DIGITS:
            raise StepperError(f"p NAME DIGITS: digits after the point must be 0 to {MAX_DIGITS}, got {tail}")
        return head.strip(), digits
    return arg.strip(), None


def split_index(text: str) -> tuple[str, str | None]:
    """'self_attn.k_pe[0,0,:, :8]' -> ('self_attn.k_pe', '[0,0,:, :8]')."""
    if "[" not in text:
        return text, None
    name, _, rest = text.partition("[")
    if not rest.endswith("]"):
        raise StepperError(f"bad slice '{cut(text)}': expected NAME[i, a:b, ...]")
    return name.strip(), "[" + rest


def take(array: np.ndarray, index: str | None) -> np.ndarray:
    """array[index] for a NumPy-style index written as text, parsed safely (ints, slices, ...);
    brackets in a row (`[0][1:3]`) each taken in turn, as NumPy takes them."""
    if index is None:
        return array
    shape = list(array.shape)
    try:
        node = ast.parse("x" + index, mode="eval").body
        keys = []
        while isinstance(node, ast.Subscript):
            keys.insert(0, _index_value(node.slice))
            node = node.value
        if not (isinstance(node, ast.Name) and keys):
            raise ValueError("expected NAME[i, a:b, ...]")
        for key in keys:
            array = array[key]
        return array
    except (SyntaxError, ValueError, IndexError, TypeError) as e:
        raise StepperError(f"bad slice {cut(index)} for shape {shape}: {e}") from None


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


def split_args(text: str) -> list[str]:
    """'k_pe kv_a[..., :128]' -> ['k_pe', 'kv_a[..., :128]']: split at spaces outside brackets."""
    args, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char.isspace() and depth == 0:
            args, current = args + [current] if current else args, ""
        else:
            current += char
    return args + [current] if current else args


def compare_text(label_a: str, a: np.ndarray, label_b: str, b: np.ndarray, width: int | None = None) -> Text:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape:
        raise StepperError(f"cannot compare shapes {list(x.shape)} and {list(y.shape)}: "
                           "slice one to the other's shape, e.g. x A B[..., :128]")
    finite = np.isfinite(x) & np.isfinite(y)
    diff = np.abs(x - y)[finite]
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(y[finite]).max()) if finite.any() else 0.0
    relative = number(max_abs / scale) if scale else "undefined (b is all 0)"
    text = wrap_fields([Text(f"a = {shown(label_a)}", style="bold"), Text(f"{list(x.shape)}", style="dim")],
                       width, "", "    ")
    text.append("\n")
    text.append(wrap_fields([Text(f"b = {shown(label_b)}", style="bold")], width, "", "    "))
    text.append("\n")
    fields = [f"max |a - b| = {number(max_abs)}", f"max |b| = {number(scale)}",
              f"max |a - b| / max |b| = {relative}", f"entries that differ: {int((diff > 0).sum())} of {x.size}",
              f"non-finite in one only: {int((np.isfinite(x) != np.isfinite(y)).sum())}"]
    text.append(wrap_fields([Text(f) for f in fields], width, "  ", "  ", sep=" · "))
    return text
