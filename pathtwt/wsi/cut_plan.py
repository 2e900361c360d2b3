"""Where a batch of output tiles lies in the native tiles of a pyramid level (torch-free).

A reading process that ships compressed bytes (:mod:`pathtwt.features.reading`) sends,
with the streams of the native tiles under a batch, a :class:`CutPlan`: the level's grid,
the native tiles in the order their decoded pixels are stacked, and each output tile's
square in level pixels. The process that decodes them cuts every tile with one gather
(:func:`pathtwt.features.device_tiles.cut`); :func:`natives_under` and
:func:`native_lut` are the arithmetic both sides share, here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class LevelGrid:
    """A tiled level: its size and native tile size in level pixels."""

    width: int
    height: int
    tile_width: int
    tile_height: int

    @classmethod
    def of_page(cls, page: Any) -> "LevelGrid":
        return cls(int(page.imagewidth), int(page.imagelength), int(page.tilewidth), int(page.tilelength))

    @property
    def across(self) -> int:
        return -(-self.width // self.tile_width)


@dataclass
class CutPlan:
    """A batch of ``len(origins)`` output tiles: the ``side`` level-pixel squares at
    ``origins`` (top-left, level pixels, int64 (N, 2)), to be resized to ``patch_size``.
    ``natives``: the native tile indices under them, in the order of the decoded stack
    (:func:`native_lut` finds a native tile's row there; pixels outside the level take
    the row after the last, a tile of ``fill``)."""

    grid: LevelGrid
    natives: np.ndarray
    origins: np.ndarray
    side: int
    patch_size: int
    fill: int = 255


def natives_under(grid: LevelGrid, origins: np.ndarray, side: int) -> np.ndarray:
    """Sorted unique native tile indices that the ``side`` px squares at level-pixel
    ``origins`` overlap, inside the level."""
    origins = np.asarray(origins, dtype=np.int64).reshape(-1, 2)
    if not len(origins):
        return np.zeros(0, np.int64)
    x0 = np.clip(origins[:, 0], 0, grid.width - 1)
    y0 = np.clip(origins[:, 1], 0, grid.height - 1)
    x1 = np.clip(origins[:, 0] + side - 1, 0, grid.width - 1)
    y1 = np.clip(origins[:, 1] + side - 1, 0, grid.height - 1)
    inside = (origins[:, 0] < grid.width) & (origins[:, 1] < grid.height) & \
        (origins[:, 0] + side > 0) & (origins[:, 1] + side > 0)
    c0, c1 = x0 // grid.tile_width, x1 // grid.tile_width
    r0, r1 = y0 // grid.tile_height, y1 // grid.tile_height
    span_c, span_r = int((c1 - c0).max()) + 1, int((r1 - r0).max()) + 1
    cols = c0[:, None] + np.arange(span_c)[None, :]  # (N, span_c)
    rows = r0[:, None] + np.arange(span_r)[None, :]
    ok = (cols[:, None, :] <= c1[:, None, None]) & (rows[:, :, None] <= r1[:, None, None]) & inside[:, None, None]
    index = rows[:, :, None] * grid.across + cols[:, None, :]
    return np.unique(index[ok])


def native_lut(grid: LevelGrid, natives: np.ndarray) -> tuple[np.ndarray, int, int]:
    """(lut, first row, first column): ``lut[r - first row, c - first column]`` is the
    position in ``natives`` of the native tile at grid row r, column c, or -1 where the
    batch has none; the table spans the batch's natives only (a few rows and columns)."""
    natives = np.asarray(natives, np.int64)
    if not len(natives):
        return np.full((1, 1), -1, np.int64), 0, 0
    rows, cols = natives // grid.across, natives % grid.across
    r0, c0 = int(rows.min()), int(cols.min())
    lut = np.full((int(rows.max()) - r0 + 1, int(cols.max()) - c0 + 1), -1, np.int64)
    lut[rows - r0, cols - c0] = np.arange(len(natives))
    return lut, r0, c0
