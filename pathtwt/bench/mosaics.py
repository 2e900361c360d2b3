"""Slide mosaics: a real image repeated into a pyramidal JPEG TIFF of any size, and the
coordinates of every tile of it, so a throughput measurement reads a slide as large as it
needs while only one small real slide travels."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

# 40x: the same pixels read at twice the resolution (448 -> 224 px a tile)
MOSAIC_MPP = {"20x": 0.5, "40x": 0.25}
# 40x: level 0 alone, so its tiles are read there (448 -> 224 px), as in an Aperio 40x scan whose
# next level is 4x down. A halving pyramid would be read at its second level instead (224 px
# a tile, the 20x cost), and at an odd size that level's downsample is a shade over 2
# (2967 -> 1484 rows): tiles whose corners fall between its pixels go as finished tiles,
# and a device-path measurement would measure the CPU path
MOSAIC_LEVELS: dict[str, int | None] = {"20x": None, "40x": 1}


def image_grid(images: Sequence[np.ndarray], columns: int) -> np.ndarray:
    """The images (equal sizes, RGB uint8) side by side, ``columns`` to a row, row after
    row; a last row that is not full is left out."""
    rows = len(images) // columns
    if rows < 1:
        raise ValueError(f"{len(images)} images do not fill one row of {columns}")
    grid = [np.concatenate(list(images[r * columns:(r + 1) * columns]), axis=1) for r in range(rows)]
    return np.ascontiguousarray(np.concatenate(grid, axis=0))


def write_mosaic(path: str | Path, image: np.ndarray, copies: tuple[int, int], mpp: float,
                 levels: int | None = None, *, tile: int = 256, quality: int = 90) -> Path:
    """A JPEG TIFF of ``copies`` (columns, rows) of ``image`` side by side at ``mpp`` um/px,
    with ``levels`` levels (None: the full halving pyramid), ``tile`` px native tiles at JPEG
    ``quality``; written atomically (:func:`pathtwt.demo.tiff_writer.write_pyramidal_tiff`)."""
    from pathtwt.demo.tiff_writer import write_pyramidal_tiff

    h, w = image.shape[:2]

    def region(x: int, y: int, rw: int, rh: int) -> np.ndarray:
        return image[(y + np.arange(rh)) % h][:, (x + np.arange(rw)) % w]

    write_pyramidal_tiff(path, w * copies[0], h * copies[1], region, mpp=mpp, levels=levels, tile=tile,
                         quality=quality)
    return Path(path)


def mosaic_coords(slide: str | Path, out: str | Path, *, target_mpp: float = 0.5, tile_size: int = 224) -> Path:
    """Every ``tile_size`` px tile of ``slide`` at ``target_mpp`` (distinct positions, no
    tissue filter), written as a coordinates file ``out`` as ``pathtwt tile`` writes one."""
    from pathtwt.io.h5 import write_coords
    from pathtwt.wsi.slides import open_slide
    from pathtwt.wsi.tiling import tile_slide

    with open_slide(slide) as opened:
        tiling = tile_slide(opened, target_mpp=target_mpp, tile_size=tile_size, min_tissue=0.0)
    write_coords(out, tiling.coords, tiling.tissue_fraction, {**tiling.attrs, "slide_path": str(slide)})
    return Path(out)


def plan_mosaics(wanted: dict[str, tuple[int, int]], seconds_per_copy: float,
                 budget_s: float) -> dict[str, tuple[int, int]]:
    """The copies (columns, rows) of each mosaic written within ``budget_s``: the largest
    mosaic loses a column or a row (its longer side) until the estimate fits, down to 1 x 1."""
    copies = dict(wanted)

    def cost() -> float:
        return sum(c * r for c, r in copies.values()) * seconds_per_copy

    while cost() > budget_s and any(c * r > 1 for c, r in copies.values()):
        name = max(copies, key=lambda k: copies[k][0] * copies[k][1])
        c, r = copies[name]
        copies[name] = (c - 1, r) if c >= r else (c, r - 1)
    return copies


def build_mosaics(image: np.ndarray, folder: str | Path, wanted: dict[str, tuple[int, int]], budget_s: float,
                  *, log: Callable[[str], None] | None = None) -> tuple[dict[str, Path], dict[str, Path], dict]:
    """The mosaics named in ``wanted`` ("20x", "40x": see :data:`MOSAIC_MPP`) and their
    coordinates in ``folder``, written within ``budget_s``: one copy is written first to
    time it, then each mosaic with the copies :func:`plan_mosaics` allows. Returns (mosaic
    paths, coordinates paths, facts: copies written and wanted and tiles per mosaic, seconds)."""
    from pathtwt.io.h5 import count_coords

    folder = Path(folder)
    began = time.perf_counter()
    write_mosaic(folder / "timing.tiff", image, (1, 1), 0.5)
    per_copy = time.perf_counter() - began
    (folder / "timing.tiff").unlink(missing_ok=True)
    copies = plan_mosaics(wanted, per_copy, max(budget_s - per_copy, 0.0))
    mosaics = {k: write_mosaic(folder / f"mosaic{k}.tiff", image, c, MOSAIC_MPP[k], MOSAIC_LEVELS[k])
               for k, c in copies.items()}
    coords = {k: mosaic_coords(m, folder / f"coords{k}.h5") for k, m in mosaics.items()}
    seconds = time.perf_counter() - began
    facts = {"mosaics": {k: {"copies": list(c), "wanted": list(wanted[k]), "tiles": count_coords(coords[k])}
                         for k, c in copies.items()},
             "mosaics_seconds": round(seconds, 1)}
    if log:
        log(f"mosaics {', '.join(f'{k} {c[0]}x{c[1]} ({count_coords(coords[k])} tiles)' for k, c in copies.items())}"
            f" written in {seconds:.0f} s (budget {budget_s:.0f} s, {per_copy:.1f} s a copy)")
    return mosaics, coords, facts
