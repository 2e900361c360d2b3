"""Memory over a long extraction run: peak and current RSS after 10 and after 100 slides
extracted in ONE process with ONE loaded backbone (random weights), through
pathtwt.features.extract.extract_slide. Small generated slides (JPEG-tiled TIFF, ~10-30 tissue
tiles each) are tiled in the same process first. Prints one JSON object.

    python benchmarks/extract_memory.py [--slides 100] [--backbone vit-s14-tiny] [--workers 0]

Measures: peak and current resident memory after a checkpoint and after the last of many small slides
extracted in one process with one loaded backbone.
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/extract_memory.py --slides 3 --checkpoint 2` (smallest);
`PYTHONPATH=$PWD .venv/bin/python benchmarks/extract_memory.py` (100 slides).
JSON keys: printed on stdout: `backbone`, `weights` (random), `workers`, `torch_threads`,
`rss_mb_after_backbone` (once the backbone is built), `rss_mb_after_N` and `peak_rss_mb_after_N` (N the
checkpoint and the last slide), `slides`, `tiles_total`, `tiles_per_slide_mean`, `seconds`,
`peak_growth_mb_10_to_end` (checkpoint to end).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import tifffile


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def rss_mb() -> float:
    """Current resident set size of this process."""
    return _status_mb("VmRSS")


def peak_rss_mb() -> float:
    """Peak RSS of this process (VmHWM: unlike ru_maxrss it does not inherit the
    high-water mark of the process that started this one)."""
    return _status_mb("VmHWM")


def write_slide(path: Path, seed: int, side: int = 1024) -> None:
    """A pink tissue ellipse of seeded size on glass, two pyramid levels, 0.5 um/px."""
    rng = np.random.default_rng(seed)
    image = np.full((side, side, 3), 238, np.uint8)
    axes = (int(rng.integers(side // 6, side // 3)), int(rng.integers(side // 6, side // 3)))
    cv2.ellipse(image, (side // 2, side // 2), axes, float(rng.uniform(0, 180)), 0, 360, (200, 110, 170), -1)
    image = (image.astype(np.int16) + rng.integers(-12, 12, image.shape)).clip(0, 255).astype(np.uint8)
    with tifffile.TiffWriter(path) as tif:
        for i, ds in enumerate((1, 4)):
            level = image if ds == 1 else cv2.resize(image, (side // ds, side // ds), interpolation=cv2.INTER_AREA)
            tif.write(level, tile=(256, 256), compression="jpeg", photometric="rgb", subfiletype=int(i > 0),
                      resolution=(1e4 / (0.5 * ds),) * 2, resolutionunit="CENTIMETER")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slides", type=int, default=100)
    parser.add_argument("--checkpoint", type=int, default=10, help="also report after this many slides")
    parser.add_argument("--backbone", default="vit-s14-tiny", help="registry name, built with random weights")
    parser.add_argument("--workers", type=int, default=0, help="tile-reading processes per slide")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)

    import torch

    from pathtwt.models.registry import create_backbone
    from pathtwt.features.extract import extract_slide
    from pathtwt.io.h5 import write_coords
    from pathtwt.wsi.slides import open_slide
    from pathtwt.wsi.tiling import tile_slide

    backbone = create_backbone(args.backbone, pretrained=False)
    tile_size = backbone.spec.input_size
    report: dict = {"backbone": args.backbone, "weights": "random", "workers": args.workers,
                    "torch_threads": torch.get_num_threads(), "rss_mb_after_backbone": round(rss_mb(), 1)}
    tiles_total, start = 0, time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for i in range(1, args.slides + 1):
            slide = folder / f"slide{i:03d}.tiff"
            write_slide(slide, seed=i)
            with open_slide(slide) as s:
                # tiles covering 128 level-0 px (64 um): ~10-30 tissue tiles on these slides
                tiling = tile_slide(s, target_mpp=128 * 0.5 / tile_size, tile_size=tile_size, min_tissue=0.5)
            coords = folder / f"slide{i:03d}.coords.h5"
            write_coords(coords, tiling.coords, tiling.tissue_fraction, tiling.attrs)
            summary = extract_slide(slide, coords, folder / f"slide{i:03d}.h5", backbone,
                                    batch_size=args.batch_size, workers=args.workers, progress=False)
            tiles_total += summary["tiles"]
            for path in (slide, coords, folder / f"slide{i:03d}.h5"):
                path.unlink()  # disk stays small; memory is what is measured
            if i == args.checkpoint:
                report[f"rss_mb_after_{i}"] = round(rss_mb(), 1)
                report[f"peak_rss_mb_after_{i}"] = round(peak_rss_mb(), 1)
    report[f"rss_mb_after_{args.slides}"] = round(rss_mb(), 1)
    report[f"peak_rss_mb_after_{args.slides}"] = round(peak_rss_mb(), 1)
    report["slides"] = args.slides
    report["tiles_total"] = tiles_total
    report["tiles_per_slide_mean"] = round(tiles_total / max(1, args.slides), 1)
    report["seconds"] = round(time.perf_counter() - start, 1)
    if f"peak_rss_mb_after_{args.checkpoint}" in report:
        report["peak_growth_mb_10_to_end"] = round(
            report[f"peak_rss_mb_after_{args.slides}"] - report[f"peak_rss_mb_after_{args.checkpoint}"], 1)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
