"""Failures tables: the slides a stage gave up on, and why.

One line per failure: ``slide<TAB>stage<TAB>reason<TAB>time`` (UTC, ISO 8601), under a
header line. Every job writes its own table (one writer per file: no locks, no shared
appends, which network file systems such as Lustre do not make safe), rewritten whole
under a temporary name and renamed at each failure, so a reader never sees half a
line. In the workflow each extraction job's table lies beside its log; a cohort's
``failures.tsv`` is written from its slides' store entries, which record each failure
(:func:`pathtwt.io.store.views.features_view`).
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from pathtwt.errors import PathtwtError
from pathtwt.io.atomic import write_text_atomic

FIELDS = ("slide", "stage", "reason", "time")
HEADER = "\t".join(FIELDS) + "\n"


@dataclass(frozen=True)
class Failure:
    slide: str
    stage: str
    reason: str
    time: str

    def line(self) -> str:
        return "\t".join((self.slide, self.stage, self.reason, self.time)) + "\n"


def _clean(text: object) -> str:
    # one field, one line: tabs and newlines would break the table
    return " ".join(str(text).split())


def write_failures(path: str | os.PathLike, failures: Iterable[Failure]) -> None:
    """The whole table (header only when ``failures`` is empty), written atomically."""
    write_text_atomic(path, HEADER + "".join(f.line() for f in failures))


def record_failure(path: str | os.PathLike, *, slide: str, stage: str, reason: str, when: str | None = None) -> Failure:
    """Add one failure to the job's own table ``path`` (created with its header if
    absent) and return it. Not for tables several processes write at once: give each
    job its own file."""
    stamp = when or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    failure = Failure(slide=_clean(slide), stage=_clean(stage), reason=_clean(reason) or "unknown", time=_clean(stamp))
    write_failures(path, read_failures(path) + [failure])
    return failure


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
    complete = lines[:-1]  # the last piece is "" or an unterminated line (not written by this module)
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
