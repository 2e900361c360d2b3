"""Tissue tile coordinates of one slide.

Tiles are a non-overlapping grid of ``tile_size`` pixels at ``target_mpp`` microns per
pixel, anchored at the level-0 origin; only whole tiles inside the slide are kept.
Each tile's tissue fraction comes from the low-resolution tissue mask through an
integral image, for every tile at once, so tiling reads only the mask level and
never a level-0 pixel. Two filters, as in the paper's cohorts:

* ``fraction``: keep tiles whose tissue fraction is >= ``min_tissue`` (PANDA, TCGA-PRAD:
  0.6 by default);
* ``otsu``: keep tiles of the Otsu tissue regions with at least ``min_tissue`` tissue
  (CAMELYON; 0.25 by default). Keeping every tile that merely touched tissue kept tiles of
  0.5 % tissue, i.e. glass, which count in a bag as much as any tissue tile; a quarter
  keeps the tissue borders (where metastases often sit) and drops such slivers.

``target_magnification`` is recorded as round(10 / target_mpp): the usual convention
that a 10x objective images ~1 um/px, so 0.5 um/px is "20x" and 0.25 um/px is "40x".

Pixels are never invented silently: a target mpp finer than the slide's level 0 by more
than 1 % is an error unless ``allow_upsample`` (then recorded as ``upsample_factor``).
A slide smaller than one tile gets status ``too_small`` and no tiles. The coords file
also records the slide's fingerprint (:mod:`pathtwt.wsi.fingerprint`), so extraction
can refuse coords made from another slide.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from pathtwt.errors import PathtwtError, SlideError
from pathtwt.wsi.fingerprint import slide_fingerprint
from pathtwt.wsi.slides import Slide
from pathtwt.wsi.tissue import TissueMask, TissueParams, default_modality, detect_tissue

# a target this much finer than level 0 is still "the slide's resolution" (metadata rounding)
UPSAMPLE_TOLERANCE = 1.01

TISSUE_FILTERS = ("fraction", "otsu")
# The minimum tissue share of a kept tile when none is given (see the module doc).
DEFAULT_MIN_TISSUE = {"fraction": 0.6, "otsu": 0.25}


@dataclass
class Tiling:
    coords: np.ndarray  # int64 (N, 2) level-0 top-left (x, y) of the kept tiles, row-major
    tissue_fraction: np.ndarray  # float32 (N,)
    attrs: dict[str, Any]  # the coords-file attributes (pathtwt.io.h5.COORDS_ATTRS and provenance)
    tissue: TissueMask


def target_magnification(target_mpp: float) -> int:
    return int(round(10.0 / target_mpp))


def upsample_factor(slide: Slide, target_mpp: float) -> float:
    """How much a tile at ``target_mpp`` is stretched from level-0 pixels (1.0 if not)."""
    return max(1.0, slide.mpp / target_mpp)


def check_upsampling(slide: Slide, target_mpp: float, allow_upsample: bool = False) -> float:
    """The upsampling factor; raises :class:`SlideError` naming both mpps when the target
    is finer than level 0 by more than 1 % and upsampling was not allowed."""
    factor = upsample_factor(slide, target_mpp)
    if factor > UPSAMPLE_TOLERANCE and not allow_upsample:
        raise SlideError(
            f"{slide.path}: target {target_mpp:g} um/px is finer than the slide's level 0 ({slide.mpp:.4g} um/px, "
            f"from {slide.mpp_source}): tiles would be upsampled {factor:.2f}x; use --mpp {slide.mpp:.4g} or coarser "
            "(cohort `tiling.target_mpp`), or --allow-upsample (`tiling.allow_upsample`) to accept stretched tiles"
        )
    return factor


def tile_geometry(slide: Slide, target_mpp: float, tile_size: int) -> tuple[int, int]:
    """(patch_size_level0, read_level) for tiles of ``tile_size`` px at ``target_mpp``."""
    patch_size_level0 = int(round(tile_size * target_mpp / slide.mpp))
    if patch_size_level0 < 1:
        raise PathtwtError(f"{slide.path}: tile of {tile_size} px at {target_mpp} um/px is below one slide pixel")
    return patch_size_level0, slide.level_for_mpp(target_mpp)


def grid_tissue_fraction(
    mask: np.ndarray, downsample: tuple[float, float], patch_size_level0: int, level0_size: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Level-0 top-left corners (N, 2) of the whole-tile grid and each tile's tissue
    fraction in ``mask``, vectorised through an integral image."""
    w0, h0 = level0_size
    nx, ny = w0 // patch_size_level0, h0 // patch_size_level0
    xs = np.arange(nx, dtype=np.int64) * patch_size_level0
    ys = np.arange(ny, dtype=np.int64) * patch_size_level0
    mh, mw = mask.shape
    # one pass, no full-size temporaries (a 100k-px slide has a 6400^2 mask: numpy's
    # cumsum chain in int64 would peak near 1 GB); int32 sums are exact below 2^31 pixels
    depth = cv2.CV_32S if mask.size < 2**31 else cv2.CV_64F
    integral = cv2.integral(np.ascontiguousarray(mask, dtype=np.uint8), sdepth=depth)

    def bounds(starts: np.ndarray, ds: float, limit: int) -> tuple[np.ndarray, np.ndarray]:
        # the mask pixels whose centres fall inside each tile (at least one pixel)
        lo = np.clip(np.round(starts / ds), 0, limit).astype(np.int64)
        hi = np.clip(np.maximum(np.round((starts + patch_size_level0) / ds), lo + 1), 0, limit).astype(np.int64)
        return lo, hi

    x0, x1 = bounds(xs, downsample[0], mw)
    y0, y1 = bounds(ys, downsample[1], mh)

    def corner(ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
        return integral[np.ix_(ys, xs)].astype(np.int64)

    sums = corner(y1, x1) - corner(y0, x1) - corner(y1, x0) + corner(y0, x0)
    area = np.outer(y1 - y0, x1 - x0)
    fraction = np.divide(sums, area, out=np.zeros(sums.shape, np.float64), where=area > 0)
    gx, gy = np.meshgrid(xs, ys)
    coords = np.stack([gx.ravel(), gy.ravel()], axis=1)
    return coords, fraction.ravel().astype(np.float32)


@dataclass(frozen=True)
class TilingDefaults:
    """The tiling defaults, written once: ``tile_slide``'s signature, ``pathtwt tile``'s flags
    and the workflow config schema (``cohorts.*.tiling``, filled in by
    :func:`pathtwt.config.check.load_schema`) all read them from here."""

    target_mpp: float = 0.5  # 20x
    tile_size: int = 256
    tissue: str = "fraction"
    min_tissue: float | None = None  # None: the filter's DEFAULT_MIN_TISSUE
    allow_upsample: bool = False


TILING_DEFAULTS = TilingDefaults()


def tile_slide(
    slide: Slide,
    *,
    target_mpp: float = TILING_DEFAULTS.target_mpp,
    tile_size: int = TILING_DEFAULTS.tile_size,
    tissue: str = TILING_DEFAULTS.tissue,
    min_tissue: float | None = TILING_DEFAULTS.min_tissue,
    params: TissueParams = TissueParams(),
    modality: str | None = None,
    allow_upsample: bool = TILING_DEFAULTS.allow_upsample,
) -> Tiling:
    """Detect tissue and return the kept tiles with the coords-file attributes.
    ``modality``: "brightfield" or "fluorescence" (default: fluorescence when the slide
    has a channel map). ``min_tissue`` None: the filter's ``DEFAULT_MIN_TISSUE``."""
    if tissue not in TISSUE_FILTERS:
        raise PathtwtError(f"tissue filter {tissue!r} is unknown; use one of {', '.join(TISSUE_FILTERS)}")
    if min_tissue is None:
        min_tissue = DEFAULT_MIN_TISSUE[tissue]
    if not 0.0 <= min_tissue <= 1.0:
        raise PathtwtError(f"min_tissue={min_tissue} must lie in [0, 1]")
    factor = check_upsampling(slide, target_mpp, allow_upsample)
    patch_size_level0, read_level = tile_geometry(slide, target_mpp, tile_size)
    modality = modality or default_modality(slide)
    mask = detect_tissue(slide, params, modality)
    coords, fraction = grid_tissue_fraction(mask.mask, mask.downsample, patch_size_level0, slide.dimensions)
    # both filters keep tiles with at least min_tissue tissue (they differ in their default);
    # min_tissue == 0 would keep background: still require some tissue
    keep = (fraction >= min_tissue) & (fraction > 0)
    coords, fraction = coords[keep], fraction[keep]
    too_small = min(slide.dimensions) < patch_size_level0
    attrs: dict[str, Any] = {
        "patch_size": int(tile_size),
        "patch_size_level0": patch_size_level0,
        "target_mpp": float(target_mpp),
        "level0_mpp": float(slide.mpp),
        "read_level": int(read_level),
        "level0_width": int(slide.dimensions[0]),
        "level0_height": int(slide.dimensions[1]),
        "target_magnification": target_magnification(target_mpp),
        "status": "too_small" if too_small else "ok" if len(coords) else "no_tissue",
        "slide_path": os.fspath(slide.path),
        # provenance: how the tiles were chosen
        "mpp_source": slide.mpp_source,
        "reader": slide.reader,
        "channel_map": list(slide.channel_map) if slide.channel_map else None,
        "tissue_filter": tissue,
        "min_tissue": float(min_tissue),
        "mask_level": int(mask.level),
        "mask_mpp": float(mask.mpp),
        "mask_downsample": [float(mask.downsample[0]), float(mask.downsample[1])],
        "modality": modality,
        "tissue_signal": mask.signal,
        "tissue_threshold": float(mask.threshold),  # on the signal (saturation or intensity, 0..255)
        "slide_tissue_fraction": mask.tissue_fraction,
        "allow_upsample": bool(allow_upsample),
        "upsample_factor": float(factor),
        "reader_notes": list(slide.reader_notes),
    }
    attrs.update(slide_fingerprint(slide))
    return Tiling(coords=coords, tissue_fraction=fraction, attrs=attrs, tissue=mask)
