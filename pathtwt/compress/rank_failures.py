"""A rank that fails ends the whole data-parallel job, with one line that names it.

An error that hits one rank alone (an unreadable tile in its share, rank 0's checkpoint
write, an out-of-memory on one GPU) leaves the other ranks waiting in a collective.
So the failing rank (:func:`leave_after_error`):

1. posts one notice in the group's store (the rendezvous TCPStore every rank reaches):
   ``rank R of N: <its error line>``, the first notice of the job kept;
2. aborts the process group (:func:`pathtwt.compress.ranks.abort`), never destroys it:
   NCCL's destroy would wait for a collective the others never finish;
3. exits non-zero.

The other ranks learn it either way: gloo's connections close, so their collective fails
at once and they read the notice (``stopped because rank R failed: ...``); an NCCL
collective over NVLink notices nothing, so each rank runs a watcher thread
(:class:`PeerWatch`) that reads the store twice a second and, when another rank's failure
notice has stood for :data:`GRACE_S` seconds without this rank ending on its own, prints
the line and exits (``os._exit``: its main thread is inside a CUDA wait). A rank killed
without a notice (SIGKILL, the kernel's out-of-memory killer) is seen as lost contact;
torchrun ends the job when one of its workers dies, and the group's timeout
(``--rank-timeout``) bounds every other wait.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

NOTICE_KEY = "pathtwt/rank-notice"
POLL_S = 0.5
# how long another rank's failure notice stands before this rank is ended from its watcher:
# enough for a rank whose collective failed to end on its own, with its own line
GRACE_S = 3.0

_lock = threading.Lock()
_reported = False  # this rank has said how it ends (from the main thread or the watcher)


@dataclass(frozen=True)
class Notice:
    rank: int
    kind: str  # "failed" | "interrupted"
    line: str

    def cause(self) -> str:
        return f"rank {self.rank} was interrupted" if self.kind == "interrupted" else f"rank {self.rank} failed: {self.line}"


def _store() -> Any:
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store() if dist.is_available() and dist.is_initialized() else None


def post(store: Any, notice: Notice) -> None:
    """Post ``notice`` unless one is there already (the first failure is the cause)."""
    if store is None:
        return
    try:
        store.compare_set(NOTICE_KEY, "", json.dumps(notice.__dict__))
    except Exception:  # noqa: BLE001 - the store is rank 0's under srun, and may be gone with it
        pass


def read(store: Any) -> Notice | None:
    if store is None:
        return None
    try:
        if not store.check([NOTICE_KEY]):
            return None
        return Notice(**json.loads(store.get(NOTICE_KEY)))
    except Exception:  # noqa: BLE001 - as in post
        return None


def lost_contact(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because another rank is gone or stuck
    (gloo: connection closed or timed out; NCCL: aborted communicator or watchdog timeout),
    rather than this rank's own error."""
    import torch.distributed as dist

    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(s in text for s in ("gloo", "Gloo", "NCCL", "ProcessGroup", "Connection reset",
                                                                     "Connection closed"))


def _first_words(exc: BaseException) -> str:
    """The gist of a backend's error: its first sentence, without the source location
    gloo puts in front ("[.../pair.cc:561] Connection closed by peer [10.0.0.2]:4242")."""
    import re

    from pathtwt.errors import first_line

    return re.sub(r"^\[[^\]]*\]\s*", "", first_line(exc)).split(". ")[0][:160]


def _claim_report() -> bool:
    """True for the first of the main thread and the watcher to say how this rank ends."""
    global _reported
    with _lock:
        first, _reported = not _reported, True
    return first


class PeerWatch(threading.Thread):
    """Ends this rank when another rank's failure notice has stood for :data:`GRACE_S`
    (see the module doc); ``prefix`` starts its line (the command's error prefix)."""

    def __init__(self, store: Any, me: int, world: int, prefix: str) -> None:
        super().__init__(name="pathtwt-peer-watch", daemon=True)
        self.store, self.me, self.world, self.prefix = store, me, world, prefix
        self.done = threading.Event()

    def run(self) -> None:
        seen_at = None
        while not self.done.wait(POLL_S):
            notice = read(self.store)
            if notice is None or notice.rank == self.me or notice.kind != "failed":
                continue
            seen_at = seen_at or time.monotonic()
            if time.monotonic() - seen_at >= GRACE_S and not self.done.is_set() and _claim_report():
                os.write(2, f"{self.prefix}rank {self.me} of {self.world}: stopped because {notice.cause()}\n".encode())
                os._exit(1)
                return


_watch: PeerWatch | None = None


def watch_peers(prefix: str) -> None:
    """Start this rank's watcher (several ranks only)."""
    global _watch, _reported
    from pathtwt.compress import ranks

    if ranks.world_size() > 1 and _watch is None:
        _reported = False
        _watch = PeerWatch(_store(), ranks.rank(), ranks.world_size(), prefix)
        _watch.start()


def stop_watching() -> None:
    global _watch
    if _watch is not None:
        _watch.done.set()
        _watch = None


def leave_after_error(exc: BaseException, own_line: str | None) -> BaseException | None:
    """Leave the group after ``exc`` ended this rank's run; returns what to raise instead
    (None: ``exc`` itself). ``own_line``: the one line for ``exc`` when it is an expected
    error of this rank (None for a bug, whose traceback is shown, and for an interrupt).

    - an interrupt (a stop signal) stays one: the rank exits as interrupted;
    - a collective broken by another rank: ``rank r of N: stopped because rank R failed:
      <its line>`` (or lost contact, when the other rank left no notice: it was killed);
    - this rank's own error: its line, prefixed ``rank r of N:``, posted for the others.
    """
    from pathtwt.compress import ranks
    from pathtwt.errors import PathtwtError

    world = ranks.world_size()
    if world == 1:
        stop_watching()
        ranks.abort()
        return None
    me, store = ranks.rank(), _store()
    _claim_report()  # the watcher must not end the rank while it says so itself
    stop_watching()
    where = f"rank {me} of {world}"
    replacement: BaseException | None
    if isinstance(exc, KeyboardInterrupt):
        post(store, Notice(me, "interrupted", "interrupted"))
        replacement = None
    elif lost_contact(exc):
        replacement = _consequence(where, me, exc, read(store))
    else:
        line = own_line if own_line is not None else f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
        post(store, Notice(me, "failed", line))
        replacement = PathtwtError(f"{where}: {line}") if own_line is not None else None
    ranks.abort()
    return replacement


def _consequence(where: str, me: int, exc: BaseException, other: Notice | None) -> BaseException:
    """What a rank whose collective broke raises: the other rank's interrupt or failure,
    or, when it left no notice, lost contact (it was killed)."""
    from pathtwt.errors import PathtwtError

    if other is not None and other.rank != me:
        return KeyboardInterrupt() if other.kind == "interrupted" else PathtwtError(f"{where}: stopped because {other.cause()}")
    return PathtwtError(
        f"{where}: lost contact with the other ranks ({_first_words(exc)}); a rank that ended without a line of its own "
        "was killed (out of memory, kill -9, a failed node: see the job's log), or was busy alone longer than --rank-timeout")
