"""Tiling speed on a large synthetic slide: `pathtwt tile` against one read of the mask level.

Tiling reads only a low-resolution pyramid level; everything else (Otsu, morphology,
the integral-image tissue fraction of every tile, writing the HDF5) must be cheap next
to that read. Target: tile time <= 3 x mask-level read time.

The slide (default 60,000 x 40,000 px at 0.25 um/px, JPEG tiles, pyramid 1/4/16/64) is
generated tile by tile with bounded memory and cached, so later runs skip it:

    python benchmarks/tiling_speed.py [--width 60000] [--height 40000] [--cache /tmp/pathtwt-bench]

Prints one JSON object with both times (best of --repeat runs) and their ratio.

Measures: `pathtwt tile` on a large generated slide against one read of its mask level (target: at most 3
times); exits 1 when the target is missed.
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/tiling_speed.py --width 4096 --height 4096 --repeat 1
--cache DIR` (smallest: the fixed costs dominate, so its ratio is no test of the target); `PYTHONPATH=$PWD
.venv/bin/python benchmarks/tiling_speed.py` (60,000 x 40,000 px).
JSON keys: printed on stdout: `slide`, `level0_size`, `slide_mb`, `generated_s`, the mask level's
`mask_level`, `mask_level_size` and `mask_shape`, `tiles_kept`, `patch_size_level0`, `mask_read_s`, `tile_s`,
`ratio`, `target_ratio`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import cv2
import numpy as np
import tifffile

TILE = 512
DOWNSAMPLES = (1, 4, 16, 64)
MPP = 0.25
COARSE = 64  # the analytic tissue layout is drawn at 1/64 and resampled per tile


def tissue_layout(width: int, height: int, seed: int) -> np.ndarray:
    """Float tissue map at 1/COARSE resolution: a few elliptical islands with holes."""
    rng = np.random.default_rng(seed)
    w, h = -(-width // COARSE), -(-height // COARSE)
    layout = np.zeros((h, w), np.float32)
    for _ in range(7):
        centre = (int(rng.uniform(0.15, 0.85) * w), int(rng.uniform(0.15, 0.85) * h))
        axes = (int(rng.uniform(0.05, 0.14) * w), int(rng.uniform(0.05, 0.2) * h))
        cv2.ellipse(layout, centre, axes, float(rng.uniform(0, 180)), 0, 360, 1.0, -1)
    for _ in range(10):
        centre = (int(rng.uniform(0, w)), int(rng.uniform(0, h)))
        cv2.circle(layout, centre, int(rng.uniform(3, 12)), 0.0, -1)
    return layout


def level_tiles(layout: np.ndarray, width: int, height: int, ds: int, seed: int) -> Iterator[np.ndarray]:
    """Yield the (TILE, TILE, 3) tiles of the level with downsample ``ds``, row-major."""
    rng = np.random.default_rng(seed + ds)
    # a few pre-drawn textures keep generation fast; tiles differ through the layout
    textures = []
    for _ in range(4):
        base = np.array([225, 140, 185], np.int16) + rng.integers(-30, 31, (TILE, TILE, 1), dtype=np.int16)
        nuclei = rng.random((TILE, TILE)) < 0.06
        base[nuclei] = (100, 60, 150)
        textures.append(np.clip(base, 0, 255).astype(np.uint8))
    glass = np.full((TILE, TILE, 3), 242, np.uint8)
    lw, lh = -(-width // ds), -(-height // ds)
    scale = ds / COARSE  # layout pixels per level pixel
    for ty in range(0, lh, TILE):
        for tx in range(0, lw, TILE):
            # affine resample of the layout onto this tile's pixel grid
            m = np.array([[scale, 0, tx * scale], [0, scale, ty * scale]], np.float32)
            tissue = cv2.warpAffine(layout, m, (TILE, TILE), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP)
            inside = tissue >= 0.5
            if not inside.any():
                yield glass
                continue
            tile = glass.copy()
            texture = textures[(tx // TILE + ty // TILE) % len(textures)]
            tile[inside] = texture[inside]
            yield tile


def make_slide(path: Path, width: int, height: int, seed: int = 0) -> None:
    layout = tissue_layout(width, height, seed)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.tmp-", suffix=".tiff", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with tifffile.TiffWriter(tmp, bigtiff=True) as tif:
            for i, ds in enumerate(DOWNSAMPLES):
                lw, lh = -(-width // ds), -(-height // ds)
                tif.write(
                    level_tiles(layout, width, height, ds, seed),
                    shape=(lh, lw, 3),
                    dtype=np.uint8,
                    tile=(TILE, TILE),
                    compression="jpeg",
                    compressionargs={"level": 85},
                    photometric="rgb",
                    subfiletype=int(i > 0),
                    resolution=(1e4 / (MPP * ds), 1e4 / (MPP * ds)),
                    resolutionunit="CENTIMETER",
                )
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def time_mask_read(slide_path: Path) -> tuple[float, dict]:
    from pathtwt.wsi.slides import open_slide
    from pathtwt.wsi.tissue import TissueParams, mask_read_plan, read_low_resolution

    with open_slide(slide_path) as slide:
        level, factor = mask_read_plan(slide, TissueParams().mask_mpp)
        start = time.perf_counter()
        image = read_low_resolution(slide, level, factor)
        elapsed = time.perf_counter() - start
    return elapsed, {"mask_level": level, "mask_level_size": list(slide.level_dimensions[level]), "mask_shape": list(image.shape[:2])}


def time_tile(slide_path: Path, out: Path) -> float:
    from pathtwt.cli import main

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # keep stdout for the JSON result
        code = main(["tile", str(slide_path), "--out", str(out)])
    elapsed = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"pathtwt tile failed with exit code {code}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=60_000)
    parser.add_argument("--height", type=int, default=40_000)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "pathtwt-bench")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs of each measurement")
    args = parser.parse_args()

    args.cache.mkdir(parents=True, exist_ok=True)
    slide_path = args.cache / f"synthetic_{args.width}x{args.height}.tiff"
    generated_s = None
    if not slide_path.exists():
        start = time.perf_counter()
        make_slide(slide_path, args.width, args.height)
        generated_s = round(time.perf_counter() - start, 1)

    from pathtwt.io.h5 import read_coords

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tiles.h5"
        time_tile(slide_path, out)  # warm the page cache so both timings read from memory
        mask_read, mask_info = min((time_mask_read(slide_path) for _ in range(args.repeat)), key=lambda r: r[0])
        tile = min(time_tile(slide_path, out) for _ in range(args.repeat))
        coords, _, attrs = read_coords(out)
    result = {
        "slide": str(slide_path),
        "level0_size": [args.width, args.height],
        "slide_mb": round(slide_path.stat().st_size / 1e6, 1),
        "generated_s": generated_s,
        **mask_info,
        "tiles_kept": int(len(coords)),
        "patch_size_level0": int(attrs["patch_size_level0"]),
        "mask_read_s": round(mask_read, 3),
        "tile_s": round(tile, 3),
        "ratio": round(tile / mask_read, 2),
        "target_ratio": 3.0,
    }
    print(json.dumps(result, indent=2))
    return 0 if result["ratio"] <= result["target_ratio"] else 1


if __name__ == "__main__":
    sys.exit(main())
