"""Stopping a distillation run cleanly: the main process decides.

SLURM, at a time limit, sends SIGTERM to every process of the job step, and Ctrl-C sends
SIGINT to the terminal's whole process group: the DataLoader workers receive the signal
as well as the main process. A worker that dies of it takes the run down with it (the
DataLoader reports a killed worker) before the step-end checkpoint. So the workers
ignore both signals (:func:`training_worker_init`), and the main process turns the first
one into a request to stop at the end of the current step (:func:`stop_at_step_end`);
the workers end with the loader, as always.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    signum: int | None = None


@contextlib.contextmanager
def stop_at_step_end() -> Iterator[StopRequest]:
    """SIGINT (Ctrl-C) and SIGTERM (sent by SLURM before a kill) ask the loop to stop at
    the end of the current step and checkpoint there, so a saved state is never half an
    optimiser update. A second signal acts as usual (the handler restores the previous one)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request  # signals are only delivered to the main thread
        return
    previous: dict[int, Any] = {}

    def handler(signum: int, frame: Any) -> None:
        request.signum = signum
        signal.signal(signum, previous[signum])

    for sig in STOP_SIGNALS:
        previous[sig] = signal.signal(sig, handler)
    try:
        yield request
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def training_worker_init(worker_id: int) -> None:
    """A reading worker of the distillation loop: deaf to the stop signals (the main
    process checkpoints and ends the loader), and otherwise a plain tile reader."""
    from pathtwt.wsi.coords_tiles import reader_worker_init

    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    reader_worker_init(worker_id)
