"""Tiles named by a coords file (``pathtwt tile`` output), read back from their slide.

The one reader of that format: extraction's reading processes (:mod:`pathtwt.features.reading`),
streamed training (:class:`pathtwt.compress.training_tiles.SlideTiles`) and the calibration
draw (:mod:`pathtwt.compress.calibration`) all go through :class:`TileGeometry`, so they
resolve the slide path, check the required attributes, reopen the slide (reader, channel
map, mpp fallback: :func:`~pathtwt.wsi.slides.open_options_from_attrs`) and read, resize and
resample a tile the same way, and therefore see the same pixels.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from pathtwt.errors import PathtwtError, SlideError
from pathtwt.wsi.slides import Slide, open_options_from_attrs, open_slide

# what a coords file must carry to read its tiles back
REQUIRED_ATTRS = ("patch_size", "patch_size_level0", "read_level")


def check_geometry(coords_file: str | os.PathLike, attrs: Mapping[str, Any]) -> None:
    missing = [k for k in REQUIRED_ATTRS if k not in attrs]
    if missing:
        raise PathtwtError(f"{coords_file}: coords file lacks attrs {missing}; re-run `pathtwt tile` for this slide")


def resolve_slide_path(coords_file: str | os.PathLike, attrs: Mapping[str, Any]) -> Path:
    """The slide a coords file names: absolute, relative to the working directory, or
    relative to the coords file's folder (as ``pathtwt tile`` may write it)."""
    named = str(attrs.get("slide_path", "") or "")
    path = Path(named)
    if named and not path.is_absolute() and not path.exists():
        path = Path(coords_file).parent / path
    if not named or not path.exists():
        raise SlideError(f"{coords_file}: slide_path {named!r} not found; run from the workflow folder or re-tile the slide")
    return path


@dataclass(frozen=True)
class TileGeometry:
    """How the tiles of one coords file are read: which slide, opened how, and the level-0
    square, read level and output size of a tile."""

    slide_path: Path
    patch_size_level0: int
    read_level: int
    patch_size: int
    open_options: dict[str, Any] = field(default_factory=dict)
    coords_file: str = ""

    @classmethod
    def from_attrs(cls, coords_file: str | os.PathLike, attrs: Mapping[str, Any], *,
                   slide_path: str | os.PathLike | None = None, decode: str = "cpu") -> "TileGeometry":
        """The geometry of ``coords_file`` (its ``attrs``); ``slide_path`` overrides the slide
        the file names (extraction pairs each coords file with its slide explicitly)."""
        check_geometry(coords_file, attrs)
        slide = Path(slide_path) if slide_path is not None else resolve_slide_path(coords_file, attrs)
        return cls(slide_path=slide, patch_size_level0=int(attrs["patch_size_level0"]), read_level=int(attrs["read_level"]),
                   patch_size=int(attrs["patch_size"]), open_options=open_options_from_attrs(attrs),
                   coords_file=str(coords_file))

    def open(self) -> Slide:
        """The slide, reopened exactly as it was tiled (same reader, so ``read_level`` indexes
        the same levels; same channel map; the level-0 mpp as fallback)."""
        return open_slide(self.slide_path, **self.open_options)

    def read(self, slide: Slide, x: int, y: int, size: int | None = None) -> np.ndarray:
        """uint8 (P, P, 3) tile at level-0 (x, y) of the opened ``slide``: P is the tiling's
        ``patch_size``, resampled (area) to ``size`` when given and different (the backbone's
        input size)."""
        return self.read_many(slide, [(x, y)], size)[0]

    def read_many(self, slide: Slide, xy: Any, size: int | None = None, out: np.ndarray | None = None) -> Any:
        """:meth:`read` for each level-0 (x, y) of ``xy``, as few regions
        (:meth:`~pathtwt.wsi.slides.Slide.read_tiles`: each native tile decoded once). With
        ``out`` (N, P, P, 3) uint8 and no ``size``, the tiles are written there."""
        if out is not None and size is None:
            return slide.read_tiles(xy, self.patch_size_level0, self.read_level, self.patch_size, out=out)
        tiles = slide.read_tiles(xy, self.patch_size_level0, self.read_level, self.patch_size)
        if size is None or self.patch_size == int(size):
            return tiles
        import cv2

        return [cv2.resize(t, (int(size), int(size)), interpolation=cv2.INTER_AREA) for t in tiles]


class CoordsTileReader:
    """Tile i of one coords file, the slide opened on first use. A pickled copy (a
    DataLoader worker) carries no handle and opens its own; so does a forked copy, which
    leaves the handle it inherited (and its file offset, shared with the parent) alone."""

    def __init__(self, geometry: TileGeometry, coords: np.ndarray, *, size: int | None = None) -> None:
        self.geometry = geometry
        self.coords = np.asarray(coords, dtype=np.int64).reshape(-1, 2)
        self.size = size
        self._slide: Slide | None = None
        self._owner = os.getpid()  # the process that opened ``_slide``

    def __len__(self) -> int:
        return len(self.coords)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_slide"] = None
        return state

    def read(self, index: int) -> np.ndarray:
        return self.read_many([index])[0]

    def read_many(self, indices: Any) -> list[np.ndarray]:
        """Tiles ``indices`` (best in coords order: neighbours share native tiles)."""
        if self._slide is None or self._owner != os.getpid():
            self._slide, self._owner = self.geometry.open(), os.getpid()
        return self.geometry.read_many(self._slide, self.coords[np.asarray(indices, dtype=np.int64)], self.size)

    def close(self) -> None:
        if self._slide is not None and self._owner == os.getpid():
            self._slide.close()
            self._slide = None

    def __enter__(self) -> "CoordsTileReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def reader_worker_init(_worker_id: int) -> None:
    """A DataLoader worker that reads tiles only reads, decodes (and augments): one thread
    each, so the workers do not steal the compute threads of the main process."""
    import cv2
    import torch

    torch.set_num_threads(1)
    cv2.setNumThreads(1)


@contextlib.contextmanager
def cv2_pool_stopped(active: bool = True) -> Iterator[None]:
    """OpenCV's thread pool does not survive fork: once this process has used cv2 (tiling,
    resizing), a forked worker touching the pool (:func:`reader_worker_init`) waits forever
    for the parent's pool threads, which it does not have. Stop the pool while workers are
    forked; restore it."""
    if not active:
        yield
        return
    import cv2

    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(threads)
