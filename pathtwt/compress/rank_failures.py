"""A rank that fails, stops or stalls ends the whole data-parallel job, with one line that
names it.

An error that hits one rank alone (an unreadable tile in its share, rank 0's checkpoint
write, an out-of-memory on one GPU, its own collective's NCCL error) leaves the other ranks
waiting in a collective. So the failing rank (:func:`leave_after_error`):

1. posts one notice in the group's store (the rendezvous TCPStore every rank reaches):
   ``rank R of N: <its error line>``; the first notice of the job stands, and a rank whose
   own notice came second says the first one's cause instead;
2. waits a moment (at most :data:`ACK_WAIT_S`) for every other rank to say it has read the
   notice: the store may leave with this rank (rank 0 hosts it under plain ``srun``; under
   torchrun the node's agent hosts it and exits right after its ranks);
3. aborts the process group (:func:`pathtwt.compress.ranks.abort`, bounded), never destroys it;
4. exits non-zero.

The other ranks learn it either way: gloo's connections close, so their collective fails
at once and they read the notice (``stopped because rank R failed: ...``); an NCCL
collective notices nothing, so each rank runs a watcher thread (:class:`PeerWatch`) that
reads the store twice a second (it runs while the main thread waits for the device: the
loop's one wait, ``tolist``, releases the GIL for its copy, torch/csrc/utils/tensor_list.cpp). The first notice of another rank it reads is kept: after
:data:`GRACE_S` seconds (time for a rank whose collective broke to end on its own, with its
own line) a timer ends the rank with the notice's line (``os._exit``: its main thread is
inside a device wait), whatever the store answers meanwhile, or if it never answers again.
An "interrupted" notice (a stop signal that one rank acted on alone, outside the loop's
step-end stop) releases the others as a "failed" one does.

The watcher also reports this rank's progress (the collectives it has entered,
:func:`pathtwt.compress.ranks.progress`) to the store, and reads the others'. A rank that
stays behind another for ``--rank-timeout`` (the others wait for it in a collective it
never enters: a hung device, a step stuck in I/O) is named in a "stalled" notice and every
rank ends with that line, before the group's own timeout (NCCL's watchdog, which would end
the processes in torch's words: :func:`pathtwt.compress.ranks.group_timeout`). A rank
killed without a notice (SIGKILL, the kernel's out-of-memory killer) is lost contact: the
ranks whose collective breaks say so, and a stalled count names it otherwise.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

NOTICE_KEY = "pathtwt/rank-notice"
BEAT_KEY = "pathtwt/progress/{rank}"  # a rank's count of collectives entered
SEEN_KEY = "pathtwt/notice-seen/{rank}"  # a rank has read the notice
POLL_S = 0.5
# how long another rank's notice stands before this rank is ended from its watcher:
# enough for a rank whose collective failed to end on its own, with its own line
GRACE_S = 3.0
# how long a rank that posted a notice waits for the others to have read it
ACK_WAIT_S = 3.0
# how long a rank that ends waits for its watcher's store call in flight to return (stop_watching)
STOP_WAIT_S = 10.0
EXIT_CODES = {"failed": 1, "stalled": 1, "interrupted": 130}

_lock = threading.Lock()
_reported = False  # this rank has said how it ends (from the main thread or the watcher)


@dataclass(frozen=True)
class Notice:
    rank: int  # the rank it is about
    kind: str  # "failed" | "interrupted" | "stalled"
    line: str
    by: int = -1  # the rank that posted it (-1: the rank it is about)

    @property
    def poster(self) -> int:
        return self.rank if self.by < 0 else self.by

    def cause(self) -> str:
        if self.kind == "interrupted":
            return f"rank {self.rank} was interrupted"
        if self.kind == "stalled":
            return f"rank {self.rank} stopped reporting: {self.line}"
        return f"rank {self.rank} failed: {self.line}"


def _store() -> Any:
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store() if dist.is_available() and dist.is_initialized() else None


def post(store: Any, notice: Notice) -> Notice:
    """Post ``notice`` unless one is there already; returns the notice that stands (the
    first of the job: its cause is the job's)."""
    if store is None:
        return notice
    try:
        stood = store.compare_set(NOTICE_KEY, "", json.dumps(notice.__dict__))
        return Notice(**json.loads(stood))
    except Exception:  # noqa: BLE001 - the store is rank 0's under srun, and may be gone with it
        return notice


def read(store: Any) -> Notice | None:
    if store is None:
        return None
    try:
        if not store.check([NOTICE_KEY]):
            return None
        return Notice(**json.loads(store.get(NOTICE_KEY)))
    except Exception:  # noqa: BLE001 - as in post
        return None


def _acknowledge(store: Any, me: int) -> None:
    try:
        store.set(SEEN_KEY.format(rank=me), "1")
    except Exception:  # noqa: BLE001 - as in post
        pass


def _await_acknowledgements(store: Any, me: int, world: int) -> None:
    """Wait, at most :data:`ACK_WAIT_S`, until every other rank has read this rank's notice."""
    keys = [SEEN_KEY.format(rank=r) for r in range(world) if r != me]
    end = time.monotonic() + ACK_WAIT_S
    while time.monotonic() < end:
        try:
            if store is None or store.check(keys):
                return
        except Exception:  # noqa: BLE001 - the store is gone: nobody else can read it now
            return
        time.sleep(POLL_S / 5)


def is_collective_error(exc: BaseException) -> bool:
    """Whether ``exc`` came out of a collective (a ``DistError``: NCCL's out of memory,
    "Duplicate GPU detected", a closed connection, a timeout; gloo's RuntimeError)."""
    import torch.distributed as dist

    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(s in text for s in ("gloo", "Gloo", "NCCL", "ProcessGroup", "Connection reset",
                                                                     "Connection closed"))


_LOST = ("Connection closed", "Connection reset", "Broken pipe", "timed out", "Timed out", "Timeout", "aborted")


def collective_error_line(exc: BaseException) -> str:
    """This rank's line for its collective's error: the gist of the backend's message (its
    first sentence, and NCCL's "Last error:" line, where the cause is), or, when the
    connection closed or timed out, lost contact."""
    import re

    from pathtwt.errors import first_line

    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    head = re.sub(r"^\[[^\]]*\]\s*", "", first_line(exc)).split(". ")[0][:160]
    if any(word in head for word in _LOST):
        return (f"lost contact with the other ranks ({head}); a rank that ended without a line of its own was killed "
                "(out of memory, kill -9, a failed node: see the job's log)")
    last = next((lines[i + 1] for i, line in enumerate(lines[:-1]) if line.startswith("Last error")), "")
    return f"its collective failed: {type(exc).__name__}: {head}" + (f" ({last[:160]})" if last else "")


def _claim_report() -> bool:
    """True for the first of the main thread and the watcher to say how this rank ends."""
    global _reported
    with _lock:
        first, _reported = not _reported, True
    return first


class PeerWatch(threading.Thread):
    """Reports this rank's progress, keeps the first notice of another rank it reads and
    ends this rank :data:`GRACE_S` later, and names a rank that stayed behind for
    ``timeout_s`` (see the module doc). ``prefix`` starts an error line, ``stop_prefix``
    the line of a rank stopped by another's interrupt (the command's prefixes)."""

    def __init__(self, store: Any, me: int, world: int, prefix: str, *, timeout_s: float = float("inf"),
                 stop_prefix: str = "") -> None:
        super().__init__(name="pathtwt-peer-watch", daemon=True)
        self.store, self.me, self.world, self.prefix = store, me, world, prefix
        self.stop_prefix = stop_prefix or prefix
        self.timeout_s = timeout_s
        self.done = threading.Event()
        self.kept: Notice | None = None
        self._counts: dict[int, tuple[int, float]] = {}  # rank -> (count, when it last changed)
        self._posted = -1

    def run(self) -> None:
        while not self.done.wait(POLL_S):
            try:
                self._look()
            except Exception:  # noqa: BLE001 - an unreachable store: the kept notice's timer acts regardless
                continue

    def _look(self) -> None:
        if self.kept is None:
            notice = read(self.store)
            if notice is not None and notice.poster != self.me:
                self.keep(notice)
                return
        self._report_progress()
        stalled = self._stalled()
        if stalled is not None and self.kept is None:
            minutes = self.timeout_s / 60
            line = (f"no progress for {minutes:.3g} minutes while the other ranks waited for it in a collective "
                    "(--rank-timeout): a hung GPU or a step stuck in I/O; see its log")
            self.keep(post(self.store, Notice(stalled, "stalled", line, by=self.me)), grace=0.0)

    def keep(self, notice: Notice, grace: float | None = None) -> None:
        """Keep ``notice`` and end this rank ``grace`` seconds later (default :data:`GRACE_S`)
        unless it ends itself."""
        self.kept = notice
        _acknowledge(self.store, self.me)
        timer = threading.Timer(GRACE_S if grace is None else grace, self._end)
        timer.daemon = True
        timer.start()

    def _end(self) -> None:
        notice = self.kept
        if notice is None or self.done.is_set() or not _claim_report():
            return
        if notice.poster == self.me:  # this rank named a stalled one: the others read it first
            _await_acknowledgements(self.store, self.me, self.world)
        where = f"rank {self.me} of {self.world}"
        if notice.kind == "stalled" and notice.rank == self.me:
            line = f"{self.prefix}{where}: stopped reporting: {notice.line}"
        else:
            line = f"{self.stop_prefix if notice.kind == 'interrupted' else self.prefix}{where}: stopped because {notice.cause()}"
        os.write(2, f"{line}\n".encode())
        os._exit(EXIT_CODES.get(notice.kind, 1))

    def _report_progress(self) -> None:
        from pathtwt.compress import ranks

        count = ranks.progress()
        if count != self._posted:
            self.store.set(BEAT_KEY.format(rank=self.me), str(count))
            self._posted = count

    def _stalled(self) -> int | None:
        """The rank furthest behind, when it has not moved for ``timeout_s`` while another
        rank is ahead of it (waiting for it), else None."""
        if self.timeout_s == float("inf"):
            return None
        keys = [BEAT_KEY.format(rank=r) for r in range(self.world)]
        if not self.store.check(keys):
            return None
        now = time.monotonic()
        # one round trip for all ranks' counts (TCPStore's multi_get), where the store has it
        values = self.store.multi_get(keys) if hasattr(self.store, "multi_get") else [self.store.get(k) for k in keys]
        for r, value in enumerate(values):
            count = int(value)
            if self._counts.get(r, (None, 0.0))[0] != count:
                self._counts[r] = (count, now)
        ahead = max(count for count, _ in self._counts.values())
        behind = min(range(self.world), key=lambda r: self._counts[r][0])
        count, since = self._counts[behind]
        return behind if count < ahead and now - since >= self.timeout_s else None


_watch: PeerWatch | None = None
_prefixes = ("", "")  # the command's error and stop prefixes (watch_peers)


def watch_peers(prefix: str, *, timeout_minutes: float = float("inf"), stop_prefix: str = "") -> None:
    """Start this rank's watcher (several ranks only); ``timeout_minutes``: --rank-timeout."""
    global _watch, _reported, _prefixes
    from pathtwt.compress import ranks

    _prefixes = (prefix, stop_prefix or prefix)
    if ranks.world_size() > 1 and _watch is None:
        _reported = False
        _watch = PeerWatch(_store(), ranks.rank(), ranks.world_size(), prefix, timeout_s=60 * float(timeout_minutes),
                           stop_prefix=stop_prefix)
        _watch.start()


def stop_watching() -> bool:
    """Stop the watcher and wait, at most :data:`STOP_WAIT_S`, for the store call it may be
    in; False when that call has not returned (the caller then leaves with ``os._exit``).

    The wait is what lets the interpreter end: a store call returns into pybind11, whose
    ``gil_scoped_release`` retakes the GIL on the way out, and a daemon thread that retakes
    it while the interpreter is finalising is ended with ``pthread_exit`` (CPython 3.11-3.13,
    ``take_gil`` in Python/ceval_gil.c; gh-87135). Its forced unwind meets the noexcept
    destructor, and ``std::terminate`` aborts the rank (SIGABRT, "terminate called without
    an active exception") after a run that ended well."""
    global _watch
    watch, _watch = _watch, None
    if watch is None:
        return True
    watch.done.set()
    watch.join(STOP_WAIT_S)
    return not watch.is_alive()


def leave_after_error(exc: BaseException, own_line: str | None) -> BaseException | None:
    """Leave the group after ``exc`` ended this rank's run; returns what to raise instead
    (None: ``exc`` itself). ``own_line``: the one line for ``exc`` when it is an expected
    error of this rank (None for a bug, whose traceback is shown, and for an interrupt).

    - another rank's notice already there: that rank's cause (``rank r of N: stopped because
      rank R failed: <its line>``), or its interrupt; a stop signal this rank received after
      another rank failed (torchrun signals the ranks still running) says that cause too;
    - an interrupt (a stop signal) stays one: posted, so that the others stop too;
    - this rank's own error, a collective's included (its out of memory, a duplicate GPU, a
      closed connection): its line, prefixed ``rank r of N:``, posted for the others.
    """
    from pathtwt.compress import ranks

    world = ranks.world_size()
    if world == 1:
        stop_watching()
        ranks.abort()
        return None
    me, store = ranks.rank(), _store()
    _claim_report()  # the watcher must not end the rank while it says so itself
    watched = stop_watching()
    where = f"rank {me} of {world}"
    other = read(store)
    if other is not None and other.poster == me:
        other = None
    replacement: BaseException | None
    if other is not None:
        _acknowledge(store, me)
        replacement = _consequence(where, me, other)
    elif isinstance(exc, KeyboardInterrupt):
        stood = post(store, Notice(me, "interrupted", "interrupted"))
        replacement = None if stood.poster == me else _consequence(where, me, stood)
    else:
        collective = own_line is None and is_collective_error(exc)
        line = own_line if own_line is not None else collective_error_line(exc) if collective else \
            f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
        stood = post(store, Notice(me, "failed", line))
        if stood.poster != me:
            replacement = _consequence(where, me, stood)
        else:
            from pathtwt.errors import PathtwtError

            replacement = PathtwtError(f"{where}: {line}") if own_line is not None or collective else None
    if other is None:
        _await_acknowledgements(store, me, world)
    if not ranks.abort() or not watched:  # either thread still in a call: leave before finalising
        _leave_now(replacement if replacement is not None else exc)
    return replacement


def _leave_now(exc: BaseException) -> None:
    """The abort hangs (NCCL can wait inside it): say the line and exit without it."""
    prefix, stop_prefix = _prefixes
    interrupted = isinstance(exc, KeyboardInterrupt)
    os.write(2, (f"{stop_prefix}interrupted\n" if interrupted else f"{prefix}{exc}\n").encode())
    os._exit(130 if interrupted else 1)


def _consequence(where: str, me: int, other: Notice) -> BaseException:
    """What a rank raises when another rank's notice stands: that rank's interrupt, or the
    line naming its failure or stall (this rank's own, when it is the stalled one)."""
    from pathtwt.errors import PathtwtError

    if other.kind == "interrupted":
        return KeyboardInterrupt()
    if other.kind == "stalled" and other.rank == me:
        return PathtwtError(f"{where}: stopped reporting: {other.line}")
    return PathtwtError(f"{where}: stopped because {other.cause()}")
