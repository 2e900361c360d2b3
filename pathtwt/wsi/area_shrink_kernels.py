"""The two loops of :mod:`pathtwt.wsi.area_shrink`, compiled by numba (an optional
dependency: this module is imported only where numba is installed).

Each loop combines whole rows of a 2-D array, so the compiler vectorises the inner loop over
a contiguous row. The float32 operations and their order are OpenCV's (see
:mod:`pathtwt.wsi.area_shrink`): one product per tap, added tap by tap in table order. No
``fastmath``: it would let LLVM fuse a product and a sum into one FMA (one rounding instead
of two) and reorder the sums, and the pixels would no longer be OpenCV's.
"""

from __future__ import annotations

import numba
import numpy as np

# x + 1.5 * 2**23 - 1.5 * 2**23 in float32 is x rounded to an integer, ties to even (as
# cvRound and saturate_cast<uchar> do), for 0 <= x < 2**22: the sum has no fraction bits left
_ROUND = np.float32(12582912.0)
_MAX = np.float32(255.0)


@numba.njit(nogil=True, cache=True)
def _combine(src, index, weight, d, dst):  # pragma: no cover - compiled; tested through shrink
    """dst = sum over taps t of src[index[t, d]] * weight[t, d], in float32, tap by tap in
    order (a zero weight ends the taps: the shorter cells are padded with them)."""
    alpha = weight[0, d]
    row = src[index[0, d]]
    for j in range(dst.size):
        dst[j] = np.float32(row[j]) * alpha
    for t in range(1, index.shape[0]):
        alpha = weight[t, d]
        if alpha == 0:
            break
        row = src[index[t, d]]
        for j in range(dst.size):
            dst[j] += np.float32(row[j]) * alpha


@numba.njit(nogil=True, cache=True)
def weighted_rows(src, index, weight, out):  # pragma: no cover - compiled
    """Row d of ``out`` is :func:`_combine` of the rows of ``src`` that output d takes."""
    for d in range(index.shape[1]):
        _combine(src, index, weight, d, out[d])


@numba.njit(nogil=True, cache=True)
def weighted_rows_rounded(src, index, weight, out, acc):  # pragma: no cover - compiled
    """:func:`weighted_rows` into the float32 row ``acc``, each row then rounded to uint8."""
    for d in range(index.shape[1]):
        _combine(src, index, weight, d, acc)
        dst = out[d]
        for j in range(acc.size):
            dst[j] = np.uint8(np.int32(min((acc[j] + _ROUND) - _ROUND, _MAX)))
