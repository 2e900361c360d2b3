"""Batches split into parts once the GPU runs out of memory, for the rest of a job.

Every step of the device path can run out of memory: the GPU decoder's batch and the stack
of native tiles, the cut and the shrink, the normalisation and the forward pass. Each runs
through :meth:`StepDown.run` over parts of its batch (the whole batch until the first
failure). An out-of-memory error gives the caching allocator's free blocks back, and what
the GPU decoder keeps (:meth:`StepDown.free`), halves the part and runs that step of the
batch again; the smaller part is kept for the rest of
the job, and the job says so once per step down, with the batch size that would have
fitted. A part of one that does not fit is raised (the command's one-line handler).
"""

from __future__ import annotations

import sys
from typing import Callable, TypeVar

from pathtwt.out_of_memory import is_out_of_memory

T = TypeVar("T")


class StepDown:
    """The part size of a job's device steps: None (whole batches) until the GPU first
    runs out of memory."""

    def __init__(self) -> None:
        self.size: int | None = None
        self.where = ""  # the step that ran out of memory last
        self._said: int | None = None
        # what else holds device memory a smaller part could use: the GPU decoder's buffers
        # and the memory pool they come from (DeviceTiles adds its decoder's)
        self.releases: list[Callable[[], None]] = []

    def part(self, n: int) -> int:
        """Tiles (or streams) per part of a batch of ``n``."""
        return max(1, min(self.size or n, n))

    def attempt(self, fn: Callable[[], T], n: int, where: str) -> T:
        """``fn()``, which splits a batch of ``n`` into parts of :meth:`part`; after an
        out-of-memory error, again with halved parts."""
        while True:
            size = self.part(n)
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - only an out-of-memory error is retried
                if not is_out_of_memory(exc) or size <= 1:
                    raise
                self.halve(size, where)

    def run(self, n: int, part: Callable[[int, int], T], where: str) -> list[T]:
        """``part(lo, hi)`` over the parts of a batch of ``n``, halved after an
        out-of-memory error (the batch's parts all made again)."""
        def parts() -> list[T]:
            size = self.part(n)
            return [part(lo, min(lo + size, n)) for lo in range(0, n, size)]

        return self.attempt(parts, n, where)

    def whole(self, n: int, make: Callable[[int, int], T], where: str) -> T | None:
        """``make(0, n)`` while batches go whole; None once they go in parts (then or
        before: the caller makes each part where it uses it)."""
        if self.part(n) < n:
            return None
        try:
            return make(0, n)
        except Exception as exc:  # noqa: BLE001 - only an out-of-memory error is stepped down
            if not is_out_of_memory(exc) or n <= 1:
                raise
            self.halve(n, where)
            return None

    def halve(self, size: int, where: str) -> None:
        if self.size == self._said:  # the first step down since the last line: where it began
            self.where = where
        self.size = max(1, size // 2)
        self.free()

    def free(self) -> None:
        """Give back the device memory nothing holds: what :attr:`releases` give and the
        caching allocator's free blocks (those the failed step freed)."""
        import torch

        for release in self.releases:
            release()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def say(self) -> None:
        """One line for a step down not said yet."""
        if self.size is not None and self.size != self._said:
            self._said = self.size
            print(f"extract: the GPU ran out of memory {self.where}; going on with {self.size} tiles per pass "
                  f"(start with --batch-size {self.size} to skip this)", file=sys.stderr, flush=True)
