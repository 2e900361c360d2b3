"""Stopping a compression run cleanly, wherever the stop comes from.

SLURM, at a time limit, sends SIGTERM to every process of the job step, and Ctrl-C sends
SIGINT to the terminal's whole process group: the DataLoader workers receive the signal
as well as the main process. Under ``torchrun`` each rank is signalled twice: by SLURM
(or whoever signals the job) and again by torchrun, which forwards what it receives to
its workers (and, if it is itself signalled again while it waits for them, forwards
once more). So:

- the reading workers ignore both signals (:func:`training_worker_init`): a worker that
  died of one would take the run down before the step-end checkpoint;
- the main process keeps one handler for the whole command (:func:`stop_signals_handled`),
  never the default one again: the first signal is the stop, any later one is noted and
  ignored. Inside the distillation loop (:func:`stop_at_step_end`) the stop is deferred to
  the end of the current step, which the ranks agree on and rank 0 checkpoints; anywhere
  else it raises :class:`KeyboardInterrupt` at once, so atomic writers remove their
  temporary files and the command ends as interrupted (130).

The one limit is the launcher's patience: torchrun SIGKILLs workers still running 30 s
after it forwarded the signal (``--shutdown-timeout`` or ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``),
as SLURM does after its ``KillWait``; a step and a checkpoint must fit in that time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """What the handler saw: the first stop signal (None: none yet), and whether the stop
    is deferred to the end of a step (inside the loop)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.defer = False
        self.stopping = False  # a stop is under way (raised, or agreed by the ranks): later signals change nothing

    def __call__(self, signum: int, frame: Any) -> None:
        if self.signum is not None or self.stopping:
            return  # a second SIGTERM (torchrun's forward of SLURM's) must not end the step half-way
        self.signum = signum
        name = signal.Signals(signum).name
        when = "at the end of this step (a checkpoint is written)" if self.defer else "now"
        # os.write: the handler may run while the main thread is inside a print to stderr
        os.write(2, f"pathtwt: {name}: stopping {when}; SIGKILL stops at once\n".encode())
        if not self.defer:
            self.stopping = True
            raise KeyboardInterrupt(f"stopped by {name}")

    def pending(self) -> bool:
        """A stop that came while deferred and was not acted on yet."""
        return self.signum is not None and not self.stopping


_active: StopRequest | None = None


@contextlib.contextmanager
def stop_signals_handled() -> Iterator[StopRequest]:
    """SIGINT and SIGTERM handled for the whole block (a command's run): see the module
    doc. Nested blocks share the outer one's request; off the main thread (signals are
    delivered only to it) nothing is installed."""
    global _active
    if _active is not None or threading.current_thread() is not threading.main_thread():
        yield _active or StopRequest()
        return
    request = StopRequest()
    previous = {sig: signal.signal(sig, request) for sig in STOP_SIGNALS}
    _active = request
    try:
        yield request
    finally:
        _active = None
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def stop_at_step_end() -> Iterator[StopRequest]:
    """Inside the distillation loop: a stop signal asks the loop to stop at the end of the
    current step and checkpoint there, so a saved state is never half an optimiser update.
    The loop reads ``request.signum`` once a step (the ranks agree on it) and raises
    :class:`KeyboardInterrupt` itself; a signal that came after the loop's last look is
    acted on by the next :func:`raise_if_stopped` (before an export)."""
    with stop_signals_handled() as request:
        outer = request.defer
        request.defer = True
        try:
            yield request
        except KeyboardInterrupt:
            request.stopping = True  # the loop acted on a stop (this rank's or another's)
            raise
        finally:
            request.defer = outer


def ending() -> None:
    """The command is ending (an error is being reported): a stop signal from now on changes
    nothing, so it cannot replace the line being said (torchrun signals the ranks still
    running as soon as one has failed)."""
    if _active is not None:
        _active.stopping = True


def raise_if_stopped() -> None:
    """Act on a stop that came when nothing could act on it (after the loop's last step)."""
    if _active is not None and _active.pending():
        _active.stopping = True
        raise KeyboardInterrupt(f"stopped by {signal.Signals(_active.signum).name}")


def training_worker_init(worker_id: int) -> None:
    """A reading worker of the distillation loop: deaf to the stop signals (the main
    process checkpoints and ends the loader), and otherwise a plain tile reader."""
    from pathtwt.wsi.coords_tiles import reader_worker_init

    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    reader_worker_init(worker_id)
