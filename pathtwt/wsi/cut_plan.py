"""Where a batch of output tiles lies in the native tiles of a pyramid level (torch-free).

A reading process that ships compressed bytes (:mod:`pathtwt.features.reading`) sends,
with the streams of the native tiles under a batch, a :class:`CutPlan`: the level's grid,
the native tiles in the order their decoded pixels are stacked, and each output tile's
square in level pixels. The process that decodes them cuts every tile with one gather
(:func:`pathtwt.features.device_tiles.cut`): :func:`natives_under` says which native
tiles the reader ships, :func:`gather_plan` the small index arrays the gather reads.
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
    (pixels outside the level take the row after the last, a tile of ``fill``:
    :func:`gather_plan`)."""

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


def gather_plan(plan: CutPlan, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The host's half of the cut: (axes, lut). ``axes`` int32 (4, N, side): for each
    output tile's pixel rows, the native tile row (an index into ``lut``) and the row within
    that tile, then the same for its columns. ``lut`` int32 (rows + 1, columns + 1): the
    position in ``plan.natives`` of each native tile the batch spans; its last row and
    column, where pixels outside the level point, hold ``len(plan.natives)``, the fill
    tile's row in the decoded stack. The device then needs two gathers
    (:func:`pathtwt.features.device_tiles.cut`). ``out``: int32 memory for ``axes``
    (4 * N * side), such as a pinned buffer the device copies from."""
    g = plan.grid
    natives = np.asarray(plan.natives, np.int64)
    fill = len(natives)
    if fill:
        nat_rows, nat_cols = natives // g.across, natives % g.across
        r0, c0 = int(nat_rows.min()), int(nat_cols.min())
        rows, cols = int(nat_rows.max()) - r0 + 1, int(nat_cols.max()) - c0 + 1
    else:
        r0 = c0 = 0
        rows = cols = 0
    lut = np.full((rows + 1, cols + 1), fill, np.int32)
    if fill:
        lut[nat_rows - r0, nat_cols - c0] = np.arange(fill, dtype=np.int32)
    origins = np.asarray(plan.origins, np.int64).reshape(-1, 2)
    shape = (4, len(origins), plan.side)
    axes = np.empty(shape, np.int32) if out is None else out.reshape(shape)
    if not len(origins):
        return axes, lut
    ar = np.arange(plan.side, dtype=np.int64)
    for k, (start, size, tile, first, pad) in enumerate(((origins[:, 1], g.height, g.tile_height, r0, rows),
                                                        (origins[:, 0], g.width, g.tile_width, c0, cols))):
        # both arrays for each level pixel of the span the batch covers along this axis,
        # then two lookups per output pixel (not a dozen passes over N x side)
        lo = int(start.min())
        at = np.arange(lo, int(start.max()) + plan.side)
        outside = (at < 0) | (at >= size)
        clipped = np.clip(at, 0, size - 1)
        native = clipped // tile - first
        native[outside | (native < 0) | (native >= pad)] = pad  # the lut's fill row (or column)
        where = (start - lo)[:, None] + ar[None, :]  # (N, side): each output pixel's place in the span
        np.take(native.astype(np.int32), where, out=axes[2 * k], mode="clip")  # in range by construction
        np.take((clipped % tile).astype(np.int32), where, out=axes[2 * k + 1], mode="clip")
    return axes, lut
