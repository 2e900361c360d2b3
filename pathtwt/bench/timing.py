"""Timers: seconds per call of a short function, and steady-state rates from the
difference of a large job and a small one (the fixed costs, start-up and the last
writes, cancel)."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator


class Stopwatch:
    """Seconds since it started (``seconds``), read at any time; a context manager that
    stops it on exit."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.ended: float | None = None

    @property
    def seconds(self) -> float:
        return (self.ended if self.ended is not None else time.perf_counter()) - self.began

    def __enter__(self) -> "Stopwatch":
        self.began, self.ended = time.perf_counter(), None
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ended = time.perf_counter()


def seconds_per_call(fn: Callable[[], Any], min_time_s: float, *, sync: Callable[[], None] | None = None,
                     warmup: int = 2, rounds: int = 2, min_calls: int = 3) -> float:
    """Seconds per call of ``fn``: ``warmup`` calls, then rounds of as many calls as fill
    ``min_time_s`` (at least ``min_calls``), the best round's mean. ``sync`` waits for
    queued device work (``torch.cuda.synchronize``) before each clock reading."""
    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    n = max(min_calls, math.ceil(min_time_s / one))
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


@dataclass
class Steady:
    """The outcome of :func:`steady_state`: seconds per unit of work in steady state,
    the fixed seconds a job costs besides (start-up, last writes), the two jobs' seconds,
    and what the large job returned."""

    unit_s: float
    fixed_s: float
    small_s: float
    large_s: float
    large_result: Any = None

    def rate(self, per_unit: float = 1.0) -> float:
        """Things per second in steady state, ``per_unit`` things to a unit (tiles a copy)."""
        return per_unit / self.unit_s


def steady_state(job: Callable[[int], Any], small: int = 1, large: int = 3, *, warmup: bool = True,
                 repeats: int = 1, sync: Callable[[], None] | None = None) -> Steady:
    """Run ``job(small)`` and ``job(large)`` (``job(n)``: n units of work, e.g. a job of n
    copies of a slide, or n optimiser steps), after one ``job(small)`` warm-up when
    ``warmup``; each the least of ``repeats`` runs. The difference is the steady state:
    ``unit_s = (large_s - small_s) / (large - small)``."""
    if large <= small:
        raise ValueError(f"steady_state: large ({large}) must exceed small ({small})")
    sync = sync or (lambda: None)
    if warmup:
        job(small)
        sync()
    seconds: dict[int, float] = {}
    result = None
    for n in (small, large):
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = job(n)
            sync()
            took = time.perf_counter() - t0
            if took < seconds.get(n, float("inf")):
                seconds[n] = took
                if n == large:
                    result = out
    unit = max(seconds[large] - seconds[small], 1e-9) / (large - small)
    return Steady(unit_s=unit, fixed_s=seconds[small] - small * unit, small_s=seconds[small],
                  large_s=seconds[large], large_result=result)


@contextlib.contextmanager
def stopwatch() -> Iterator[Stopwatch]:
    """``with stopwatch() as w: ...``; ``w.seconds`` afterwards."""
    with Stopwatch() as watch:
        yield watch


def interleaved_best(calls: dict[Any, Callable[[], Any]], rounds: int, *,
                     sync: Callable[[], None] | None = None) -> dict[Any, float]:
    """The best wall seconds of each call over ``rounds`` rounds that run every call once in
    turn, after one warm-up call each: a load that drifts during the run (a shared machine)
    weighs on every call alike, so their ratios stay fair. ``sync`` as in
    :func:`seconds_per_call`."""
    sync = sync or (lambda: None)
    for fn in calls.values():
        fn()
    sync()
    best = {key: float("inf") for key in calls}
    for _ in range(rounds):
        for key, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            sync()
            best[key] = min(best[key], time.perf_counter() - t0)
    return best
