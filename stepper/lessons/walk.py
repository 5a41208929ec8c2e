"""Walking a lesson: its run stepped through with the debugger, stopping at the lesson's steps.

Walking runs the interpreter with a `LessonDebugger` sink that stops at each step's tensor, asks
the step's predictions before showing it (judged by `stepper.lessons.judge`), shows it with the
debugger's view, explains it with text filled in from the run's real tensors
(`stepper.lessons.templates`), then hands over to the debugger's prompt until the learner moves on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.console import Console
from rich.text import Text

from stepper.errors import StepperError
from stepper.lessons.context import Context
from stepper.lessons.judge import expected_value, judge, show_answer
from stepper.lessons.prose import fitted, indented, join_lines, say, styled
from stepper.lessons.reading import FORMS
from stepper.lessons.schema import LESSON_FILE, Lesson, Prediction, Step
from stepper.lessons.templates import render
from stepper.planning import RunPlan, plan_run
from stepper.seams.trace import Event, Recorder
from stepper.session import Plan
from stepper.untrusted import cut, shown
from stepper.views.debugger import (
    COMMANDS,
    CommandSource,
    Debugger,
    Quit,
    passed,
    print_help_line,
)
from stepper.views.sinks import titled_rule

ANSWER_PROMPT = "your prediction> "
LESSON_HELP = "Enter: next stop · n: next tensor · p NAME[i] · e explain · s {pictures} · w where · q quit"


@dataclass
class LessonDebugger(Debugger):
    """The step debugger, stopping at a lesson's steps to ask, show and explain."""

    lesson: Lesson | None = None
    plan: Plan | None = None
    step_index: int = 0
    first_try: int = 0  # predictions right at the first readable answer
    retried: int = 0  # right on a later try
    asked: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.stepping = False
        self.stops = 1  # the lesson prints its own help line

    def __call__(self, event: Event) -> None:
        self.history[event.name] = event
        self.current = event
        steps = self.lesson.steps
        if self.step_index < len(steps) and event.name == steps[self.step_index].stop:
            self.step_index += 1
            self.teach(steps[self.step_index - 1], event)
            self.repl()
        elif self.should_stop(event):
            self.show(event)
            self.repl()
        else:
            self.skipped += 1

    def execute(self, line: str) -> bool:
        if line.strip() in ("", "c", "continue"):
            self.stepping = False
            return True
        if re.match(r"\s*[-+\[({]?\s*\d", line):  # an answer typed after the question was answered
            self.console.print(Text("that looks like an answer, but this stop's predictions are done: "
                                    "Enter goes on to the next stop, ? lists the commands", style="yellow"),
                               soft_wrap=False)
            return False
        return super().execute(line)

    def context(self) -> Context:
        return Context(self.plan, {name: e.array for name, e in self.history.items()})

    def say(self, text: str, ctx: Context, style: str | None = None) -> None:
        say(self.console, text, ctx, style)

    def teach(self, step: Step, event: Event) -> None:
        if self.skipped:
            self.console.print(passed(self.skipped), style="dim")
            self.skipped = 0
        ctx = self.context()
        n = len(self.lesson.steps)
        titled_rule(self.console, f"step {self.step_index}/{n} · {self.breadcrumb(event)}", "magenta")
        self.say(step.text, ctx)
        for pred in step.predict:
            self.predict(pred, ctx, event.key)
        self.console.print(self.breadcrumb(event), style="bold magenta")
        self.console.print(self.rows.render(event), soft_wrap=True)
        if self.catalog.entry(event.key):
            indented(self.console, self.catalog.description(event.name, self.cfg), "italic")
        self.say(step.explain, ctx)
        for command in step.commands:
            self.console.print(Text("(stepper) ", style="dim") + Text(shown(command), style="dim"))
            try:
                super().execute(command)
            except StepperError as e:
                self.error(e)
        print_help_line(self.console, LESSON_HELP.format(pictures=self.picture_words()))

    def predict(self, pred: Prediction, ctx: Context, stop_key: str) -> None:
        expected = expected_value(pred, ctx)
        question = render(join_lines(pred.question), ctx)
        if pred.kind == "choice":
            question += "\n" + "   ".join(f"{chr(ord('a') + i)}) {o}" for i, o in enumerate(pred.options))
        self.console.print(styled(fitted(self.console, "predict: " + question), "bold yellow"), soft_wrap=True)
        self.asked += 1
        tries = unreadable = 0
        while True:
            line = self.commands.ask(ANSWER_PROMPT)
            if line is None and self.commands.interactive:  # Ctrl-D quits here too, as at the stop's prompt
                self.console.print("(Ctrl-D: quitting)", style="dim")
                raise Quit
            if line is not None and line.strip().lower() in ("q", "quit"):
                raise Quit
            if line is not None and line.strip() in ("?", "help"):
                self.console.print(f"{FORMS[pred.kind]}; Enter shows the answer, q quits the lesson", style="dim",
                                   soft_wrap=False)
                continue
            if line is None or line.strip() in ("", "skip"):
                break
            verdict = judge(pred, line, ctx, stop_key)
            if typed_command(line, pred, verdict.readable):  # not an answer, and not counted as a try
                self.console.print(Text("that is a debugger command: a stop's commands come after its predictions; "
                                        "answer, or press Enter to see the answer", style="yellow"), soft_wrap=False)
                continue
            if verdict.right:
                if tries == 0:
                    self.first_try += 1
                else:
                    self.retried += 1
                self.console.print(f"✓ right: {shown(show_answer(pred, expected))}", style="bold green")
                return
            self.console.print(styled(fitted(self.console, f"✗ {verdict.why}"), "red"), soft_wrap=True)
            tries += verdict.readable
            unreadable += not verdict.readable
            if tries >= 2 or unreadable >= 3:
                break
            self.console.print("try again, or press Enter to see the answer", style="dim")
        self.console.print(f"→ the answer: {shown(show_answer(pred, expected))}", style="bold")



def typed_command(line: str, pred: Prediction, readable: bool) -> bool:
    """Whether an answer is a debugger command (`p k_pe`, `s hist kv_a`): a command's word that is
    no answer, or is followed by a name where the answer is numbers (`x kv_a[0]` reads as [0])."""
    word, *rest = line.split()
    return word in COMMANDS and (not readable or (pred.kind != "choice" and bool(rest) and rest[0][:1].isalpha()))


@dataclass(frozen=True)
class Walked:
    finished: bool
    first_try: int  # predictions right at the first try
    retried: int  # right on a retry
    asked: int

    @property
    def score(self) -> str:
        """'7 of 9 right at the first try, 1 more on a retry' (an unreadable answer is no try)."""
        more = f", {self.retried} more on a retry" if self.retried else ""
        return f"{self.first_try} of {self.asked} right at the first try{more}"


def planned_run(lesson: Lesson) -> RunPlan:
    """The lesson's run, planned as `stepper step` plans one: the debugger keeps every tensor."""
    planned = plan_run(lesson.run, lambda plan, names: names)
    planned.check_fits(planned.names, "--prompt-len")
    return planned


def walked(debugger: LessonDebugger, finished: bool) -> Walked:
    return Walked(finished, debugger.first_try, debugger.retried, debugger.asked)


def walk(lesson: Lesson, console: Console, source: CommandSource, planned: RunPlan | None = None) -> Walked:
    """Run the lesson's interpreter run (`planned` already, or planned here), stopping at its steps;
    the outro at the end."""
    planned = planned or planned_run(lesson)
    plan = planned.plan
    debugger = LessonDebugger(console, plan.config, source, plan.weights, lesson=lesson, plan=plan, tokens=plan.tokens)
    titled_rule(console, f"lesson {lesson.number} · {shown(lesson.title)}", "bold")
    say(console, lesson.intro, Context(plan))
    try:
        result = planned.execute([debugger])
    except Quit:
        console.print(f"quit at step {debugger.step_index} of {len(lesson.steps)}; "
                      f"`stepper lesson start {lesson.name}` starts again", style="dim", soft_wrap=False)
        return walked(debugger, False)
    if debugger.step_index < len(lesson.steps):
        missing = lesson.steps[debugger.step_index].stop
        raise StepperError(f"{lesson.folder / LESSON_FILE}: step {debugger.step_index + 1} stops at '{cut(missing)}', "
                           "which the run never emitted (or not in this order)")
    titled_rule(console, "end of the run", "magenta")
    say(console, lesson.outro, Context(plan, debugger.context().tensors, result))
    outcome = walked(debugger, True)
    console.print(f"predictions: {outcome.score}", style="bold")
    return outcome


def right_answers(lesson: Lesson) -> list[str]:
    """The input lines of a walk that answers every prediction right and goes on at every stop
    (for headless runs: CI pipes these into `stepper lesson start`)."""
    planned = planned_run(lesson)
    recorder = Recorder()
    planned.execute([recorder])
    ctx = Context(planned.plan, recorder.tensors())
    lines = []
    for step in lesson.steps:
        for pred in step.predict:
            value = expected_value(pred, ctx)
            lines.append(repr(float(value)) if pred.kind == "number" else show_answer(pred, value))
        lines.append("")
    return lines
