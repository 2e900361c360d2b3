"""Per-tile scores laid out on the tile grid: the one place where tiles become pixels, used
by the report's attention figures and by ``pathtwt heatmap``.

The grid has one cell per tile *pitch* (the smallest gap between distinct coordinates,
i.e. the stride of the tiling). A tile covers ``ceil(side / pitch)`` cells per axis, so
where tiles overlap (stride below the tile side) each cell holds the mean score of the
tiles over it; on the usual non-overlapping grid a cell is a tile. Memory: two float32
arrays of (grid rows x grid columns), about 8 bytes per tile of the slide's bounding box
of tiles (a 20,000-tile slide: well under 1 MB).
"""

from __future__ import annotations

import numpy as np


def grid_pitch(coords: np.ndarray) -> int:
    """The tile pitch: the smallest gap between distinct coordinates (1 for a single tile)."""
    coords = np.asarray(coords, dtype=np.int64).reshape(-1, 2)
    pitch = 1
    for axis in (0, 1):
        gaps = np.diff(np.unique(coords[:, axis]))
        gaps = gaps[gaps > 0]
        if gaps.size:
            pitch = max(pitch, int(gaps.min()))
    return pitch


def attention_grid(coords: np.ndarray, scores: np.ndarray, pitch: int | None = None, side: int | None = None) -> np.ndarray:
    """Per-tile scores on the tile grid (NaN where no tile), one cell per ``pitch``
    (default :func:`grid_pitch`) from the smallest coordinate; with ``side`` (the tile's
    level-0 side) larger than the pitch, each tile covers every cell under it and a cell
    holds the mean of the tiles over it."""
    coords = np.asarray(coords, dtype=np.int64).reshape(-1, 2)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    pitch = grid_pitch(coords) if pitch is None else int(pitch)
    cover = max(1, -(-int(side) // pitch)) if side else 1
    cells = (coords - coords.min(axis=0)) // pitch
    shape = (int(cells[:, 1].max()) + cover, int(cells[:, 0].max()) + cover)
    total = np.zeros(shape, dtype=np.float32)
    count = np.zeros(shape, dtype=np.float32)
    for dy in range(cover):
        for dx in range(cover):
            np.add.at(total, (cells[:, 1] + dy, cells[:, 0] + dx), scores)
            np.add.at(count, (cells[:, 1] + dy, cells[:, 0] + dx), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        grid = np.where(count > 0, total / np.maximum(count, 1), np.nan).astype(np.float32)
    return grid


def grid_origin(coords: np.ndarray) -> tuple[int, int]:
    """Level-0 (x, y) of the grid's cell (0, 0)."""
    x0, y0 = np.asarray(coords, dtype=np.int64).reshape(-1, 2).min(axis=0)
    return int(x0), int(y0)


def rank_scores(scores: np.ndarray) -> np.ndarray:
    """Each score's percentile rank within the slide in [0, 1] (ties share their mean rank):
    the scale of a heatmap whose colours compare tiles within one slide (as CLAM draws them)."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if len(scores) < 2:
        return np.ones_like(scores)
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores), dtype=np.float64)
    ranks[order] = np.arange(len(scores), dtype=np.float64)
    # ties: the mean rank of their group
    unique, inverse = np.unique(scores, return_inverse=True)
    if len(unique) < len(scores):
        sums = np.bincount(inverse, weights=ranks)
        counts = np.bincount(inverse)
        ranks = (sums / counts)[inverse]
    return ranks / (len(scores) - 1)


def scale_scores(scores: np.ndarray, scale: str) -> np.ndarray:
    """``rank``: :func:`rank_scores`; ``max``: score / slide maximum (the report's figures)."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if scale == "rank":
        return rank_scores(scores)
    if scale == "max":
        return scores / max(float(scores.max()), 1e-12) if len(scores) else scores
    raise ValueError(f"unknown scale {scale!r}; use rank or max")


SCALE_LABELS = {"rank": "attention percentile in slide", "max": "attention / slide max"}
