"""`python -m stepper.bench SCENARIO 'JSON ARGS'`: one scenario in this process, its figures as
one JSON list on the last line of stdout (stepper.bench.figures.in_subprocess runs it)."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

from stepper.bench.ceilings import ceilings, fp8_rate
from stepper.bench.kda import kda_run
from stepper.bench.layers import expert_products, indexed_prefill, layer_run, layers_in_turn
from stepper.bench.long_context import attention_run
from stepper.bench.transformers_pair import versus_torch
from stepper.bench.v4_attention import long_decode
from stepper.bench.v4_layer import fp4_rate, v4_layer_run
from stepper.kernels import parallel

SCENARIOS = {"ceilings": ceilings, "fp8_rate": fp8_rate, "layer": layer_run, "torch": versus_torch,
             "indexed": indexed_prefill,
             "attention": attention_run, "experts": expert_products, "kda": kda_run, "layers_in_turn": layers_in_turn,
             "v4_layer": v4_layer_run, "fp4_rate": fp4_rate, "v4_long": long_decode}


USAGE = "usage: python -m stepper.bench SCENARIO ['JSON ARGS'] (one scenario of `stepper bench`); scenarios: "


def scenario_main(argv: list[str]) -> None:
    name, *args = argv or ["--help"]
    if name not in SCENARIOS:
        sys.exit(usage(f"no scenario {name!r}" if name not in ("-h", "--help") else ""))
    try:
        kwargs = json.loads(args[0]) if args else {}
    except json.JSONDecodeError as error:
        sys.exit(usage(f"its arguments are not JSON ({error})"))
    try:
        inspect.signature(SCENARIOS[name]).bind(**kwargs)
    except TypeError as error:
        sys.exit(usage(f"{name}: {error}"))
    if name != "ceilings":
        parallel.single_threaded_blas()  # as the command line runs
    if "checkpoint" in kwargs:
        kwargs["checkpoint"] = Path(kwargs["checkpoint"])
    figures = SCENARIOS[name](**kwargs)
    print(json.dumps([f.__dict__ for f in figures]))


def usage(problem: str) -> int:
    """Print the one line of usage (after the problem, if any) to stderr. -> exit code 2"""
    print(f"{problem}; " * bool(problem) + USAGE + ", ".join(SCENARIOS), file=sys.stderr)
    return 2


if __name__ == "__main__":
    scenario_main(sys.argv[1:])
