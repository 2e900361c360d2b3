"""A thumbnail PNG for checking tiling at a glance: the mask-level image with the
tissue outline (bright green on a black halo, a few pixels wide, so it stays visible on
pale tissue and when the image is shown shrunk in the report) and the kept tiles (blue)
drawn on it, and the regions of a ``--roi`` (include orange, excluded red)."""

from __future__ import annotations

import os

import cv2
import numpy as np

from pathtwt.io.atomic import atomic_output
from pathtwt.wsi.tiling import Tiling

TISSUE_COLOUR = (0, 255, 60)  # RGB
TILE_COLOUR = (0, 60, 255)
HALO_COLOUR = (0, 0, 0)
ROI_COLOUR = (255, 150, 0)  # the include areas of a --roi
EXCLUDED_COLOUR = (220, 0, 0)  # its excluded areas


def outline_width(image_shape: tuple[int, ...]) -> int:
    """Outline thickness in pixels: about 0.3 % of the longer side, at least 2, so that it
    is still a few screen pixels wide when the report shows the image at ~350 px."""
    return max(2, round(max(image_shape[:2]) / 300))


def render_thumbnail(tiling: Tiling, min_side: int = 1024, max_side: int = 2048, regions=()) -> np.ndarray:
    """RGB uint8 image: the mask-level image, shrunk to at most ``max_side`` pixels, or
    enlarged by a whole factor towards ``min_side`` so tile outlines stay visible; with
    ``regions`` (:class:`pathtwt.wsi.roi.Region`), the ROI outlines too."""
    mask = tiling.tissue
    image = mask.image
    outline = mask.mask.astype(np.uint8)
    longest = max(1, *image.shape[:2])
    scale = max_side / longest if longest > max_side else float(max(1, min_side // longest))
    if scale != 1.0:
        size = (max(1, round(image.shape[1] * scale)), max(1, round(image.shape[0] * scale)))
        image = cv2.resize(image, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_NEAREST)
        outline = cv2.resize(outline, size, interpolation=cv2.INTER_NEAREST)
    else:
        image = image.copy()
    contours, _ = cv2.findContours(outline, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    side = tiling.attrs["patch_size_level0"]
    sx, sy = scale / mask.downsample[0], scale / mask.downsample[1]
    for x, y in tiling.coords:
        top_left = (int(x * sx), int(y * sy))
        bottom_right = (int((x + side) * sx) - 1, int((y + side) * sy) - 1)
        cv2.rectangle(image, top_left, bottom_right, TILE_COLOUR, 1)
    # the outline last, over the tiles: a black halo under a bright line
    width = outline_width(image.shape)
    cv2.drawContours(image, contours, -1, HALO_COLOUR, width + 2)
    cv2.drawContours(image, contours, -1, TISSUE_COLOUR, width)
    for region in regions:
        rings = [np.round(ring * (sx, sy)).astype(np.int32).reshape(-1, 1, 2) for ring in region.rings]
        cv2.polylines(image, rings, True, EXCLUDED_COLOUR if region.excluded else ROI_COLOUR, width)
    return image


def write_thumbnail(path: str | os.PathLike, tiling: Tiling, regions=()) -> None:
    image = render_thumbnail(tiling, regions=regions)
    ok, png = cv2.imencode(".png", cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    if not ok:
        raise OSError(f"PNG encoding failed for {path}")
    with atomic_output(path) as tmp:
        tmp.write_bytes(png.tobytes())
