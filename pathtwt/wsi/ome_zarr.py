"""OME-Zarr (OME-NGFF multiscale images, versions 0.1-0.5) as slides.

An OME-Zarr slide is a folder (``*.zarr``, ``*.ome.zarr``): a zarr group whose
``multiscales`` metadata lists one array per pyramid level (``datasets``, finest first),
each with a ``scale`` coordinate transformation in the units of its ``axes``.
:class:`OmeZarrHandle` reads that metadata and answers the calls
:class:`pathtwt.wsi.slides.Slide` makes of a reader handle (``level_count``,
``level_dimensions``, ``level_downsamples``, ``properties``, ``read_region(...,
as_array=True)``, ``close``), so tiling, extraction and prediction read it like any slide.
zarr reads only the chunks a region overlaps.

- Levels: a level's downsample is its x scale over level 0's (the writer's own factor,
  e.g. exactly 2.0, rather than a ratio of rounded sizes).
- Pixel size: the x axis scale of level 0 (with any scale given for the whole
  multiscale), converted from the axis' unit to micrometres; stored in the handle's
  properties as :data:`MPP_KEY`. An axis without a unit states no physical size, so the
  slide then needs ``--slide-mpp`` (the cohort's ``mpp_fallback``).
- Axes: any of t, c, z, y, x (NGFF order), or y, x, c; t and z are read at index 0.
  Pixels must be 8-bit RGB (three channels): the pipeline is for brightfield slides.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from pathtwt.errors import SlideError

MPP_KEY = "ome-zarr.mpp-x"  # level-0 microns per pixel, as read from the multiscales metadata

# NGFF space units in micrometres (the spec's UDUNITS-2 names)
_UNITS = {
    "angstrom": 1e-4, "nanometer": 1e-3, "micrometer": 1.0, "micron": 1.0, "millimeter": 1e3,
    "centimeter": 1e4, "meter": 1e6, "µm": 1.0, "um": 1.0, "nm": 1e-3, "mm": 1e3,
}
# axes of NGFF 0.1-0.3 images that state none: always five dimensions in this order
_DEFAULT_AXES = ("t", "c", "z", "y", "x")
# the metadata files of a zarr v2 or v3 group or array
_METADATA = (".zattrs", ".zgroup", ".zarray", "zarr.json")

HOW_TO_WRITE = (
    "write NGFF multiscales metadata (e.g. with ome-zarr-py, bioformats2raw or QuPath's OME-Zarr export)"
)


def _attributes(group: Any) -> Mapping[str, Any]:
    attrs = dict(group.attrs)
    # NGFF 0.5 (zarr v3) keeps its metadata under "ome"
    return attrs.get("ome", attrs) if isinstance(attrs.get("ome"), Mapping) else attrs


def _axes(multiscale: Mapping[str, Any], ndim: int, path: Path) -> tuple[list[str], list[str | None]]:
    """(axis names, units) of the level arrays."""
    axes = multiscale.get("axes")
    if axes is None:
        names, units = list(_DEFAULT_AXES[-ndim:]), [None] * ndim
    else:
        names = [str(a.get("name") if isinstance(a, Mapping) else a).lower() for a in axes]
        units = [a.get("unit") if isinstance(a, Mapping) else None for a in axes]
    if len(names) != ndim or not {"y", "x"} <= set(names) or not set(names) <= set(_DEFAULT_AXES):
        raise SlideError(
            f"{path}: OME-Zarr axes {names} do not fit its {ndim}-dimensional level arrays (expected y, x and "
            "optionally t, c, z); re-export it as an NGFF image"
        )
    return names, units


def _scale(transforms: Any) -> list[float] | None:
    for t in transforms or ():
        if isinstance(t, Mapping) and t.get("type") == "scale" and t.get("scale") is not None:
            return [float(v) for v in t["scale"]]
    return None


class OmeZarrHandle:
    """An OME-Zarr image behind the reader-handle calls :class:`Slide` makes."""

    def __init__(self, path: str | os.PathLike):
        import zarr

        path = Path(path)
        self.path = path
        try:
            group = zarr.open_group(str(path), mode="r")
        except Exception as exc:  # noqa: BLE001 - zarr raises assorted errors on a folder that is no group
            raise SlideError(
                f"{path}: not a readable OME-Zarr group ({type(exc).__name__}: {' '.join(str(exc).split())}); "
                f"give the image's root folder, or {HOW_TO_WRITE}"
            ) from None
        multiscales = _attributes(group).get("multiscales")
        if not multiscales or not isinstance(multiscales, list) or not multiscales[0].get("datasets"):
            raise SlideError(
                f"{path}: OME-Zarr without `multiscales` metadata (no pyramid levels or pixel size stated); "
                f"{HOW_TO_WRITE}, with the pixel size as the x axis scale in micrometer (or pass --slide-mpp)"
            )
        multiscale = multiscales[0]
        datasets = multiscale["datasets"]
        try:
            self._arrays = [group[str(d["path"])] for d in datasets]
        except (KeyError, TypeError) as exc:
            raise SlideError(f"{path}: OME-Zarr multiscales names a level array it lacks ({exc}); re-export it") from None
        self._names, units = _axes(multiscale, self._arrays[0].ndim, path)
        self._index = self._names.index
        channels = self._arrays[0].shape[self._index("c")] if "c" in self._names else 1
        if channels != 3 or self._arrays[0].dtype != np.uint8:
            raise SlideError(
                f"{path}: OME-Zarr pixels are {channels} channel(s) of {self._arrays[0].dtype}, not 8-bit RGB; "
                "convert it to an RGB slide or exclude it"
            )
        x = self._index("x")
        self.level_dimensions = [(int(a.shape[x]), int(a.shape[self._index("y")])) for a in self._arrays]
        self.level_count = len(self._arrays)
        scales = [_scale(d.get("coordinateTransformations")) for d in datasets]
        if all(s is not None and len(s) == len(self._names) and s[x] > 0 for s in scales):
            self.level_downsamples = [s[x] / scales[0][x] for s in scales]  # type: ignore[index]
        else:
            width0 = self.level_dimensions[0][0]
            self.level_downsamples = [width0 / w for w, _ in self.level_dimensions]
        self.properties: dict[str, Any] = {
            "ome-zarr.version": str(multiscale.get("version") or _attributes(group).get("version", "")),
            "ome-zarr.axes": "".join(self._names),
        }
        mpp = self._mpp(scales[0], _scale(multiscale.get("coordinateTransformations")), units[x])
        if mpp is not None:
            self.properties[MPP_KEY] = mpp

    def _mpp(self, level0: list[float] | None, whole: list[float] | None, unit: Any) -> float | None:
        factor = _UNITS.get(str(unit).strip().lower()) if unit else None
        if level0 is None or factor is None:
            return None
        x = self._index("x")
        value = level0[x] * (whole[x] if whole is not None and len(whole) > x else 1.0) * factor
        return value if math.isfinite(value) and value > 0 else None

    def read_region(self, location: tuple[int, int], level: int, size: tuple[int, int], as_array: bool = True) -> np.ndarray:
        """RGB uint8 (h, w, 3) of ``size`` level pixels whose top-left is level-0
        ``location`` (placed as :class:`Slide` places tiffslide regions: level-0 / downsample,
        truncated). The caller asks only for regions inside the level."""
        if self._arrays is None:
            raise ValueError("OME-Zarr image is closed")
        (x, y), (w, h) = location, size
        ds = self.level_downsamples[level]
        lx, ly = int(math.floor(x / ds)), int(math.floor(y / ds))
        index: list[Any] = []
        for name in self._names:
            index.append({"x": slice(lx, lx + w), "y": slice(ly, ly + h), "c": slice(None)}.get(name, 0))
        block = np.asarray(self._arrays[level][tuple(index)])
        kept = [n for n in self._names if n in ("y", "x", "c")]
        return np.ascontiguousarray(np.transpose(block, [kept.index(n) for n in ("y", "x", "c")]))

    def close(self) -> None:
        self._arrays = None  # type: ignore[assignment]


def store_fingerprint(path: str | os.PathLike) -> tuple[int, str]:
    """(bytes of all files, sha256 of the metadata files' contents and of every file's
    relative name and size): a folder's counterpart of a slide file's head-and-tail hash,
    cheap (no chunk is read), unchanged by a copy, different for another image."""
    path = Path(path)
    digest = hashlib.sha256()
    total = 0
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            file = Path(root) / name
            size = file.stat().st_size
            total += size
            rel = file.relative_to(path).as_posix()
            digest.update(f"{rel}\0{size}\n".encode())
            if name in _METADATA:
                digest.update(file.read_bytes())
    return total, digest.hexdigest()
