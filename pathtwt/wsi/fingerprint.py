"""A slide's fingerprint, so that a coords file is only ever used with its own slide.

Tiling records, beside the geometry it already writes (``level0_width``,
``level0_height``, ``level0_mpp``), the reader's level count, the file size and a
sha256 of the file's first and last MiB plus its size (:func:`head_tail_sha256`): cheap
on a 3 GB slide (2 MiB read), and different for any two scans (their headers and tile
data differ) while unchanged when a slide is copied or moved. Extraction recomputes it
and refuses coords that belong to another file (``pathtwt extract --force`` for the
rare legitimate case, e.g. a slide re-saved losslessly with the same geometry).

The size and hash also make the slide's part of its tiles' store key
(:mod:`pathtwt.config.products`): :class:`FingerprintCache` keeps them by file identity, so
planning a cohort reads each slide's 2 MiB once, not at every plan.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any, Mapping

from pathtwt.errors import SlideError
from pathtwt.io.identity_cache import IdentityCache, file_identity

MIB = 1 << 20

# coords-file attributes that make up the fingerprint (with the geometry attrs above)
FINGERPRINT_ATTRS = ("slide_level_count", "slide_size_bytes", "slide_head_tail_sha256")


def head_tail_sha256(path: str | os.PathLike) -> tuple[int, str]:
    """(size in bytes, sha256 of the first MiB, the last MiB and the size in decimal)."""
    path = Path(path)
    if path.is_dir():  # a zarr store (OME-Zarr): its metadata and file sizes instead
        from pathtwt.wsi.ome_zarr import store_fingerprint

        return store_fingerprint(path)
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        h.update(fh.read(MIB))
        fh.seek(max(0, size - MIB))
        h.update(fh.read(MIB))
    h.update(str(size).encode())
    return size, h.hexdigest()


def slide_fingerprint(slide: Any) -> dict[str, Any]:
    """The fingerprint attributes of an open :class:`~pathtwt.wsi.slides.Slide`."""
    size, digest = head_tail_sha256(slide.path)
    return {
        "level0_width": int(slide.dimensions[0]),
        "level0_height": int(slide.dimensions[1]),
        "level0_mpp": float(slide.mpp),
        "slide_level_count": int(slide.level_count),
        "slide_size_bytes": int(size),
        "slide_head_tail_sha256": digest,
    }


def differences(recorded: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """'key recorded -> actual' for every fingerprint key ``recorded`` has and ``actual``
    disagrees with (keys a coords file lacks, e.g. from an older pathtwt, are not compared)."""
    out = []
    for key, value in actual.items():
        if key not in recorded or recorded[key] in (None, ""):
            continue
        old = recorded[key]
        if isinstance(value, float):
            same = math.isclose(float(old), value, rel_tol=1e-4)
        elif isinstance(value, int):
            same = int(old) == value
        else:
            same = str(old) == str(value)
        if not same:
            shown = (str(old)[:12], str(value)[:12]) if key == "slide_head_tail_sha256" else (old, value)
            out.append(f"{key} {shown[0]} vs {shown[1]}")
    return out


def check_coords_belong_to_slide(slide: Any, coords_path: str | os.PathLike, coords_attrs: Mapping[str, Any]) -> str:
    """Raise :class:`SlideError` naming both files when ``slide`` is not the slide the
    coords were made from. Returns how the match was established: "fingerprint" or
    "geometry" (an older coords file without the fingerprint attributes)."""
    diffs = differences(coords_attrs, slide_fingerprint(slide))
    if diffs:
        made_from = coords_attrs.get("slide_path") or "another slide"
        raise SlideError(
            f"{slide.path}: does not match the coords file {coords_path} (made from {made_from}): "
            f"{'; '.join(diffs)}; tile this slide again, or pass --force if it is the same scan re-saved"
        )
    return "fingerprint" if all(k in coords_attrs for k in FINGERPRINT_ATTRS) else "geometry"


class FingerprintCache:
    """:func:`head_tail_sha256` of many slides, kept by file identity
    (:class:`~pathtwt.io.identity_cache.IdentityCache`): one JSON file per slide folder
    under ``folder`` (None: nothing kept), written back by :meth:`save`. Zarr folders
    (OME-Zarr) are not kept (their own fingerprint reads their metadata)."""

    def __init__(self, folder: str | os.PathLike | None):
        self.folder = Path(folder) if folder is not None else None
        self._folders: dict[str, IdentityCache] = {}
        self.hashed = 0  # slides hashed (not found in the cache) since this object was made

    def get(self, path: str | os.PathLike) -> tuple[int, str]:
        """(size, sha256 of head, tail and size) of the slide at ``path``."""
        path = Path(os.path.abspath(path))
        if path.is_dir():
            return head_tail_sha256(path)
        identity = file_identity(path)
        kept = self._of(str(path.parent))
        digest = kept.value(path.name, identity)
        if digest is not None:
            return identity[2], str(digest)
        size, digest = head_tail_sha256(path)
        self.hashed += 1
        kept.put(path.name, identity, digest)
        return size, digest

    def _of(self, parent: str) -> IdentityCache:
        if parent not in self._folders:
            file = self.folder / f"{hashlib.sha256(parent.encode()).hexdigest()[:20]}.json" if self.folder else None
            self._folders[parent] = IdentityCache(file, scope=parent)
        return self._folders[parent]

    def save(self) -> None:
        """Write back the folders whose slides were hashed."""
        for kept in self._folders.values():
            kept.save()
