"""What `pathtwt check-config` reads of a labelled slide before any job runs: the slide
opened as tiling opens it (its header, pixel size, colour and a few probe regions), its
tissue found and tiled as ``pathtwt tile`` would (which gives the number of tiles the
slide holds), and one of those tiles read at the level extraction reads it. A slide that
would fail later fails here, with its reader's reason.

The result is keyed by the slide's fingerprint (:mod:`pathtwt.wsi.fingerprint`: its size
and the hash of its first and last MiB) and the settings, so a cache can skip a slide
checked before, under any path, until its bytes change.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pathtwt.errors import PathtwtError

# bumped when what a check reads or records changes, so older cached results are not reused
CHECK_FORMAT = "pathtwt-slide-check/1"


@dataclass(frozen=True)
class TilingSettings:
    """A cohort's settings that decide how its slides are opened and tiled."""

    target_mpp: float
    tile_size: int
    tissue: str
    min_tissue: float | None
    mpp_fallback: float | None = None
    channels: tuple[int, ...] | None = None
    modality: str | None = None
    allow_upsample: bool = False


def cache_key(fingerprint: tuple[int, str], settings: TilingSettings) -> str:
    """The key of a slide's check: its fingerprint (size, head and tail hash) and the settings."""
    blob = json.dumps({"format": CHECK_FORMAT, "size": fingerprint[0], "sha256": fingerprint[1],
                       "settings": asdict(settings)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def check_slide(path: str | os.PathLike, settings: TilingSettings) -> dict[str, Any]:
    """``{"error": None, "tiles": N, "read_level": L, "mpp": m}`` for a slide that opens, tiles
    and reads (N: the tiles ``pathtwt tile`` keeps), or ``{"error": "<one line>"}``."""
    from pathtwt.wsi.slides import open_slide
    from pathtwt.wsi.tiling import tile_slide

    channels = settings.channels
    if settings.modality == "fluorescence" and not channels:
        channels = (0, 1, 2)  # as `pathtwt tile` reads a fluorescence scan stored as RGB
    try:
        with open_slide(path, mpp_fallback=settings.mpp_fallback, channel_map=channels) as slide:
            tiling = tile_slide(slide, target_mpp=settings.target_mpp, tile_size=settings.tile_size,
                                tissue=settings.tissue, min_tissue=settings.min_tissue, modality=settings.modality,
                                allow_upsample=settings.allow_upsample)
            side, level = int(tiling.attrs["patch_size_level0"]), int(tiling.attrs["read_level"])
            if len(tiling.coords):  # a tissue tile from the middle of the list, as extraction reads it
                xy = tiling.coords[len(tiling.coords) // 2 : len(tiling.coords) // 2 + 1]
                slide.read_tiles(xy, side, level, settings.tile_size)
            return {"error": None, "tiles": int(len(tiling.coords)), "read_level": level, "mpp": float(slide.mpp)}
    except PathtwtError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a reader library's own failure on a damaged file, in one line
        return {"error": f"{path}: cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())})"}


def moved(result: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """A cached ``result`` of the slide at ``old`` for the same bytes at ``new``: its error names the new path."""
    if result.get("error") and old != new:
        return dict(result, error=result["error"].replace(old, new))
    return result


def cached_check(path: str | os.PathLike, settings: TilingSettings, cache: Path | None) -> dict[str, Any]:
    """:func:`check_slide` through a folder of results keyed by :func:`cache_key` (None: no cache)."""
    from pathtwt.wsi.fingerprint import head_tail_sha256

    path = str(path)
    try:
        fingerprint = head_tail_sha256(path)
    except OSError as exc:
        return {"error": f"{path}: cannot be read ({exc.strerror})"}
    entry = cache / f"{cache_key(fingerprint, settings)}.json" if cache is not None else None
    if entry is not None:
        try:
            stored = json.loads(entry.read_text(encoding="utf-8"))
            return moved(stored["result"], stored["path"], path)
        except (OSError, ValueError, KeyError):
            pass  # not checked before (or an unreadable entry): check it now
    result = check_slide(path, settings)
    if entry is not None:
        from pathtwt.io.atomic import write_json_atomic

        try:
            write_json_atomic(entry, {"path": path, "result": result})
        except (OSError, PathtwtError):
            pass  # a cache that cannot be written only costs the next run its time
    return result
