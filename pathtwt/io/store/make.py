"""Making one entry: under its lock, unless another run made it meanwhile, run the command
that makes it, check that it left what the entry holds, and publish it.

A folder entry (discovery, a model) is made in a hidden build folder beside it
(:meth:`Store.building`), kept between attempts so a command that resumes finds its files
again, then renamed into place with its record inside. A file entry (a slide's tiles,
calibration tiles) is written by the command itself, file by file by rename, and published
by its record, written last. A command that fails, is killed or meets a full disk leaves no
record: the entry is not there, and the next run makes it again.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pathtwt.errors import StoreError
from pathtwt.io.atomic import _fsync_dir, write_json_atomic
from pathtwt.io.store.layout import RECORD, Store
from pathtwt.io.store.lock import EntryLock
from pathtwt.io.store.records import read_checked


@dataclass(frozen=True)
class Target:
    """An entry to make: ``entry`` (a folder, or a file entry's record), the files the
    command must leave (in the build folder, or in place), and its record. ``own_record``
    False: the entry is the file the command writes, and its record is shared and written
    beforehand (a slide's features: its extractor's, :func:`ensure_record`)."""

    entry: Path
    record: Mapping[str, Any]
    files: Sequence[Path] = field(default_factory=tuple)
    folder: bool = False
    own_record: bool = True

    @property
    def record_path(self) -> Path:
        return self.entry / RECORD if self.folder else self.entry

    @property
    def build(self) -> Path | None:
        return Store.building(self.entry) if self.folder else None

    def published(self) -> bool:
        """Its record is there (and, for a file entry, its files: one deleted by hand is made
        again); an entry without a record of its own: the file is there."""
        if not self.own_record:
            return self.entry.exists()
        return self.record_path.is_file() and (self.folder or all(f.exists() for f in self.files))


def make_entry(store: Store, target: Target, run: Callable[[], int], *, check: Callable[[], None] | None = None,
               say: Callable[[str], Any] = print) -> int:
    """Make ``target`` with ``run`` (returns an exit status) under the entry's lock; 0 also
    when another run made it meanwhile (its record checked, said through ``say``). ``check``
    runs under the lock before ``run``: the job-time checks of the entry's inputs (a slide
    or weights file changed since the plan raises StoreError)."""
    store.ensure()
    lock = EntryLock(store, target.entry)
    lock.acquire(say=say)
    try:
        if target.published():
            if target.own_record:
                read_checked(target.record_path, kind=target.record["kind"], key=target.record["key"])
            say(f"{target.entry}: made by another run meanwhile; used as it is")
            return 0
        if check is not None:
            check()
        if target.folder:
            target.build.mkdir(parents=True, exist_ok=True)
        status = run()
        if status:
            return status
        missing = [str(f) for f in target.files if not f.exists()]
        if missing:
            raise StoreError(f"{target.entry}: its command left no {', '.join(missing)}; the entry is not made "
                             "(see the job's log)")
        if target.folder:
            write_json_atomic(target.build / RECORD, target.record)
            publish_folder(target.build, target.entry)
        elif target.own_record:
            write_json_atomic(target.record_path, target.record)
        return 0
    finally:
        lock.release()


def publish_folder(build: Path, final: Path) -> None:
    """Rename the built folder into place. ``final`` may be an empty folder (Snakemake makes
    the folders of a job's outputs before it starts); anything else there is not a
    published entry (its lock is held by this writer) and is set aside and removed."""
    try:
        os.rename(build, final)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        aside = final.with_name(f".{final.name}.stale-{time.time_ns()}")
        os.rename(final, aside)
        os.rename(build, final)
        shutil.rmtree(aside, ignore_errors=True)
    _fsync_dir(final.parent)


def ensure_record(store: Store, path: Path, record: Mapping[str, Any]) -> None:
    """Write a shared record (an extractor's) if it is not there, else check it: two
    writers of the same record write the same text, each by rename."""
    if path.is_file():
        read_checked(path, kind=record["kind"], key=record["key"])
        return
    store.ensure()
    write_json_atomic(path, record)


def run_command(command: Sequence[str]) -> int:
    """Run ``command`` (its output goes where this process's goes); its exit status."""
    import subprocess

    try:
        return subprocess.run(list(command), check=False).returncode
    except OSError as exc:
        raise StoreError(f"{command[0]}: cannot be run ({exc.strerror})") from None

