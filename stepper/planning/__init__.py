"""One plan of a run: the spec resolved (stepper.session.prepare), the auto choices made with their
reasons (the attention path, the prefill's chunks: stepper.planning.memory), the names it will emit
(stepper.planning.names), its patterns and patches checked against them, its memory estimated
against what the machine has, then executed.

`stepper run`, `stepper step`, `stepper diff` and the Python API (`stepper.run`, through
stepper.planning.record) all plan a run with `plan_run`, so the same request makes the same
choices, says the same reasons and is refused for the same causes wherever it is made. The
messages name the options as the caller spells them (`Wording`: `--only` or `keep=`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from stepper import session
from stepper.errors import StepperError
from stepper.planning import memory
from stepper.planning.names import check_patterns, planned_names
from stepper.seams.experiments import fitted
from stepper.seams.patching import Patcher, Patches, shown_only
from stepper.seams.trace import Sink, matches
from stepper.session import Plan, RunResult, RunSpec
from stepper.weights import audit, published_audit
from stepper.weights.checkpoint import Checkpoint
from stepper.weights.names import EMBED, named_on_disk
from stepper.weights.published import PublishedCheckpoint
from stepper.weights.source import WeightSource


@dataclass(frozen=True)
class Wording:
    """How the messages name the options: the command line's (`--only`) or the API's keywords."""

    keep: str = "--only"
    patch: str = "--patch"
    spell: session.Spell = session.command_line  # the session's checks: `--cache-len` or `cache_len=`
    options: dict[str, str] = field(default_factory=dict)  # an option the memory estimate names -> its name here


COMMAND_LINE = Wording()
Kept = Callable[[Plan, list[str]], list[str]]  # of a plan and its names, those a view keeps to the end (or looks at)


@dataclass(frozen=True)
class RunPlan:
    """A run planned: the session's plan as chosen, the names it will emit in execution order, and
    a line for each auto choice saying which and why."""

    plan: Plan
    names: list[str]
    said: tuple[str, ...] = ()
    wording: Wording = COMMAND_LINE
    long: str | None = None  # the line of `said` saying the run is long (long_line), to be said before it starts
    looked: list[str] | None = None  # the names a view looks at (None: every one), for the memory estimate

    def check(self, option: str, patterns: Sequence[str]) -> None:
        """Refuse a pattern of `option` that matches no name of the run."""
        check_patterns(option, patterns, self.names)

    def patcher(self, patches: Patches) -> list[Sink]:
        """The patches as a sink to go before the views (each must match a name of the run); none without them."""
        patches = fitted(patches, self.names, self.plan.config.name)  # a helper's forms this run has
        self.check(self.wording.patch, [pattern for pattern, _ in patches])
        for pattern, _ in patches:  # refused before it is made (4 GiB a KDA layer at 2,048 positions), not after
            if made_for_it := next((n for n in self.names if matches(n, [pattern]) and memory.on_demand(n)), None):
                raise StepperError(shown_only(pattern, made_for_it))
        return [Patcher(patches)] if patches else []

    def check_fits(self, kept: list[str], lower: str) -> None:
        """Refuse a run whose estimate (`kept`: the names a view keeps to the end, lowered by the
        option `lower`) is over the memory available, naming the option that lowers it."""
        needs = [replace(n, lower=self.wording.options.get(n.lower, n.lower))
                 for n in memory.needs(self.plan, kept, lower, self.looked)]
        memory.check_fits(needs, memory.available_bytes())

    def on(self, weights: WeightSource) -> RunPlan:
        """The same run, its choices made, on other weights of the same config (checked as the first were)."""
        return replace(self, plan=session.prepare(self.plan.spec, weights, self.wording.spell))

    def execute(self, sinks: Sequence[Sink]) -> RunResult:
        return session.execute(self.plan, sinks)


def plan_run(spec: RunSpec, kept: Kept = lambda plan, names: [], lower: str = "--prompt-len", chunk: int | None = 0,
             weights: WeightSource | None = None, wording: Wording = COMMAND_LINE,
             looked: Kept | None = None) -> RunPlan:
    """Resolve `spec` (raising StepperError on the first problem) and make its auto choices: the
    attention path (spec.attn "auto") and the prefill's chunks (`chunk`: positions per chunk as
    asked, 0 the whole prompt, None auto), by the run's estimate with the tensors `kept` keeps
    (`lower`: the option that lowers them) and those `looked` looks at (None: every one; a tensor
    made only when looked at counts only then) against the memory available; `weights`: in place
    of the spec's model."""
    def looked_names(plan: Plan, names: list[str]) -> list[str] | None:
        return None if looked is None else looked(plan, names)

    def estimate(plan: Plan) -> list[memory.Need]:
        names = planned_names(plan)
        return memory.needs(plan, kept(plan, names), lower, looked_names(plan, names))

    prepared = session.prepare(spec, weights, wording.spell)
    memory.limit_seeded(prepared, memory.available_bytes())
    plan, why = memory.choose_attn(prepared, estimate, memory.available_bytes(), wording.spell)
    plan, chunked = memory.choose_chunk(plan, estimate, memory.available_bytes(), chunk, wording.spell)
    names = planned_names(plan)
    long = long_line(plan, names, wording)
    notes = (why, chunked, long, unread_line(plan), stray_line(plan), unembedded_line(plan, wording))
    return RunPlan(plan, names, tuple(line for line in notes if line), wording, long, looked_names(plan, names))


LONG_RUN = 20_000  # named tensors from which a run is said to be long: tiny's 200 decode steps make 19,104, in 52 s


def long_line(plan: Plan, names: list[str], wording: Wording) -> str | None:
    """A note when the run makes LONG_RUN named tensors or more, counted, not timed: each is made
    (and looked at by the views) whatever the caller keeps, so the count bounds the run's work."""
    if len(names) < LONG_RUN:
        return None
    steps = plan.spec.decode + 1
    layers = len(plan.computed)
    return (f"note: a long run: it makes {len(names):,} named tensors ({steps:,} step{'s' if steps > 1 else ''} "
            f"through {layers} layer{'s' if layers > 1 else ''}), each of them whatever {wording.keep} keeps; "
            f"fewer {wording.spell('decode')} steps or layers make fewer")


def unembedded_line(plan: Plan, wording: Wording) -> str | None:
    """A note when a lone layer's prompt ids were given but it runs on seeded random vectors (the
    checkpoint has no embedding table): the ids then only count the positions (and route a hash-routed
    layer), which the header alone did not make plain."""
    if not plan.alone or plan.hidden is not None or plan.spec.ids is None or plan.weights.has(EMBED):
        return None
    return (f"note: this checkpoint has no embedding table, so layer {plan.spec.layer} runs on seeded random vectors "
            f"and {wording.spell('ids')} only sets their number; give {wording.spell('input', 'FILE')} (the hidden "
            "states of the layer before, dumped from a run) for real ones")


def stray_line(plan: Plan) -> str | None:
    """A note naming the .safetensors files beside a checkpoint's shards that no run reads (a
    consolidated copy, say), as `stepper inspect` names them."""
    return plan.weights.stray_note() if isinstance(plan.weights, Checkpoint) else None


def unread_line(plan: Plan) -> str | None:
    """A note naming the tensors of the run's layers that the config gives no use (a shared expert's
    where it says `n_shared_experts` 0, a misspelt name): the run goes on as the config says, without
    them, but says so. None for seeded weights, or when every tensor is read."""
    cfg, weights = plan.config, plan.weights
    run = plan.computed
    published = getattr(weights, "published", None)
    if isinstance(weights, Checkpoint):
        unknown = audit.unknown_by_layer(weights, run)
    elif isinstance(published, PublishedCheckpoint):
        unknown = published_audit.unknown_by_layer(published, run)
    else:
        return None
    if not unknown:
        return None
    layer, found = next(iter(unknown.items()))
    more = f", and in {len(unknown) - 1} more layer(s)" if len(unknown) > 1 else ""
    them = "it" if len(unknown) == 1 and len(found) == 1 else "them"
    line = (f"note: {audit.unknown_words(layer, found)}{more}: this run goes on without {them}, as config.json says "
            f"(stepper inspect lists {them})")
    return named_on_disk(cfg, line) if isinstance(weights, Checkpoint) else published.on_disk(line)
