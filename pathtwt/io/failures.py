"""A per-cohort ``failures.tsv``: the slides a stage gave up on, and why.

One line per failure: ``slide<TAB>stage<TAB>reason<TAB>time`` (UTC, ISO 8601), under a
header line. Several jobs of a cohort (Snakemake runs them in parallel, on one machine
or on cluster nodes sharing a filesystem) append to the same file, so each append holds
an exclusive lock on a hidden lock file beside it and writes its line with one
``write`` on a descriptor opened with O_APPEND, then fsyncs. Lines never interleave,
the header is written once, and a job killed mid-write leaves at most an unterminated
last line, which :func:`read_failures` ignores.

The file is a log that grows by appends, which is why it is not published with
``atomic_output`` like the stages' results: a rename would lose the lines other jobs
append in the meantime.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from pathtwt.errors import PathtwtError

FIELDS = ("slide", "stage", "reason", "time")
HEADER = "\t".join(FIELDS) + "\n"


@dataclass(frozen=True)
class Failure:
    slide: str
    stage: str
    reason: str
    time: str


def _clean(text: object) -> str:
    # one field, one line: tabs and newlines would break the table
    return " ".join(str(text).split())


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock = path.parent / f".{path.name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def record_failure(path: str | os.PathLike, *, slide: str, stage: str, reason: str, when: str | None = None) -> Failure:
    """Append one failure to ``path`` (created with its header if absent) and return it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = when or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    failure = Failure(slide=_clean(slide), stage=_clean(stage), reason=_clean(reason) or "unknown", time=_clean(stamp))
    line = "\t".join((failure.slide, failure.stage, failure.reason, failure.time)) + "\n"
    with _locked(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            size = os.fstat(fd).st_size
            if size and not _ends_with_newline(path, size):
                line = "\n" + line  # a killed writer left half a line: start a fresh one
            data = ((HEADER if size == 0 else "") + line).encode("utf-8")
            if os.write(fd, data) != len(data):
                raise OSError(f"short write to {path}")
            os.fsync(fd)
        finally:
            os.close(fd)
    return failure


def _ends_with_newline(path: Path, size: int) -> bool:
    with open(path, "rb") as fh:
        fh.seek(size - 1)
        return fh.read(1) == b"\n"


def read_failures(path: str | os.PathLike) -> list[Failure]:
    """Every complete failure line of ``path``, oldest first; [] when it does not exist."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise PathtwtError(f"{path}: cannot read the failures table ({exc.strerror})") from None
    lines = text.split("\n")
    complete = lines[:-1]  # the last piece is "" or a line a killed writer left unterminated
    if not complete:
        return []
    if complete[0] != HEADER.rstrip("\n"):
        raise PathtwtError(f"{path}: not a failures table (first line is not {HEADER.strip()!r})")
    out = []
    for line in complete[1:]:
        fields = line.split("\t")
        if len(fields) == len(FIELDS):
            out.append(Failure(*fields))
    return out


def failed_slides(path: str | os.PathLike, stage: str | None = None) -> dict[str, str]:
    """slide -> reason of its latest failure (of ``stage`` only, when given)."""
    return {f.slide: f.reason for f in read_failures(path) if stage is None or f.stage == stage}
