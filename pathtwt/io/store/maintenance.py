"""What a store holds, how much space it takes, and pruning what no named study uses.

An entry is named ``KIND/KEY`` (``tiles/T``, ``calibration/C``, ``discovery/D``,
``models/M``, ``features/E`` for an extractor's folder), a slide's features
``features/E/T`` and a job's set ``features/E/sets/S``. Unfinished work (a folder being
built, a file entry without its record, a lock) is listed as such and never taken for an
entry; pruning leaves alone whatever a live writer holds.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from pathtwt.errors import StoreError
from pathtwt.io.store.layout import RECORD, Store
from pathtwt.io.store.lock import EntryLock
from pathtwt.io.store.records import read_record


@dataclass
class Entry:
    """One entry (or unfinished work: ``done`` False) and its files."""

    name: str
    kind: str
    files: list[Path]
    record: dict[str, Any] | None = None
    done: bool = True
    slides: int = 0  # an extractor's folder: its slides' features files
    size: int = field(default=0)

    def __post_init__(self) -> None:
        self.size = sum(_disk_bytes(p) for p in self.files)


def _disk_bytes(path: Path) -> int:
    try:
        if path.is_dir() and not path.is_symlink():
            return sum(_disk_bytes(p) for p in path.iterdir())
        return path.lstat().st_blocks * 512
    except OSError:
        return 0


def _names(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except FileNotFoundError:
        return []


def scan(store: Store) -> Iterator[Entry]:
    """Every entry of ``store`` and every piece of unfinished work, by kind."""
    for kind in ("tiles", "calibration"):
        yield from _file_entries(store.root / kind, kind)
    for kind in ("discovery", "models"):
        for name in _names(store.root / kind):
            folder = store.root / kind / name
            done = not name.startswith(".") and (folder / RECORD).is_file()
            yield Entry(f"{kind}/{name}", kind, [folder], _record(folder / RECORD) if done else None, done)
    for name in _names(store.root / "features"):
        yield from _extractor(store.root / "features" / name)


def _file_entries(folder: Path, kind: str) -> Iterator[Entry]:
    groups: dict[str, list[Path]] = {}
    for name in _names(folder):
        key = name.lstrip(".").split(".")[0]
        groups.setdefault(key, []).append(folder / name)
    for key, files in groups.items():
        done = (folder / f"{key}.json").is_file()
        yield Entry(f"{kind}/{key}", kind, files, _record(folder / f"{key}.json") if done else None, done)


def _extractor(folder: Path) -> Iterator[Entry]:
    """An extractor's folder (its size is that of all its slides' features), then each
    slide's features and each set in it."""
    name = folder.name
    if name.startswith(".") or not folder.is_dir():
        yield Entry(f"features/{name}", "features", [folder], done=False)
        return
    slides = [folder / n for n in _names(folder) if n.endswith(".h5") and not n.startswith(".")]
    yield Entry(f"features/{name}", "features", [folder], _record(folder / RECORD), (folder / RECORD).is_file(),
                slides=len(slides))
    for path in slides:
        yield Entry(f"features/{name}/{path.stem}", "slide-features", [path])
    for set_name in _names(folder / "sets"):
        path = folder / "sets" / set_name
        yield Entry(f"features/{name}/sets/{path.stem}", "features-set", [path], done=not set_name.startswith("."))


def _record(path: Path) -> dict[str, Any] | None:
    try:
        return read_record(path)
    except StoreError:
        return None


def describe(entry: Entry) -> str:
    """A few words on what an entry is, from its record's names and inputs."""
    if not entry.done:
        return "unfinished (being made, or left by a job that was stopped)"
    if entry.record is None:
        return "" if entry.kind in ("slide-features", "features-set") else "no readable record"
    made, inputs = entry.record.get("made") or {}, entry.record.get("inputs") or {}
    if entry.kind == "tiles":
        tiling = inputs.get("tiling") or {}
        return (f"{made.get('cohort', '?')}/{made.get('slide', '?')}: {tiling.get('tile_size', 0):g} px at "
                f"{tiling.get('target_mpp', 0):g} um/px")
    if entry.kind == "features":
        settings = inputs.get("settings") or {}
        return (f"{made.get('backbone', '?')}/{made.get('variant', '?')}: {entry.slides} slide(s), "
                f"precision {settings.get('precision')}, {settings.get('embedding')}")
    who = made.get("backbone", "?") + (f"/{made['variant']}" if made.get("variant") else "")
    return f"{who} (study {made.get('study', '?')})"


def list_lines(store: Store) -> list[str]:
    """``pathtwt store ls``: one line per entry (a slide's features counted in its extractor's line)."""
    lines = []
    for entry in scan(store):
        if entry.kind in ("slide-features", "features-set"):
            continue
        made = ((entry.record or {}).get("made") or {}).get("time", "")
        lines.append(f"{entry.name}\t{_human(entry.size)}\t{made}\t{describe(entry)}")
    return lines


def usage(store: Store) -> dict[str, tuple[int, int]]:
    """Kind -> (entries, bytes on disk), features by extractor folder; unfinished work
    (folders being built, files without their record) under ``unfinished``."""
    totals: dict[str, list[int]] = {}
    for entry in scan(store):
        if entry.kind in ("slide-features", "features-set"):
            continue  # counted in their extractor's folder
        total = totals.setdefault(entry.kind if entry.done else "unfinished", [0, 0])
        total[0] += 1
        total[1] += entry.size
    return {k: (v[0], v[1]) for k, v in totals.items()}


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def unused(store: Store, keep: Iterable[str]) -> list[Entry]:
    """The entries (and unfinished work) no name of ``keep`` names and no live writer
    holds. An extractor's folder goes whole when none of its slides is kept; in one that is
    kept, the slides and sets ``keep`` does not name."""
    keep = set(keep)
    kept_extractors = {name.split("/")[1] for name in keep if name.startswith("features/")}
    locks = _names(store.locks)
    out = []
    for entry in scan(store):
        extractor = entry.name.split("/")[1] if entry.name.startswith("features/") else None
        if entry.name in keep or (entry.kind == "features" and entry.done and extractor in kept_extractors):
            continue
        if entry.kind in ("slide-features", "features-set") and extractor not in kept_extractors:
            continue  # removed with their extractor's folder
        if not _held(store, entry, locks):
            out.append(entry)
    return out


def _held(store: Store, entry: Entry, locks: list[str]) -> bool:
    """True when a live writer holds a lock on the entry or on anything in it (for unfinished
    work, on the entry it is for)."""
    path = entry.files[0]
    name = path.name
    if name.startswith("."):
        name = name[1:].split(".build")[0].split(".stale-")[0].split(".tmp-")[0]
    elif entry.kind in ("tiles", "calibration"):
        name = f"{name.split('.')[0]}.json"
    prefix = os.path.relpath(os.path.abspath(path.with_name(name)), os.path.abspath(store.root)).replace(os.sep, "+")
    for lock in locks:
        if lock == f"{prefix}.lock" or lock.startswith(f"{prefix}+") or lock.startswith(f"{prefix}."):
            if not EntryLock(store, store.root / lock[: -len(".lock")].replace("+", os.sep)).is_free():
                return True
    return False


def remove(entries: Iterable[Entry]) -> tuple[int, list[str]]:
    """Delete the entries' files (record first, so an entry is never seen half removed):
    the bytes freed (of an entry that could not be removed whole, what did go), and one
    line per entry that could not be removed, naming it and what to do."""
    freed, failed = 0, []
    for entry in entries:
        records = [p for p in entry.files if p.suffix == ".json"]
        try:
            for path in records + [p for p in entry.files if p not in records]:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
        except OSError as exc:
            left = [p for p in entry.files if os.path.lexists(p)]
            if left:  # (nothing left: another process removed it meanwhile)
                freed += max(entry.size - sum(_disk_bytes(p) for p in left), 0)
                failed.append(f"{entry.name} could not be removed ({exc.strerror or exc}); remove "
                              f"{' '.join(str(p) for p in left)} by hand, or run pathtwt store gc again")
                continue
        freed += entry.size
    return freed, failed
