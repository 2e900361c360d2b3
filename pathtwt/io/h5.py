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
:func:`writing_h5`, so a full disk is one line, never a crash.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import h5py
import numpy as np

from pathtwt.errors import PathtwtError
from pathtwt.io.atomic import atomic_output

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


class _GuardedFile:
    """The file under an HDF5 file being written (h5py's ``fileobj`` driver).

    Each write is completed or raises (the driver ignores a short write, which a filling
    disk makes). After a write failed (a full disk, a quota) the later ones are dropped:
    HDF5 that met a failed write of its own crashes later, at close or at the interpreter's
    exit (a segmentation fault), when it flushes its caches again, while dropped writes
    let it close cleanly. :func:`writing_h5` raises the failure again once it is closed."""

    def __init__(self, path: str | os.PathLike):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        self.pos = 0
        self.failed: OSError | None = None

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_END and self.failed is not None:
            return self.pos  # the end of a file whose writes are dropped: never read again
        self.pos = os.lseek(self.fd, offset, whence)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, size: int = -1) -> bytes:
        data = os.pread(self.fd, size, self.pos)
        self.pos += len(data)
        return data + bytes(max(0, size - len(data)))  # past the end reads as zeros, as HDF5's own driver does

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self.failed is None:
            done = 0
            try:
                while done < len(view):
                    done += os.pwrite(self.fd, view[done:], self.pos + done)
            except OSError as exc:
                self.failed = exc
                raise
        self.pos += len(view)
        return len(view)

    def truncate(self, size: int | None = None) -> int:
        size = self.pos if size is None else size
        if self.failed is None:
            os.ftruncate(self.fd, size)
        return size

    def flush(self) -> None:
        pass  # every write went straight to the file; atomic_output fsyncs it

    def close(self) -> None:
        os.close(self.fd)


# flushes tried at close: a flush that met a failed write leaves HDF5 needing another
_FLUSH_TRIES = 4


@contextlib.contextmanager
def writing_h5(path: str | os.PathLike, **kwargs: Any) -> Iterator[h5py.File]:
    """A new HDF5 file at ``path`` (a temporary file of :func:`atomic_output`), closed on
    leaving; a failed write (a full disk) is raised as its ``OSError`` once the file is
    closed, without the crash HDF5 meets closing such a file itself (:class:`_GuardedFile`)."""
    guard = _GuardedFile(path)
    try:
        h5 = h5py.File(guard, "w", **kwargs)
    except BaseException:
        guard.close()
        raise
    try:
        yield h5
    finally:
        _close(h5, guard)
    if guard.failed is not None:
        raise guard.failed


def _close(h5: h5py.File, guard: _GuardedFile) -> None:
    try:
        for attempt in range(_FLUSH_TRIES):
            try:
                h5.flush()  # the writes fail here, not inside close, which HDF5 does not survive
                break
            except Exception:  # noqa: BLE001 - raised below as the failed write, or again
                if guard.failed is None and attempt == _FLUSH_TRIES - 1:
                    raise
        h5.close()
    finally:
        guard.close()


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


# bytes of a features file beside its arrays: the HDF5 structure and the attributes
_ATTRS_ROOM = 1 << 15


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
            self.features = self.h5.create_dataset(
                "features",
                shape=(self.n_tiles, self.dim),
                dtype=np.float32,
                chunks=(chunk_rows, self.dim) if self.n_tiles else None,
            )
            self.coords = self.h5.create_dataset("coords", shape=(self.n_tiles, 2), dtype=np.int64)
            _set_attrs(self.h5, self.attrs)
            _set_attrs(self.coords, {k: v for k, v in self.attrs.items() if k in GEOMETRY_ATTRS})
            self._files = stack.pop_all()
        return self

    def size(self) -> int:
        """Bytes the file will take: the features, the coords and room for the attributes."""
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
