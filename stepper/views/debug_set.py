"""The debugger's `set NAME[slice] = value`: the run continues from the tensor it stopped at, changed.

Only the current tensor can be set (an earlier one has already been used, a later one not made
yet). The value is an expression of the tensor `x` as `--patch` reads it (a number, `x*0.5`,
`x+1e-3`), written to the slice, or to every entry without one. The debugger hands the changed
copy back through the emit seam, so everything after it is computed from it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from stepper.errors import StepperError
from stepper.seams.patching import expression
from stepper.seams.trace import Event
from stepper.untrusted import cut


def set_tensor(debugger: Any, arg: str) -> None:
    """`set [NAME][slice] = value` on the current tensor (NAME may be left out)."""
    target, sep, value = arg.partition("=")
    target, value = target.strip(), value.strip()
    if not sep or not value:  # the example in the names of the model stepped (DeepSeek-V4's attn.weights)
        raise StepperError(f"set takes NAME[slice] = value, e.g. {debugger.example('set')} or set [..., 3] = x*2")
    name, bracket, index = target.partition("[")
    event = debugger.current
    if event is None:
        raise StepperError("no tensor yet")
    if name.strip():
        check_current(debugger, event, name.strip())
    if not event.read:
        raise StepperError(f"{event.name} is shown only: the model does not read it back, so setting it would "
                           "change nothing")
    text = f"x[{index}={value}" if bracket else value
    said = f"set {event.name}{'[' + index if bracket else ''} = {cut(value, 40)}"
    array = expression(text, "", said)(event.array, event.name)
    problem = event.choice and event.choice.problem(array)
    if problem:
        raise StepperError(f"{said} {problem}: the tensor is as it was")
    changed = replace(event, array=array)
    debugger.current = debugger.history[event.name] = changed
    debugger.replaced = array
    debugger.console.print(f"{said}: the run continues from it", style="bold", highlight=False, markup=False)
    debugger.console.print(debugger.rows.render(changed), soft_wrap=True)


def check_current(debugger: Any, event: Event, name: str) -> None:
    """Only the tensor the run stopped at can be set: another is refused, saying where the run
    would have to stop to set it."""
    only = f"only the tensor the run stopped at ({event.name}) can be set"
    try:
        other = debugger.resolve(name)
    except StepperError:
        if debugger.names is None or not debugger.emits(name):
            raise
        raise StepperError(f"{only}; {name} comes later: stop at it (u {name}), then set it") from None
    if other is not event:
        raise StepperError(f"{only}; {other.name} was made before it: a run stopped there can set it "
                           f"(stepper step --until {other.name})")
