"""An attention heatmap of a whole slide, drawn at a chosen resolution (``mpp``).

The slide is read at the pyramid level closest to (not coarser than) ``mpp``, in strips
averaged down as they arrive (:func:`pathtwt.wsi.tissue.read_low_resolution`), and resized
to the canvas. The scores go through the tile grid (:mod:`pathtwt.explain.grid`), where
overlapping tiles are averaged, are resized onto the canvas (nearest neighbour: one
flat square per grid cell), optionally smoothed (a Gaussian of ``smooth_um`` microns,
normalised so that it does not bleed into background), colour-mapped through a 256-entry
table and blended over the slide in strips of rows.

Memory bound: about 7 bytes per canvas pixel (the RGB slide image, 3, and the scores
upsampled over the tiles' bounding box, 4; 12 more while ``smooth_um`` blurs), plus 8 bytes per tile-grid
cell and the tiles' coordinates and scores: it grows with the slide's area over ``mpp``
squared, not with its number of tiles (blending goes strip by strip of rows). A 20,000-tile
slide (256-px tiles at 0.5 um/px, 330 mm^2 of tissue) spread over 25 x 20 mm^2 draws at the
default 4 um/px on a 6,250 x 5,000 canvas: about 0.22 GB. A canvas over ``max_pixels``
(default 40 MP) is refused with the ``--mpp`` that fits (tests/test_explain.py measures the
bound on a 20,000-tile grid).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import cv2
import numpy as np

from pathtwt.errors import PathtwtError
from pathtwt.explain.grid import SCALE_LABELS, attention_grid, grid_origin, grid_pitch
from pathtwt.io.atomic import atomic_output
from pathtwt.wsi.slides import Slide
from pathtwt.wsi.tissue import read_low_resolution

DEFAULT_MPP = 4.0
MAX_PIXELS = 40_000_000
DEFAULT_CMAP = "turbo"
DEFAULT_ALPHA = 0.45
STRIP_ROWS = 64  # rows blended at a time: temporaries of ~12 bytes per pixel of a strip
PROBS_PER_LINE = 3  # class probabilities per legend line: three fit the panel's width at 11 pt
# Rank colouring spreads any attention over the whole colour bar; when the slide's raw
# attention max/min is below this ratio the head barely tells its tiles apart, and the
# legend says so (docs/predict.md).
NEAR_UNIFORM_RATIO = 1.5


@dataclass(frozen=True)
class Canvas:
    width: int
    height: int
    scale: float  # canvas px per level-0 px
    mpp: float


def canvas_for(level0_size: tuple[int, int], level0_mpp: float, mpp: float, max_pixels: int = MAX_PIXELS,
               where: str = "slide") -> Canvas:
    if mpp <= 0 or not math.isfinite(mpp):
        raise PathtwtError(f"--mpp must be positive, got {mpp}")
    mpp = max(mpp, level0_mpp)  # never finer than the slide itself
    scale = level0_mpp / mpp
    w, h = max(1, math.ceil(level0_size[0] * scale)), max(1, math.ceil(level0_size[1] * scale))
    if w * h > max_pixels:
        fit = mpp * math.sqrt(w * h / max_pixels)
        raise PathtwtError(
            f"{where}: a heatmap at {mpp:g} um/px would be {w} x {h} px (over {max_pixels / 1e6:g} MP); use --mpp {math.ceil(fit * 10) / 10:g} or coarser"
        )
    return Canvas(width=w, height=h, scale=scale, mpp=mpp)


def background_level(slide: Slide, mpp: float) -> tuple[int, int]:
    """(level, integer averaging factor): the coarsest level not coarser than ``mpp``."""
    finer = [lv for lv in range(slide.level_count) if slide.level_mpp(lv) <= mpp * 1.01]
    level = max(finer, key=lambda lv: slide.level_mpp(lv)) if finer else 0
    return level, max(1, int(mpp / slide.level_mpp(level)))


def read_background(slide: Slide, canvas: Canvas) -> np.ndarray:
    """RGB uint8 (height, width, 3): the slide at the canvas resolution."""
    level, factor = background_level(slide, canvas.mpp)
    image = read_low_resolution(slide, level, factor)
    if image.shape[:2] != (canvas.height, canvas.width):
        # the level (averaged by a whole factor) covers the slide up to a padded edge
        lw, lh = slide.level_dimensions[level]
        cover_w, cover_h = image.shape[1] * factor / lw, image.shape[0] * factor / lh
        size = (max(1, round(canvas.width * cover_w)), max(1, round(canvas.height * cover_h)))
        image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)[: canvas.height, : canvas.width]
        if image.shape[:2] != (canvas.height, canvas.width):
            padded = np.full((canvas.height, canvas.width, 3), 255, np.uint8)
            padded[: image.shape[0], : image.shape[1]] = image
            image = padded
    return np.ascontiguousarray(image)


def colour_table(cmap: str) -> np.ndarray:
    """(256, 3) uint8 RGB of a matplotlib colour map."""
    from matplotlib import colormaps

    try:
        table = colormaps[cmap](np.linspace(0.0, 1.0, 256))[:, :3]
    except KeyError:
        raise PathtwtError(f"--cmap {cmap}: not a matplotlib colour map (e.g. turbo, inferno, viridis, coolwarm)") from None
    return np.round(table * 255).astype(np.uint8)


@dataclass
class ScoreLayer:
    """Scores at the canvas resolution over the tiles' bounding box only (NaN where no
    tile): ``values`` float32 (h, w) whose top-left canvas pixel is ``offset`` (x, y)."""

    values: np.ndarray
    offset: tuple[int, int]


def score_layer(canvas: Canvas, coords: np.ndarray, values: np.ndarray, side_level0: int, smooth_um: float = 0.0) -> ScoreLayer:
    """``values`` (one per tile) painted over their tiles at the canvas resolution."""
    if len(coords) == 0:
        return ScoreLayer(np.full((0, 0), np.nan, np.float32), (0, 0))
    pitch = grid_pitch(coords)
    grid = attention_grid(coords, values, pitch, side=side_level0)
    x0, y0 = grid_origin(coords)
    # the grid's extent: cells of `pitch` level-0 px from the first tile's corner
    x1, y1 = x0 + grid.shape[1] * pitch, y0 + grid.shape[0] * pitch
    cx0, cy0 = min(round(x0 * canvas.scale), canvas.width - 1), min(round(y0 * canvas.scale), canvas.height - 1)
    cx1, cy1 = max(cx0 + 1, round(x1 * canvas.scale)), max(cy0 + 1, round(y1 * canvas.scale))
    up = cv2.resize(grid, (cx1 - cx0, cy1 - cy0), interpolation=cv2.INTER_NEAREST)
    # clip to the canvas (tiles reach the slide's edge at most)
    up = up[: canvas.height - cy0, : canvas.width - cx0]
    if smooth_um > 0:
        sigma = smooth_um / canvas.mpp
        valid = np.isfinite(up).astype(np.float32)
        blurred = cv2.GaussianBlur(np.nan_to_num(up, nan=0.0), (0, 0), sigma)
        weight = cv2.GaussianBlur(valid, (0, 0), sigma)
        with np.errstate(invalid="ignore", divide="ignore"):
            up = np.where(valid > 0, blurred / np.maximum(weight, 1e-6), np.nan).astype(np.float32)
    return ScoreLayer(np.ascontiguousarray(up), (cx0, cy0))


def blend(background: np.ndarray, layer: ScoreLayer, table: np.ndarray, alpha: float = DEFAULT_ALPHA) -> np.ndarray:
    """``background`` with the colour of each finite score in [0, 1] blended over it, in
    place, strip by strip of rows."""
    x0, y0 = layer.offset
    h, w = layer.values.shape
    for top in range(0, h, STRIP_ROWS):
        s = layer.values[top : top + STRIP_ROWS]
        finite = np.isfinite(s)
        if not finite.any():
            continue
        index = np.clip(np.nan_to_num(s, nan=0.0) * 255.0 + 0.5, 0, 255).astype(np.uint8)
        colour = table[index]
        strip = background[y0 + top : y0 + top + len(s), x0 : x0 + w]
        mixed = cv2.addWeighted(np.ascontiguousarray(strip), 1.0 - alpha, colour, alpha, 0.0)
        np.copyto(strip, mixed, where=finite[..., None])
    return background


def probability_lines(probs) -> list[str]:
    """Every class probability, ``PROBS_PER_LINE`` to a line, so none runs off the panel."""
    items = [f"p{c} {float(p):.2f}" for c, p in enumerate(probs)]
    return [", ".join(items[i : i + PROBS_PER_LINE]) for i in range(0, len(items), PROBS_PER_LINE)]


def attention_range_lines(attention, scale: str) -> list[str]:
    """Under rank colouring, the raw attention range (which the colours no longer show)
    and a warning when it is nearly uniform (max/min below ``NEAR_UNIFORM_RATIO``)."""
    if scale != "rank" or len(attention) == 0:
        return []
    lo, hi = float(np.min(attention)), float(np.max(attention))
    ratio = hi / lo if lo > 0 else math.inf
    lines = [f"raw attention {lo:.3g}-{hi:.3g}", f"max/min {ratio:.3g}"]
    if ratio < NEAR_UNIFORM_RATIO:
        lines[1] += f" < {NEAR_UNIFORM_RATIO:g}: nearly uniform,"
        lines.append("colours stretch tiny differences")
    return lines


def legend_figure(height: int, cmap: str, scale: str, lines: list[str], vmin: float = 0.0, vmax: float = 1.0):
    """The legend panel's matplotlib figure, drawn (tests read its text artists)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize

    width_px = 330
    fig = plt.figure(figsize=(width_px / 100, height / 100), dpi=100)
    fig.patch.set_facecolor("white")
    text_h = min(0.45, (20 * (len(lines) + 1)) / height)
    fig.text(0.04, 0.99, "\n".join(lines), va="top", ha="left", fontsize=11, family="sans-serif")
    bar_top = 1 - text_h - 0.03
    ax = fig.add_axes([0.12, 0.04, 0.12, max(0.1, bar_top - 0.04)])
    bar = matplotlib.colorbar.ColorbarBase(ax, cmap=matplotlib.colormaps[cmap], norm=Normalize(vmin, vmax))
    bar.set_label(SCALE_LABELS.get(scale, scale), fontsize=11)
    ax.tick_params(labelsize=10)
    fig.canvas.draw()
    return fig


def legend_panel(height: int, cmap: str, scale: str, lines: list[str], vmin: float = 0.0, vmax: float = 1.0) -> np.ndarray:
    """RGB uint8 (height, ~300, 3): a colour bar with its label and a few lines of text
    (slide, head, prediction), readable at 100 dpi."""
    import matplotlib.pyplot as plt

    fig = legend_figure(height, cmap, scale, lines, vmin, vmax)
    panel = np.asarray(fig.canvas.buffer_rgba())[:, :, :3].copy()
    plt.close(fig)
    return panel


def compose(image: np.ndarray, panel_lines: list[str], cmap: str, scale: str, min_height: int = 420) -> np.ndarray:
    """The heatmap beside its legend panel, on white, at least ``min_height`` tall. A small
    slide (a biopsy, a microscopy image at a coarse --mpp) is enlarged by a whole factor,
    pixels repeated, so its tiles are not a corner of the figure; the panel says so."""
    factor = min_height // image.shape[0] if image.shape[0] else 1
    if factor >= 2:
        image = np.repeat(np.repeat(image, factor, axis=0), factor, axis=1)
        panel_lines = [*panel_lines, f"shown enlarged x{factor}"]
    height = max(image.shape[0], min_height)
    panel = legend_panel(min(height, 1400), cmap, scale, panel_lines)
    out = np.full((height, image.shape[1] + panel.shape[1], 3), 255, np.uint8)
    out[: image.shape[0], : image.shape[1]] = image
    out[: panel.shape[0], image.shape[1] :] = panel
    return out


def write_png(path: str | os.PathLike, image: np.ndarray) -> None:
    ok, png = cv2.imencode(".png", cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    if not ok:
        raise OSError(f"PNG encoding failed for {path}")
    with atomic_output(path) as tmp:
        tmp.write_bytes(png.tobytes())
