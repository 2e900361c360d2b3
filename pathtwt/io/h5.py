"""The HDF5 files between stages (docs/pipeline.md and docs/formats.md).

Coords file (``results/tiles/{cohort}/{slide}.h5``), written by ``pathtwt tile``:
  datasets ``coords`` int64 (N, 2) level-0 top-left (x, y), ``tissue_fraction`` float32 (N,)
  attrs ``patch_size``, ``patch_size_level0``, ``target_mpp``, ``level0_mpp``,
  ``read_level``, ``level0_width``, ``level0_height``, ``target_magnification``,
  ``status`` ("ok" | "no_tissue" | "too_small"), ``slide_path``; also the slide's fingerprint
  (:mod:`pathtwt.wsi.fingerprint`), which extraction checks.

Features file (``results/features/{variant}/{cohort}/{slide}.h5``), written by
``pathtwt extract``: datasets ``features`` float32 (N, D) and ``coords`` (as above), attrs
naming the encoder (backbone variant), weights sha256, embedding recipe, transform, tile
geometry and ``status`` ("ok" | "failed", with ``failure_reason``).

TRIDENT and CLAM read these files unchanged: the dataset names are theirs, and the tile
geometry is written twice, on the file root (pathtwt's own readers) and on the ``coords``
dataset, where TRIDENT reads it (``dict(f["coords"].attrs)``, ``patch_size_level0``) and
CLAM reads ``patch_size`` and ``patch_level`` (the pyramid level pathtwt reads tiles at).

All writers go through :func:`pathtwt.io.atomic.atomic_output` and write HDF5 through
:func:`pathtwt.io.h5_writer.writing_h5`, so a full disk is one line, never a crash.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Mapping

import h5py
import numpy as np

from pathtwt.errors import PathtwtError
from pathtwt.io.atomic import atomic_output
from pathtwt.io.h5_writer import CheckedDataset, writing_h5

COORDS_ATTRS = (
    "patch_size",
    "patch_size_level0",
    "target_mpp",
    "level0_mpp",
    "read_level",
    "level0_width",
    "level0_height",
    "target_magnification",
    "status",
    "slide_path",
)

# the tile geometry, also written on the ``coords`` dataset of coords and features files
GEOMETRY_ATTRS = tuple(k for k in COORDS_ATTRS if k not in ("status", "slide_path")) + (
    "patch_level",
    "level0_magnification",
)


def with_reader_aliases(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """``attrs`` plus the names other tools read the same geometry under: CLAM's
    ``patch_level`` (= ``read_level``) and TRIDENT's ``level0_magnification`` (the
    10 / mpp convention of ``target_magnification``)."""
    out = dict(attrs)
    if "read_level" in out:
        out.setdefault("patch_level", int(out["read_level"]))
    mpp = out.get("level0_mpp")
    if isinstance(mpp, (int, float)) and mpp > 0:
        out.setdefault("level0_magnification", int(round(10.0 / float(mpp))))
    return out


def _set_attrs(h5: h5py.File | h5py.Dataset, attrs: Mapping[str, Any]) -> None:
    for key, value in attrs.items():
        if value is None:
            value = ""  # HDF5 has no null; "" reads back as "not recorded"
        elif isinstance(value, os.PathLike):
            value = os.fspath(value)
        elif isinstance(value, (dict, list, tuple)) and not _is_numeric_sequence(value):
            import json

            value = json.dumps(value)
        h5.attrs[key] = value


def _is_numeric_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value)


def _plain_attrs(h5: h5py.File | h5py.Dataset) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in h5.attrs.items():
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, np.generic):
            value = value.item()
        elif isinstance(value, np.ndarray):
            value = value.tolist()
        out[key] = value
    return out


def write_coords(
    path: str | os.PathLike,
    coords: np.ndarray,
    tissue_fraction: np.ndarray,
    attrs: Mapping[str, Any],
    texts: Mapping[str, str] | None = None,
) -> None:
    """Write a coords file atomically. ``attrs`` must hold every key of COORDS_ATTRS; they
    are written on the root and (for TRIDENT and CLAM) on the ``coords`` dataset.
    ``texts``: extra string datasets (e.g. ``roi``, the GeoJSON of the regions that chose
    the tiles, which can outgrow an HDF5 attribute)."""
    missing = [k for k in COORDS_ATTRS if k not in attrs]
    if missing:
        raise ValueError(f"coords attrs missing {missing}")
    attrs = with_reader_aliases(attrs)
    coords = np.asarray(coords, dtype=np.int64).reshape(-1, 2)
    tissue_fraction = np.asarray(tissue_fraction, dtype=np.float32).reshape(-1)
    if len(coords) != len(tissue_fraction):
        raise ValueError("coords and tissue_fraction differ in length")
    with atomic_output(path) as tmp:
        with writing_h5(tmp) as h5:
            dataset = h5.create_dataset("coords", data=coords)
            h5.create_dataset("tissue_fraction", data=tissue_fraction)
            for name, text in (texts or {}).items():
                h5.create_dataset(name, data=text, dtype=h5py.string_dtype())
            _set_attrs(h5, attrs)
            _set_attrs(dataset, attrs)


def read_coords(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Return (coords (N, 2) int64, tissue_fraction (N,) float32, attrs)."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as h5:
            coords = h5["coords"][()].astype(np.int64).reshape(-1, 2)
            tissue = (
                h5["tissue_fraction"][()].astype(np.float32)
                if "tissue_fraction" in h5
                else np.ones(len(coords), np.float32)
            )
            attrs = _plain_attrs(h5)
    except (OSError, KeyError) as exc:
        raise PathtwtError(
            f"{path}: not a readable coords file ({exc}); re-run `pathtwt tile` for this slide"
        ) from None
    return coords, tissue, attrs


def count_coords(path: str | os.PathLike) -> int:
    """How many tiles a coords file lists (0 where it cannot be read: its extraction says why)."""
    try:
        with h5py.File(path, "r") as h5:
            return int(h5["coords"].shape[0])
    except (OSError, KeyError):
        return 0


def read_attrs(path: str | os.PathLike) -> dict[str, Any]:
    with h5py.File(path, "r") as h5:
        return _plain_attrs(h5)


def write_features(
    path: str | os.PathLike,
    features: np.ndarray,
    coords: np.ndarray,
    attrs: Mapping[str, Any],
) -> None:
    """Write a whole features file atomically (streaming writers use
    :class:`FeaturesWriter`)."""
    with FeaturesWriter(path, n_tiles=len(coords), dim=int(np.shape(features)[1]), attrs=attrs) as w:
        w.coords[...] = np.asarray(coords, dtype=np.int64).reshape(-1, 2)
        if len(coords):
            w.features[...] = features


# bytes of a features file beside its arrays, at the least: the HDF5 structure and the
# attributes (a larger guess would refuse files that fit; one that does not fit is caught
# when its write fails)
_ATTRS_ROOM = 1 << 12


class FeaturesWriter:
    """Stream features into a temporary HDF5 file and publish it atomically on close.

    ``attrs`` go on the file root; the tile geometry among them (GEOMETRY_ATTRS, with
    CLAM's and TRIDENT's names added) also on the ``coords`` dataset.

    >>> with FeaturesWriter(out, n_tiles=N, dim=D, attrs={...}) as w:
    ...     w.coords[...] = coords
    ...     w.features[i:j] = batch
    On an exception nothing is left at ``out``.
    """

    def __init__(self, path: str | os.PathLike, n_tiles: int, dim: int, attrs: Mapping[str, Any]):
        self.path = Path(path)
        self.n_tiles, self.dim, self.attrs = int(n_tiles), int(dim), with_reader_aliases(attrs)

    def __enter__(self) -> "FeaturesWriter":
        with contextlib.ExitStack() as stack:
            tmp = stack.enter_context(atomic_output(self.path, needed=self.size()))
            chunk_rows = max(1, min(self.n_tiles, 1024))
            # a chunk is written once, when full, rather than read back and rewritten at every batch
            self.h5 = stack.enter_context(writing_h5(tmp, rdcc_nbytes=max(1 << 20, 2 * chunk_rows * self.dim * 4)))
            features = self.h5.create_dataset(
                "features",
                shape=(self.n_tiles, self.dim),
                dtype=np.float32,
                chunks=(chunk_rows, self.dim) if self.n_tiles else None,
            )
            # a full disk stops the writer at the next batch, not at the end of the slide
            self.features = CheckedDataset(features, self.h5.guard, self.path, needed=self.size())
            self.coords = self.h5.create_dataset("coords", shape=(self.n_tiles, 2), dtype=np.int64)
            _set_attrs(self.h5, self.attrs)
            _set_attrs(self.coords, {k: v for k, v in self.attrs.items() if k in GEOMETRY_ATTRS})
            self._files = stack.pop_all()
        return self

    def size(self) -> int:
        """Bytes the file will take, at the least: the features, the coords and the HDF5 structure."""
        return self.n_tiles * (self.dim * 4 + 16) + _ATTRS_ROOM

    def __exit__(self, exc_type, exc, tb) -> bool:
        # the HDF5 file closes first (a failed write raised there), then the output is published
        return bool(self._files.__exit__(exc_type, exc, tb))


def read_features(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Return (features (N, D) float32, coords (N, 2) int64, attrs)."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as h5:
            feats = h5["features"][()].astype(np.float32, copy=False)
            coords = h5["coords"][()].astype(np.int64) if "coords" in h5 else np.zeros((len(feats), 2), np.int64)
            attrs = _plain_attrs(h5)
    except (OSError, KeyError) as exc:
        raise PathtwtError(
            f"{path}: not a readable features file ({exc}); re-run `pathtwt extract` for this slide"
        ) from None
    return feats, coords, attrs
