"""A heatmap as a tiled, pyramidal TIFF that slide viewers open (OpenSlide's and tiffslide's
generic-TIFF readers, QuPath): the full image in the first page and its halvings (down to
about 512 px) as the following reduced-resolution pages (OpenSlide's generic TIFF reads
levels from pages, not SubIFDs), 256 x 256 tiles, deflate, and the pixel size in the
resolution tags (pixels per centimetre), so a viewer shows it at the slide's physical
scale. It holds the overlay at the heatmap's ``mpp``, not at the slide's level 0."""

from __future__ import annotations

import os

import cv2
import numpy as np

from pathtwt.io.atomic import atomic_output

TILE = 256
SMALLEST = 512


def pyramid(image: np.ndarray) -> list[np.ndarray]:
    levels = [image]
    while max(levels[-1].shape[:2]) > SMALLEST:
        h, w = levels[-1].shape[:2]
        levels.append(cv2.resize(levels[-1], (max(1, w // 2), max(1, h // 2)), interpolation=cv2.INTER_AREA))
    return levels


def write_pyramid_tiff(path: str | os.PathLike, image: np.ndarray, mpp: float) -> None:
    import tifffile

    levels = pyramid(np.ascontiguousarray(image, dtype=np.uint8))
    with atomic_output(path) as tmp:
        with tifffile.TiffWriter(tmp, bigtiff=image.size > 2**31) as tif:
            for i, level in enumerate(levels):
                downsample = image.shape[1] / level.shape[1]
                per_cm = 1e4 / (mpp * downsample)
                tif.write(
                    level, photometric="rgb", tile=(TILE, TILE), compression="zlib",
                    resolution=(per_cm, per_cm), resolutionunit="CENTIMETER",
                    subfiletype=1 if i else 0,
                    description=f"pathtwt heatmap; mpp={mpp * downsample:.6g}" if i == 0 else None,
                    metadata=None,
                )
