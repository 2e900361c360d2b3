"""Measured extraction throughput, for the report's cost columns.

Every features file records, as root attrs, the wall time of its extraction
(``extract_seconds``: tile reading, decoding and the forward passes, as a user waits for
it), the backbone's own share (``embed_seconds``: forward passes only) and the conditions
it ran in (``device``, ``gpu_name``, ``torch_threads``). Summed over a set of files (one
extraction job's) they give tiles/s; per-slide start-up is inside the wall time, so small
slides lower the first number more than the second.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable


def _files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(q for q in p.glob("*.h5") if not q.name.startswith(".")) if p.is_dir() else [p]
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def extraction_throughput(paths: Iterable[str | os.PathLike]) -> dict[str, Any]:
    """Tiles, seconds and tiles/s summed over features files (or folders of them), with
    the devices and CPU threads they were extracted on and their precisions. Files from a
    failed extraction or without the timing attrs (older pathtwt) are left out of the
    timing and counted in ``untimed``; tiles/s is None when nothing was timed. An
    unreadable file is counted in ``unreadable`` (it is its extract job's problem)."""
    import h5py

    tiles = slides = untimed = unreadable = 0
    seconds = embed = 0.0
    devices: set[str] = set()
    threads: set[int] = set()
    precisions: list[str] = []
    for path in _files(paths):
        try:
            with h5py.File(path, "r") as f:
                attrs = f.attrs
                if attrs.get("precision") is not None and _text(attrs["precision"]) not in precisions:
                    precisions.append(_text(attrs["precision"]))
                if "extract_seconds" not in attrs or _text(attrs.get("status", "ok")) == "failed":
                    untimed += 1
                    continue
                tiles += int(f["features"].shape[0])
                seconds += float(attrs["extract_seconds"])
                embed += float(attrs.get("embed_seconds", 0.0))
                slides += 1
                # a GPU by its name; a CPU device by its torch name ("cpu")
                device = _text(attrs.get("gpu_name", "")) or _text(attrs.get("device", ""))
                if device:
                    devices.add(device)
                if attrs.get("torch_threads") is not None:
                    threads.add(int(attrs["torch_threads"]))
        except OSError:
            unreadable += 1
    return {
        "slides": slides,
        "tiles": tiles,
        "seconds": seconds,
        "embed_seconds": embed,
        "tiles_per_s": tiles / seconds if seconds > 0 else None,
        "embed_tiles_per_s": tiles / embed if embed > 0 else None,
        "untimed": untimed,
        "unreadable": unreadable,
        "devices": sorted(devices),
        "threads": sorted(threads),
        "precisions": precisions,
    }
