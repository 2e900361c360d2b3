"""A cohort's extraction into the store: every slide's features file is an entry of its own,
published by the extraction (by rename) as soon as that slide is done, and the job's own
entry, the set (``features/{E}/sets/{S}.json``), is published once all its slides are.

A job claims each slide it is to embed (the slide entry's lock) and hands the extraction
only those it holds: a slide being embedded by another run (another study, another
checkout, over the same store) is left to it and waited for, a slide published meanwhile is
skipped, and one whose embedder died is claimed and embedded. So no slide is embedded twice
at once, a job killed at slide k keeps the k - 1 slides before it, and its next run embeds
only the rest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pathtwt.errors import StoreError
from pathtwt.io.atomic import write_json_atomic
from pathtwt.io.store.layout import RECORD, Store
from pathtwt.io.store.lock import POLL_S, EntryLock
from pathtwt.io.store.make import ensure_record
from pathtwt.io.store.records import read_checked


@dataclass(frozen=True)
class SlideJob:
    """A slide to embed: the slide file, its tiles entry's coords file, its features entry."""

    slide: str
    coords: str
    out: Path


def make_features_set(store: Store, set_path: Path, set_record: Mapping[str, Any], extractor_record: Mapping[str, Any],
                      jobs: Sequence[SlideJob], embed: Callable[[list[SlideJob]], int],
                      say: Callable[[str], Any] = print, poll: float = POLL_S) -> int:
    """Embed the slides of ``jobs`` whose entries are missing (``embed`` gets those this run
    holds and returns an exit status), then publish the set; 0 when all are there."""
    store.ensure()
    ensure_record(store, set_path.parent.parent / RECORD, extractor_record)
    lock = EntryLock(store, set_path)
    lock.acquire(say=say, poll=poll)
    try:
        if set_path.is_file() and all(job.out.exists() for job in jobs):
            read_checked(set_path, kind=set_record["kind"], key=set_record["key"])
            say(f"{set_path}: made by another run meanwhile; used as it is")
            return 0
        while True:
            pending = [job for job in jobs if not job.out.exists()]
            if not pending:
                break
            status = _embed_claimed(store, pending, embed, say, poll)
            if status:
                return status
        write_json_atomic(set_path, set_record)
        return 0
    finally:
        lock.release()


def _embed_claimed(store: Store, pending: Sequence[SlideJob], embed: Callable[[list[SlideJob]], int],
                   say: Callable[[str], Any], poll: float) -> int:
    """One round: embed the pending slides this run can claim, then wait for the others."""
    mine: list[tuple[SlideJob, EntryLock]] = []
    theirs: list[EntryLock] = []
    for job in pending:
        claim = EntryLock(store, job.out)
        if not claim.try_acquire():
            theirs.append(claim)
        elif job.out.exists():  # published between the look and the claim
            claim.release()
        else:
            mine.append((job, claim))
    try:
        if mine:
            say(f"embedding {len(mine)} of {len(pending)} missing slide(s)"
                + (f"; {len(theirs)} being embedded by another run" if theirs else ""))
            status = embed([job for job, _ in mine])
            if status:
                return status
            left = [str(job.out) for job, _ in mine if not job.out.exists()]
            if left:
                raise StoreError(f"{left[0]}: the extraction ended without writing it ({len(left)} slide(s) in all); "
                                 "see the job's log")
    finally:
        for _, claim in mine:
            claim.release()
    if theirs and not mine:
        say(f"waiting for {len(theirs)} slide(s) being embedded by another run")
    while theirs:
        theirs = [claim for claim in theirs if not claim.is_free()]
        if theirs:
            time.sleep(poll)
    return 0


def read_manifest_rows(path: str | Path) -> list[SlideJob]:
    """A workflow extraction manifest: ``slide<TAB>coords<TAB>features`` per line."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            slide, coords, out = line.split("\t")
            rows.append(SlideJob(slide, coords, Path(out)))
    return rows


def write_manifest_rows(path: str | Path, jobs: Sequence[SlideJob]) -> None:
    from pathtwt.io.atomic import write_text_atomic

    write_text_atomic(path, "".join(f"{j.slide}\t{j.coords}\t{j.out}\n" for j in jobs))
