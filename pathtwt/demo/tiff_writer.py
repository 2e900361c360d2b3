"""Pyramidal TIFF writer: JPEG-compressed tiles, one TIFF page per level, streamed from a
tile generator so that a 60,000 x 40,000 slide is written in memory proportional to its
width, not its area.

Layout choices, checked against both readers the project uses:
- levels are consecutive pages (level 0 first, then reduced-resolution pages marked
  with NewSubfileType = 1): OpenSlide's generic-tiff driver and tiffslide both see them
  as one pyramid (OpenSlide ignores SubIFD pyramids);
- XResolution / YResolution in pixels per centimetre (ResolutionUnit = 3), from which
  OpenSlide reports ``openslide.mpp-x`` and tiffslide ``tiffslide.mpp-x``; the
  ImageDescription repeats the mpp for humans;
- RGB JPEG (tifffile's YCbCr JPEG path does not colour-convert the input).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from pathtwt.errors import PathtwtError
from pathtwt.io.atomic import atomic_output

# tile_fn(x, y, w, h, downsample) -> (h, w, 3) uint8: the level-0 region starting at (x, y),
# one output pixel per downsample x downsample level-0 pixels.
TileFn = Callable[..., np.ndarray]


def pyramid_dims(width: int, height: int, *, levels: int | None = None, tile: int = 256) -> list[tuple[int, int]]:
    """(w, h) of each level, halving (rounding up) each time. By default levels continue
    while the next one's longer side is at least one tile."""
    dims = [(int(width), int(height))]
    while True:
        w, h = dims[-1]
        nxt = ((w + 1) // 2, (h + 1) // 2)
        if levels is not None:
            if len(dims) >= levels:
                break
        elif max(nxt) < tile:
            break
        dims.append(nxt)
    return dims


def write_pyramidal_tiff(
    path: str | os.PathLike,
    width: int,
    height: int,
    tile_fn: TileFn,
    *,
    mpp: float,
    levels: int | None = None,
    tile: int = 256,
    quality: int = 90,
    description: str | None = None,
    memory_budget_mb: float = 256.0,
    spool: bool = True,
) -> list[tuple[int, int]]:
    """Write a tiled, JPEG-compressed pyramidal TIFF atomically and return the level
    dimensions.

    ``tile_fn(x, y, w, h, downsample)`` returns RGB uint8 (h, w, 3); a function taking only
    (x, y, w, h) is treated as level-0 only and lower levels are area-averaged from it.
    Each level is built from the one above (2 x 2 mean, filled while that one is
    written): in memory when it fits in ``memory_budget_mb``, otherwise in a temporary
    file next to ``path`` (``spool``; deleted afterwards), so memory stays bounded by a
    band of tile rows plus the budget. With ``spool=False`` such levels are asked from
    ``tile_fn`` instead (more compute, no scratch disk).
    """
    import tifffile

    if width < 1 or height < 1:
        raise PathtwtError(f"{path}: slide size must be positive, got {width} x {height}")
    if tile % 16:
        raise PathtwtError(f"{path}: TIFF tile size must be a multiple of 16, got {tile}")
    if not mpp > 0:
        raise PathtwtError(f"{path}: microns per pixel must be positive, got {mpp}")
    render = _with_downsample(tile_fn)
    dims = pyramid_dims(width, height, levels=levels, tile=tile)
    budget = memory_budget_mb * 2**20
    text = description or f"pathtwt pyramidal TIFF; mpp={mpp:g}"
    with atomic_output(path) as tmp, contextlib.ExitStack() as scratch:
        with tifffile.TiffWriter(tmp, bigtiff=width * height * 3 >= 2**31) as writer:
            above = None  # this level's pixels (array or scratch rows) when built from the one above
            for k, (lw, lh) in enumerate(dims):
                ds = 2**k
                below = None
                if k + 1 < len(dims):
                    bw, bh = dims[k + 1]
                    if bw * bh * 3 <= budget:
                        below = np.empty((bh, bw, 3), np.uint8)
                    elif spool:
                        below = scratch.enter_context(_scratch_rows(tmp, (bh, bw, 3)))
                bands = _bands(render, above, lw, lh, ds, tile)
                writer.write(
                    _tiles(bands, lw, tile, below),
                    shape=(lh, lw, 3),
                    dtype=np.uint8,
                    tile=(tile, tile),
                    photometric="rgb",
                    compression="jpeg",
                    compressionargs={"level": int(quality)},
                    subfiletype=0 if k == 0 else 1,
                    resolution=(1e4 / (mpp * ds), 1e4 / (mpp * ds)),
                    resolutionunit="CENTIMETER",
                    description=text if k == 0 else None,
                    software="pathtwt",
                    metadata=None,
                )
                above = below
    return dims


class _ScratchRows:
    """Rows of an (h, w, 3) uint8 image kept in a scratch file and moved with plain file
    I/O: unlike a memory map, its pages never count as the process's memory. Supports
    the two operations the writer needs: ``rows[a:b] = array`` and ``rows[a:b]``."""

    def __init__(self, fd: int, shape: tuple[int, int, int]):
        self.fd, self.shape = fd, shape
        self.row_bytes = shape[1] * shape[2]

    def __setitem__(self, rows: slice, value: np.ndarray) -> None:
        data = memoryview(np.ascontiguousarray(value, dtype=np.uint8)).cast("B")
        offset = rows.start * self.row_bytes
        while data:
            written = os.pwrite(self.fd, data, offset)
            data, offset = data[written:], offset + written

    def __getitem__(self, rows: slice) -> np.ndarray:
        start, stop, _ = rows.indices(self.shape[0])
        size = (stop - start) * self.row_bytes
        data = os.pread(self.fd, size, start * self.row_bytes)
        if len(data) != size:
            raise OSError(f"scratch file returned {len(data)} of {size} bytes")
        return np.frombuffer(data, np.uint8).reshape(stop - start, self.shape[1], self.shape[2])


@contextlib.contextmanager
def _scratch_rows(tmp: Path, shape: tuple[int, int, int]) -> Iterator[_ScratchRows]:
    # Named after the output's temporary file (hidden, with the writer's host and pid),
    # so a rerun removes it with that file when a killed writer left both behind.
    fd, name = tempfile.mkstemp(prefix=f"{tmp.name}-level-", suffix=".raw", dir=tmp.parent)
    try:
        yield _ScratchRows(fd, shape)
    finally:
        os.close(fd)
        os.unlink(name)


def _with_downsample(tile_fn: TileFn) -> TileFn:
    params = inspect.signature(tile_fn).parameters
    if "downsample" in params or len(params) >= 5 or any(p.kind == p.VAR_POSITIONAL for p in params.values()):
        return tile_fn

    def area_averaged(x: int, y: int, w: int, h: int, downsample: float = 1) -> np.ndarray:
        d = int(downsample)
        if d <= 1:
            return tile_fn(x, y, w, h)
        fine = tile_fn(x, y, w * d, h * d).reshape(h, d, w, d, 3)
        return np.rint(fine.mean(axis=(1, 3))).astype(np.uint8)

    return area_averaged


def _bands(render: TileFn, above: np.ndarray | _ScratchRows | None, lw: int, lh: int, ds: int, tile: int) -> Iterator[np.ndarray]:
    """Rows of tiles (band height = tile, except the last), full level width."""
    chunk = max(tile, (4096 // ds // tile) * tile)  # bounded request size for huge levels
    for ty in range(0, lh, tile):
        bh = min(tile, lh - ty)
        if above is not None:
            yield above[ty : ty + bh]
            continue
        parts = []
        for tx in range(0, lw, chunk):
            bw = min(chunk, lw - tx)
            part = np.asarray(render(tx * ds, ty * ds, bw, bh, ds))
            if part.shape != (bh, bw, 3) or part.dtype != np.uint8:
                raise ValueError(f"tile_fn returned {part.shape} {part.dtype}, expected ({bh}, {bw}, 3) uint8")
            parts.append(part)
        yield np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]


def _tiles(bands: Iterator[np.ndarray], lw: int, tile: int, below: np.ndarray | _ScratchRows | None) -> Iterator[np.ndarray]:
    """Split bands into full-size tiles in row-major order (edge tiles padded white) and,
    on the way, fill the next level with 2 x 2 means."""
    row = 0
    for band in bands:
        bh = band.shape[0]
        if below is not None:
            half = _halve(band)
            below[row // 2 : row // 2 + half.shape[0]] = half
        for tx in range(0, lw, tile):
            piece = band[:, tx : tx + tile]
            if piece.shape[:2] != (tile, tile):
                padded = np.full((tile, tile, 3), 255, np.uint8)
                padded[: piece.shape[0], : piece.shape[1]] = piece
                piece = padded
            yield np.ascontiguousarray(piece)
        row += bh


def _halve(band: np.ndarray) -> np.ndarray:
    """2 x 2 mean; an odd last row or column is averaged with itself."""
    import cv2

    h, w = band.shape[:2]
    if h % 2 or w % 2:
        band = np.pad(band, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    return cv2.resize(band, (band.shape[1] // 2, band.shape[0] // 2), interpolation=cv2.INTER_AREA)


