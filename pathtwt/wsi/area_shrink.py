"""cv2.INTER_AREA's shrink of a batch of RGB tiles, with OpenCV's pixels, several times
faster than OpenCV on a factor that is not a whole number (numba optional).

On a non-integer factor (a 267 px read of a 0.42 um/px image shrunk to 224 px at
0.5 um/px) OpenCV takes its generic area path (``computeResizeAreaTab`` and
``ResizeArea_Invoker`` in modules/imgproc/src/resize.cpp), a scalar loop. Its arithmetic is
plain float32 in a fixed order, so doing the same operations in the same order gives the
same pixels bit for bit:

- per axis, a table of taps: output cell d covers the source span [d * scale, (d + 1) *
  scale) with ``scale = 1 / (dsize / ssize)`` in double precision; a partial source pixel at
  either end is a tap weighted by its covered fraction (dropped when that fraction is at
  most 1e-3), each whole pixel inside one weighted ``1 / cellWidth``; weights are rounded to
  float32 (:func:`_taps`);
- per source row, the horizontal pass ``buf[dx] += S[sx] * alpha`` tap by tap in table order
  (float32, one rounding for the product and one for the sum);
- per output row, ``sum = beta * buf`` for its first source row, then ``sum += beta * buf``;
- ``saturate_cast<uchar>``: round half to even, clamp to 0..255.

OpenCV recomputes a source row's horizontal pass for each output row that uses it (once or
twice) and walks the taps one pixel at a time. Here each pass combines whole rows: the tile
is transposed so that a source column is a contiguous row, the horizontal pass combines
those rows (one row per output column), the result is transposed back, and the vertical pass
combines its rows. The two loops are compiled by numba
(:mod:`pathtwt.wsi.area_shrink_kernels`); the transposes are OpenCV's. Padding a cell's taps
with zero weights keeps the sums exact (adding 0.0 changes no float).

Measured on one thread (``benchmarks/area_shrink_speed.py``; the numbers are in
``benchmarks/results/area_shrink_speed.md``): 267 -> 224 px 2.5 to 2.8 times as fast as
``cv2.resize``, 256 -> 224 px 3.4 times. The same passes written with numpy ufuncs (one pass
over memory for each gather, product and sum) were at most 1.2 times as fast as OpenCV, so
without numba the tiles go to ``cv2.resize`` itself. A whole factor in both axes (448 -> 224)
takes OpenCV's integer fast path, which is quick already and whose rounding differs between
OpenCV versions, so it always goes to ``cv2.resize``. numba compiles the two loops on a
process's first call (about 1 s; a later process loads them from numba's cache in
``__pycache__``, about 0.3 s).

The identity is with the OpenCV the tests run against (``tests/test_area_shrink.py``). Later
OpenCV sources add integer paths for exact 5/3 and 10/3 ratios (never met with a 224 px
output), which these passes do not copy; the tests would show such a change.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
from types import ModuleType
from typing import Any

import numpy as np

# the sliver below which OpenCV drops a partial source pixel (computeResizeAreaTab)
SLIVER = 1e-3


def shrink(tiles: Any, size: int, out: np.ndarray | None = None) -> np.ndarray:
    """uint8 (N, h, w, 3) -> uint8 (N, size, size, 3) (or one (h, w, 3) tile -> (size, size,
    3)) with the pixels of ``cv2.resize(tile, (size, size), interpolation=cv2.INTER_AREA)``,
    for h, w >= size. ``tiles`` may be a list of same-shape tiles (not stacked: one copy
    less); ``out`` (N, size, size, 3) uint8 receives the result (a ring slot, say)."""
    single = not isinstance(tiles, (list, tuple)) and np.ndim(tiles) == 3
    batch = [np.asarray(tiles)] if single else [np.asarray(t) for t in tiles] if isinstance(tiles, (list, tuple)) \
        else list(np.asarray(tiles))
    shapes = {(t.shape, t.dtype) for t in batch}
    if len(shapes) > 1 or any(t.ndim != 3 or t.shape[2] != 3 or t.dtype != np.uint8 for t in batch):
        got = sorted(f"{dtype} {shape}" for shape, dtype in shapes)
        raise ValueError(f"area_shrink.shrink takes uint8 RGB tiles of one shape (N, h, w, 3) or (h, w, 3), "
                         f"not {', '.join(got)}")
    n = len(batch)
    if out is None:
        out = np.empty((n, size, size, 3), np.uint8)
    elif out.shape != (n, size, size, 3) or out.dtype != np.uint8:
        raise ValueError(f"area_shrink.shrink: out must be uint8 {(n, size, size, 3)}, not {out.dtype} {out.shape}")
    if not n:
        return out
    h, w = batch[0].shape[:2]
    if size < 1 or h < size or w < size:
        raise ValueError(f"area_shrink.shrink shrinks only: tiles of {w} x {h} px cannot become "
                         f"{size} x {size} px (enlarge with cv2.INTER_LINEAR)")
    batch = [np.ascontiguousarray(t) for t in batch]
    if (h, w) == (size, size):
        for tile, dst in zip(batch, out):
            dst[...] = tile
    elif (whole_factor(h, size) and whole_factor(w, size)) or (kernels := _kernels()) is None:
        _opencv(batch, size, out)
    else:
        _separable(batch, size, kernels, out)
    return out[0] if single else out


def whole_factor(src: int, dst: int) -> bool:
    """Whether OpenCV shrinks this axis by a whole factor (its ``is_area_fast`` test:
    both axes whole means its integer fast path)."""
    scale = 1.0 / (dst / src)
    return abs(scale - round(scale)) < sys.float_info.epsilon


@functools.lru_cache(maxsize=64)
def _taps(src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's area table of one axis (computeResizeAreaTab) as (T, dst) source indices and
    float32 weights: column d holds output d's taps in table order, padded with zero weights
    (and the last index) to the longest cell's T taps."""
    scale = 1.0 / (dst / src)  # cv::resize: inv_scale = dsize / ssize, scale = 1 / inv_scale
    cells = []
    for d in range(dst):
        fsx1 = d * scale
        fsx2 = fsx1 + scale
        width = min(scale, src - fsx1)
        sx2 = min(math.floor(fsx2), src - 1)
        sx1 = min(math.ceil(fsx1), sx2)
        taps = []
        if sx1 - fsx1 > SLIVER:
            taps.append((sx1 - 1, (sx1 - fsx1) / width))
        taps += [(sx, 1.0 / width) for sx in range(sx1, sx2)]
        if fsx2 - sx2 > SLIVER:
            taps.append((sx2, min(fsx2 - sx2, 1.0, width) / width))
        cells.append(taps)
    index = np.zeros((max(map(len, cells)), dst), np.intp)
    weight = np.zeros(index.shape, np.float32)
    for d, taps in enumerate(cells):
        index[:, d] = taps[-1][0]
        for t, (sx, alpha) in enumerate(taps):
            index[t, d] = sx
            weight[t, d] = alpha  # double -> float32, round to nearest as C's (float) cast
    index.flags.writeable = weight.flags.writeable = False
    return index, weight


@functools.lru_cache(maxsize=1)
def _kernels() -> ModuleType | None:
    """The compiled loops, or None where numba is not installed."""
    if importlib.util.find_spec("numba") is None:
        return None
    from pathtwt.wsi import area_shrink_kernels

    return area_shrink_kernels


def _opencv(batch: list[np.ndarray], size: int, out: np.ndarray) -> np.ndarray:
    import cv2

    for tile, dst in zip(batch, out):
        cv2.resize(tile, (size, size), dst=dst, interpolation=cv2.INTER_AREA)
    return out


def _separable(batch: list[np.ndarray], size: int, kernels: Any, out: np.ndarray) -> np.ndarray:
    import cv2

    h, w = batch[0].shape[:2]
    (x_index, x_weight), (y_index, y_weight) = _taps(w, size), _taps(h, size)
    columns = np.empty((w, h, 3), np.uint8)  # a tile transposed: source columns as rows
    across = np.empty((size, h, 3), np.float32)  # horizontal pass, one row per output column
    rows = np.empty((h, size, 3), np.float32)  # the same transposed: one row per source row
    acc = np.empty(size * 3, np.float32)
    for tile, dst in zip(batch, out):
        cv2.transpose(tile, dst=columns)
        kernels.weighted_rows(columns.reshape(w, h * 3), x_index, x_weight, across.reshape(size, h * 3))
        cv2.transpose(across, dst=rows)
        kernels.weighted_rows_rounded(rows.reshape(h, size * 3), y_index, y_weight, dst.reshape(size, size * 3), acc)
    return out
