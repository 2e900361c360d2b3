"""Figures of the analyses as PNG files, each with a sidecar JSON
(``name.png`` -> ``name.json``: ``{"figure": "name.png", "caption": "..."}``) holding a
one-line caption, so the report can include any figure it finds without knowing it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from pathtwt.io.atomic import atomic_output, write_json_atomic


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; works on headless cluster nodes
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | os.PathLike, caption: str) -> Path:
    """Write ``fig`` to ``path`` (PNG) and its caption beside it; close the figure."""
    plt = _pyplot()
    path = Path(path)
    try:
        with atomic_output(path) as tmp:
            fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    finally:
        plt.close(fig)
    write_json_atomic(path.with_suffix(".json"), {"figure": path.name, "caption": caption})
    return path


def similarity_heatmap(
    S: np.ndarray, blocks: Sequence[Sequence[int]], path: str | os.PathLike, *, title: str = "", caption: str = ""
) -> Path:
    """Heatmap of S (layers 1..L) with each block [s, e] outlined as a square."""
    plt = _pyplot()
    from matplotlib.patches import Rectangle

    L = S.shape[0]
    fig, ax = plt.subplots(figsize=(5.2, 4.4))
    im = ax.imshow(S, cmap="viridis", origin="upper", extent=(0.5, L + 0.5, L + 0.5, 0.5))
    for s, e in blocks:
        ax.add_patch(Rectangle((s - 0.5, s - 0.5), e - s + 1, e - s + 1, fill=False, edgecolor="red", linewidth=2))
    ax.set_xticks(range(1, L + 1))
    ax.set_yticks(range(1, L + 1))
    ax.set_xlabel("layer")
    ax.set_ylabel("layer")
    ax.set_title(title or "mean cosine distance between layer outputs")
    fig.colorbar(im, ax=ax, label="1 - cos")
    caption = caption or (
        f"Mean cosine distance between the outputs of the {L} layers; red squares: the {len(blocks)} merged blocks."
    )
    return save_figure(fig, path, caption)


def eps_curves(curves: Mapping[str, tuple[Sequence[float], Sequence[int]]], path: str | os.PathLike) -> Path:
    """Number of blocks against eps, one step line per backbone."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for name, (eps, n_blocks) in curves.items():
        ax.step(eps, n_blocks, where="post", label=name)
    ax.set_xlabel("eps (max block discrepancy)")
    ax.set_ylabel("blocks")
    ax.legend()
    ax.grid(alpha=0.3)
    return save_figure(
        fig, path, "Number of blocks of the exact min-blocks partition as the discrepancy budget eps grows."
    )


def norm_growth(
    layers: Sequence[int], series: Mapping[str, Sequence[float]], ratio: Mapping[str, Sequence[float]],
    path: str | os.PathLike, *, name: str = "",
) -> Path:
    """Left: mean token norm per layer (log scale); right: residual-to-output ratio."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for label, values in series.items():
        ax1.plot(layers, values, marker="o", label=label)
    ax1.set_yscale("log")
    ax1.set_xlabel("layer")
    ax1.set_ylabel("mean token norm")
    ax1.legend()
    for label, values in ratio.items():
        ax2.plot(layers, values, marker="o", label=label)
    ax2.set_xlabel("layer")
    ax2.set_ylabel("||f(h) - h|| / ||h||")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.set_xticks(list(layers))
        ax.grid(alpha=0.3)
    fig.suptitle(name)
    return save_figure(
        fig, path,
        f"Token norm growth across depth{' of ' + name if name else ''} and each layer's update "
        "relative to its input (residual-to-output ratio).",
    )


def id_trajectories(
    boundaries: Sequence[int],
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: str | os.PathLike,
    *, representation: str,
) -> Path:
    """Intrinsic dimension (mean with sd error bars) per block boundary, one line per model."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    x = np.arange(1, len(boundaries) + 1)
    for label, (mean, sd) in curves.items():
        ax.errorbar(x, mean, yerr=sd, marker="o", capsize=3, label=label)
    ax.set_xticks(x)
    ax.set_xlabel("block boundary")
    ax.set_ylabel(f"Two-NN intrinsic dimension ({representation})")
    ax.legend()
    ax.grid(alpha=0.3)
    return save_figure(
        fig, path,
        f"Two-NN intrinsic dimension of the {representation} representation at each block boundary "
        "(error bars: sd over augmentation draws).",
    )
