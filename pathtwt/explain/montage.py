"""The tiles a head attends to most and least: a two-row montage of the top-k and
bottom-k tiles, read back from the slide at the tiling's geometry, each with its score
and rank."""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from pathtwt.io.atomic import atomic_output
from pathtwt.wsi.coords_tiles import TileGeometry


def top_bottom(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the ``k`` highest scores (highest first) and the ``k`` lowest (lowest
    first); fewer when the slide has fewer tiles (the two rows then share none: each
    gets at most half)."""
    scores = np.asarray(scores).reshape(-1)
    k = max(0, min(int(k), len(scores) // 2))
    order = np.argsort(-scores, kind="stable")
    return order[:k], order[::-1][:k]


def top_k_note(k: int, n: int) -> str | None:
    """What a ``k`` the slide's ``n`` tiles cannot give was turned into, or None when all
    ``k`` + ``k`` were shown."""
    shown = max(0, min(int(k), n // 2))
    if shown == k:
        return None
    if shown == 0:
        return f"top-k {k} asked, the only tile shown of {n}"
    return f"top-k {k} asked, {shown}+{shown} shown of {n} tiles"


def write_montage(
    path: str | os.PathLike, *, slide_path: str | os.PathLike, coords_file: str | os.PathLike,
    coords_attrs: Mapping[str, Any], coords: np.ndarray, scores: np.ndarray, k: int, title: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Write the montage PNG; returns the (top, bottom) tile indices shown."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top, bottom = top_bottom(scores, k)
    if len(top) == 0:  # a one-tile slide: that tile, on the top row
        top = np.arange(len(scores))
    columns = max(len(top), len(bottom), 1)
    geometry = TileGeometry.from_attrs(coords_file, coords_attrs, slide_path=slide_path)
    n = len(scores)
    rank = {int(i): r for r, i in enumerate(np.argsort(-np.asarray(scores), kind="stable"), start=1)}
    width = max(1.9 * columns, 6.0)
    fig, axes = plt.subplots(2, columns, figsize=(width, 5.4), squeeze=False)
    with geometry.open() as slide:
        for row, (indices, label) in enumerate(((top, f"top {len(top)}"), (bottom, f"bottom {len(bottom)}"))):
            for col in range(columns):
                ax = axes[row][col]
                ax.set_xticks([])
                ax.set_yticks([])
                if col >= len(indices):
                    ax.set_axis_off()
                    continue
                i = int(indices[col])
                x, y = (int(v) for v in coords[i])
                ax.imshow(geometry.read(slide, x, y))
                ax.set_title(f"rank {rank[i]}/{n}: {float(scores[i]):.3g}\nx {x}, y {y}", fontsize=8)
                if col == 0:
                    ax.set_ylabel(label, fontsize=9)
    note = top_k_note(k, n)
    fig.suptitle(f"{title}\n{note}" if note else title, fontsize=9)
    fig.subplots_adjust(left=0.06, right=0.98, top=0.84, bottom=0.02, wspace=0.08, hspace=0.32)
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return top, bottom
