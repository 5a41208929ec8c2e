"""What a bench figure is, how it is timed (medians, runs of two things taken in turn) and where:
each scenario in a fresh process (`python -m stepper.bench SCENARIO ARGS`, stepper.bench.__main__),
so that its peak RSS is its own."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from stepper.kernels import fp8_workers


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    peak_rss_mb: float | None = None
    note: str = ""
    floor: float | None = None  # in the figure's unit: what this run's ceilings allow, or the anchor a ratio is held to
    floor_note: str = ""  # how the floor was made

    def ratio(self) -> float | None:
        """The figure over its floor (None without one)."""
        return self.value / self.floor if self.floor else None


def with_floor(figures: list[Figure], floor: tuple[float, str]) -> list[Figure]:
    return [replace(f, floor=floor[0], floor_note=floor[1]) for f in figures]


def anchored(figures: list[Figure], why: str) -> list[Figure]:
    """The ratios among the figures held to 1 (no slower than the other side); the rest as they are."""
    return [replace(f, floor=1.0, floor_note=why) if f.unit == "x" else f for f in figures]


def median_time(fn, repeat: int) -> float:
    return float(np.median([seconds(fn) for _ in range(repeat)]))


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired_times(first, second, pairs: int, warmed=lambda: None) -> tuple[float, float, float]:
    """After one untimed run of each (then `warmed()`), `pairs` runs of each in turn, the order
    swapped every pair: the median of the ratios second / first, and the median time of each. Run
    this way, both see the same state of the machine (on this one, the same layer's time drifted
    by 20% between minutes), which times taken one after the other do not.
    -> (ratio, first s, second s)"""
    first()
    second()
    warmed()
    ones, twos = [], []
    for p in range(pairs):
        if p % 2 == 0:
            ones.append(seconds(first))
            twos.append(seconds(second))
        else:
            twos.append(seconds(second))
            ones.append(seconds(first))
    ratios = np.array(twos) / np.array(ones)
    return float(np.median(ratios)), float(np.median(ones)), float(np.median(twos))


def peak_rss_mb() -> float:
    """This process's peak resident memory plus that of its FP8 helper processes (Linux)."""
    helpers = sum(helper_peak_kb(pid) for pid in fp8_workers.helper_pids())
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + helpers) / 1024


def helper_peak_kb(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)


def in_subprocess(name: str, **kwargs) -> list[Figure]:
    argv = [sys.executable, "-m", "stepper.bench", name, json.dumps({k: str(v) if isinstance(v, Path) else v
                                                                      for k, v in kwargs.items()})]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench scenario {name} failed:\n{done.stderr[-2000:]}")
    return [Figure(**f) for f in json.loads(done.stdout.splitlines()[-1])]


def side_by_side(name: str, copies: int) -> list[Figure]:
    """A scenario run in `copies` processes at once (each core busy, as when a product is
    shared): each one's figures."""
    argv = [sys.executable, "-m", "stepper.bench", name, "{}"]
    running = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(copies)]
    figures = []
    for process in running:
        out, err = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"bench scenario {name} failed:\n{err[-2000:]}")
        figures += [Figure(**f) for f in json.loads(out.splitlines()[-1])]
    return figures
