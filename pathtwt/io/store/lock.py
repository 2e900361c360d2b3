"""Locks on store entries: one writer makes an entry while any other waits for it.

A lock is a file created with O_EXCL in ``{store}/.locks/`` (exclusive creation holds on
local disks and on the shared file systems of clusters, NFS and Lustre, where fcntl locks
may be refused): it names the host and process of its holder and the holder's heartbeat
file. The holder touches its heartbeat (one file per process and store, however many locks
it holds) every :data:`HEARTBEAT_S` seconds from a background thread. A lock is stale when
its holder is a process of this host that is gone, or when its heartbeat has not moved for
:data:`STALE_S` seconds (a holder on another node that died with its node); a stale lock is
broken by renaming it away, which only one breaker can do, and taken anew.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

from pathtwt.errors import StoreError
from pathtwt.io.atomic import _alive
from pathtwt.io.store.layout import Store

HEARTBEAT_S = 30.0
STALE_S = 300.0  # well above a heartbeat and any clock difference between nodes
POLL_S = 2.0


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"


class _Heartbeat:
    """This process's heartbeat files (one per store), touched by one daemon thread."""

    def __init__(self) -> None:
        self._files: dict[Path, Path] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def file(self, locks: Path) -> Path:
        with self._lock:
            if locks not in self._files:
                alive = locks / "alive" / f"{_host()}-{os.getpid()}-{time.time_ns()}"
                alive.parent.mkdir(parents=True, exist_ok=True)
                alive.touch()
                self._files[locks] = alive
                if len(self._files) == 1:
                    atexit.register(self._remove)
            if self._thread is None:
                self._thread = threading.Thread(target=self._beat, name="store-heartbeat", daemon=True)
                self._thread.start()
            return self._files[locks]

    def _remove(self) -> None:
        for alive in self._files.values():
            with contextlib.suppress(OSError):
                alive.unlink()

    def _beat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            with self._lock:
                files = list(self._files.values())
            for alive in files:
                with contextlib.suppress(OSError):
                    os.utime(alive)


HEARTBEAT = _Heartbeat()


class EntryLock:
    """The lock of the entry at ``entry`` (a path in ``store``)."""

    def __init__(self, store: Store, entry: Path):
        self.store, self.entry = store, Path(entry)
        relative = os.path.relpath(os.path.abspath(entry), os.path.abspath(store.root))
        self.path = store.locks / (relative.replace(os.sep, "+") + ".lock")
        self.held = False

    def try_acquire(self) -> bool:
        """Take the lock if it is free (or stale); True when taken."""
        for _ in range(3):  # a stale lock broken, then taken: at most a few turns
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if not self._break_if_stale():
                    return False
                continue
            except OSError as exc:
                raise StoreError(f"{self.entry}: cannot take its lock {self.path} ({exc.strerror}); make the store "
                                 "writable, or name another folder with the config's store: key") from None
            info = {"host": _host(), "pid": os.getpid(), "since": time.time(), "heartbeat": str(HEARTBEAT.file(self.store.locks))}
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(info, fh)
            self.held = True
            return True
        return False

    def acquire(self, say: Callable[[str], Any] | None = None, poll: float = POLL_S) -> None:
        """Take the lock, waiting while another live writer holds it (said once through ``say``)."""
        said = False
        while not self.try_acquire():
            if say is not None and not said:
                holder = self.holder() or {}
                say(f"{self.entry}: being made by {holder.get('host', '?')} process {holder.get('pid', '?')}; waiting")
                said = True
            time.sleep(poll)

    def release(self) -> None:
        if self.held:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self.held = False

    def __enter__(self) -> "EntryLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def holder(self) -> dict[str, Any] | None:
        """Who holds the lock (host, pid, since, heartbeat), or None when it is free."""
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # being written by its taker this instant: held

    def is_free(self) -> bool:
        """True when no live writer holds the lock."""
        holder = self.holder()
        return holder is None or _stale(holder, self.path)

    def _break_if_stale(self) -> bool:
        holder = self.holder()
        if holder is None:
            return True  # released meanwhile: try again
        if not _stale(holder, self.path):
            return False
        broken = self.path.with_name(f".broken-{self.path.name}-{_host()}-{os.getpid()}-{time.time_ns()}")
        try:
            os.rename(self.path, broken)  # one breaker wins; the others find the lock gone or new
        except FileNotFoundError:
            return True
        with contextlib.suppress(OSError):
            broken.unlink()
        return True


def _stale(holder: dict[str, Any], path: Path) -> bool:
    if not holder:
        # unreadable: being written now, unless it has stayed so for a heartbeat's timeout
        try:
            return time.time() - path.stat().st_mtime > STALE_S
        except OSError:
            return True
    if holder.get("host") == _host() and not _alive(int(holder.get("pid", -1))):
        return True
    # a live process of another host, or of this one under a reused pid: by its heartbeat
    try:
        return time.time() - Path(holder["heartbeat"]).stat().st_mtime > STALE_S
    except (OSError, KeyError):
        return True


def stale_heartbeats(store: Store) -> list[Path]:
    """Heartbeat files of writers that are gone (killed before they could remove theirs):
    not touched for :data:`STALE_S` seconds."""
    folder = store.locks / "alive"
    try:
        beats = list(folder.iterdir())
    except FileNotFoundError:
        return []
    now = time.time()
    out = []
    for path in beats:
        try:
            if now - path.stat().st_mtime > STALE_S:
                out.append(path)
        except FileNotFoundError:
            continue
    return out
