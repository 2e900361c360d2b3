"""Measured extraction throughput of a backbone variant, for the report's cost columns.

Every features file records, as root attrs, the wall time of its extraction
(``extract_seconds``: tile reading, decoding and the forward passes, as a user waits for
it) and the backbone's own share (``embed_seconds``: forward passes only). Summed over
a variant's files they give tiles/s beside its params and MACs; per-slide start-up
(DataLoader workers) is inside the wall time, so small slides lower the first number
more than the second.
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


def extraction_throughput(paths: Iterable[str | os.PathLike]) -> dict[str, Any]:
    """Tiles, seconds and tiles/s summed over features files (or folders of them). Files
    from a failed extraction or without the timing attrs (older pathtwt) are left out and
    counted in ``untimed``; tiles/s is None when nothing was timed."""
    import h5py

    tiles = slides = untimed = 0
    seconds = embed = 0.0
    for path in _files(paths):
        with h5py.File(path, "r") as f:
            attrs = f.attrs
            if "extract_seconds" not in attrs or str(attrs.get("status", "ok")) == "failed":
                untimed += 1
                continue
            tiles += int(f["features"].shape[0])
            seconds += float(attrs["extract_seconds"])
            embed += float(attrs.get("embed_seconds", 0.0))
            slides += 1
    return {
        "slides": slides,
        "tiles": tiles,
        "seconds": seconds,
        "embed_seconds": embed,
        "tiles_per_s": tiles / seconds if seconds > 0 else None,
        "embed_tiles_per_s": tiles / embed if embed > 0 else None,
        "untimed": untimed,
    }


def variant_throughput(results: str | os.PathLike, backbone: str, variant: str) -> dict[str, Any]:
    """:func:`extraction_throughput` over every cohort of
    ``results/features/{backbone}/{variant}/``, with the per-cohort numbers under
    ``cohorts``."""
    root = Path(results) / "features" / backbone / variant
    cohorts = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    total = extraction_throughput(cohorts)
    total["cohorts"] = {p.name: extraction_throughput([p]) for p in cohorts}
    return total
