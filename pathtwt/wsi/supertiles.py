"""Many tiles of one slide read as few regions ("supertiles") and cut with numpy.

:meth:`pathtwt.wsi.slides.Slide.read_tiles` reads a batch of tiles in one of three ways,
the first that applies (:func:`plan`):

- ``native``: the read level is a tiled TIFF page (:mod:`pathtwt.wsi.native_tiles`) and
  every tile starts on a whole level pixel: the native tiles under the batch are decoded
  once and each tile is cut from them.
- ``regions``: tiles start on whole level pixels but the level has no native view
  (MIRAX, DICOM, NDPI's stripped JPEG, ...): tiles side by side in a row (a "run") are
  read as one region of the slide's own reader and cut (or each on its own where a region
  is a slice of an image held decoded: ``SlideReader.bands``, :mod:`pathtwt.wsi.readers`).
- ``tiles``: OpenSlide places a tile at a fractional level pixel (a level whose downsample
  is not a whole number, e.g. 4.016): one read per tile, exactly as a single tile is read,
  since OpenSlide's fractional placement cannot be cut from a larger region.

Each way gives the pixels of one ``read_region`` per tile.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pathtwt.wsi.readers import Placement, reader_named


def level_origins(xy: np.ndarray, downsample: float, reader: str) -> tuple[np.ndarray, bool]:
    """(level-pixel top-left corners (N, 2) int64, whether they are exact) of regions read
    by the reader named ``reader``, as its :class:`~pathtwt.wsi.readers.Placement` says:
    truncating readers start at level-0 / downsample rounded down; OpenSlide places the
    region at the exact quotient, so its corners are exact only when the quotient is whole."""
    xy = np.asarray(xy, dtype=np.int64).reshape(-1, 2)
    if reader_named(reader).placement is Placement.QUOTIENT:
        q = xy / float(downsample)
        whole = np.round(q)
        return whole.astype(np.int64), bool(np.all(whole == q))
    return (xy / float(downsample)).astype(np.int64), True


def runs(origins: np.ndarray, side: int, *, max_width: int = 8192) -> list[tuple[int, int]]:
    """[start, end) index ranges of consecutive tiles on one row, each next to the last
    (x + side), at most ``max_width`` level pixels wide: each is one region."""
    out: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(origins) + 1):
        if i == len(origins) or origins[i, 1] != origins[start, 1] or origins[i, 0] != origins[i - 1, 0] + side \
                or origins[i, 0] + side - origins[start, 0] > max_width:
            out.append((start, i))
            start = i
    return out


def cut_run(region: np.ndarray, count: int, side: int) -> list[np.ndarray]:
    """The ``count`` tiles of a run's region (h = side, w = count * side)."""
    return [region[:, k * side:(k + 1) * side] for k in range(count)]


def bounding_box(origins: np.ndarray, side: int) -> tuple[int, int, int, int]:
    """(x, y, w, h) around tiles of ``side`` level pixels at ``origins``."""
    x0, y0 = (int(v) for v in origins.min(axis=0))
    x1, y1 = (int(v) + side for v in origins.max(axis=0))
    return x0, y0, x1 - x0, y1 - y0


def boxes(origins: np.ndarray, side: int) -> Sequence[tuple[int, int, int, int]]:
    return [(int(x), int(y), side, side) for x, y in origins]
