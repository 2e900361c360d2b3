"""Tissue detection on a low-resolution image of the slide.

Brightfield (H&E, IHC): stained tissue is saturated, glass and background are grey or
white. The mask is an Otsu threshold of the HSV saturation channel after a median blur
(which removes JPEG noise and dust), followed by a morphological closing (bridges the
gaps between nuclei and faint stroma), then removal of small objects (debris, pen dots)
and the filling of small holes. Sizes are in microns, so the result does not depend on
the mask resolution.

Fluorescence (a slide opened with a channel map): tissue is bright on a dark background.
The signal is the brightest of the chosen channels at each pixel, thresholded by Otsu
the same way (floor and cap on the threshold), with the same clean-up.

The modality is checked on the same low-resolution image before any threshold: a
brightfield slide has bright glass, so much near-black background means a fluorescence
scan (which saturation would call tissue everywhere, JPEG noise on black being
"saturated"), and a bright one in fluorescence mode means a brightfield scan. Either
is refused with one line that says how to proceed.

Only a coarse pyramid level is read: never level 0 when the slide has coarser levels.
A single-level slide is read in horizontal strips that are downsampled as they arrive,
so memory stays bounded for any slide size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import cv2
import numpy as np

from pathtwt.errors import SlideError
from pathtwt.wsi.slides import Slide

MODALITIES = ("brightfield", "fluorescence")

# Pixels per strip when reading the mask level in pieces: ~64 MB as RGBA from the reader.
_STRIP_PIXELS = 16 * 1024 * 1024


@dataclass(frozen=True)
class TissueParams:
    """Tissue-detection settings; sizes in microns so they hold at any mask mpp."""

    mask_mpp: float = 8.0  # target resolution of the mask (um/px); the nearest pyramid level is used
    median_um: float = 56.0  # median-blur window (odd number of mask pixels, >= 3)
    min_saturation: int = 15  # floor on the Otsu threshold: a blank slide stays blank
    # Cap on the Otsu threshold: with much dark, saturated tissue Otsu splits the tissue
    # itself and drops pale (faint-stained, thin) regions; glass stays far below the cap.
    max_saturation: int = 40
    close_um: float = 32.0  # closing kernel diameter
    min_object_um2: float = 20_000.0  # drop tissue islands smaller than this (~140 um square)
    max_hole_um2: float = 20_000.0  # fill background holes smaller than this
    # fluorescence: floor and cap on the Otsu threshold of the channel intensity (0..255);
    # the cap keeps dim cytoplasm when bright nuclei would pull Otsu up between the two
    min_intensity: int = 10
    max_intensity: int = 64
    # modality check on the brightness (max of R, G, B) of the mask image. A fluorescence
    # background is near black; brightfield glass is near white and even dense H&E
    # (lymphocytes) has under 7 % of pixels below 30 at full resolution (measured on public
    # labelled H&E tile sets: Kather 2016, NCT-CRC-HE), fewer once averaged to the mask resolution
    dark_level: int = 30
    brightfield_max_dark_fraction: float = 0.3
    fluorescence_max_median: int = 200


@dataclass
class TissueMask:
    """A boolean tissue mask and how it maps to level 0: mask pixel (i, j) covers the
    level-0 box [j * downsample[0], (j + 1) * downsample[0]) x [i * downsample[1], ...)."""

    mask: np.ndarray  # bool (h, w)
    downsample: tuple[float, float]  # (x, y) level-0 pixels per mask pixel
    level: int  # pyramid level that was read
    mpp: float  # microns per mask pixel (x)
    threshold: float  # threshold applied (0..255) to the signal
    image: np.ndarray = field(repr=False)  # RGB uint8 (h, w, 3) the mask was computed from
    signal: str = "saturation"  # "saturation" (brightfield) or "intensity" (fluorescence)

    @property
    def tissue_fraction(self) -> float:
        return float(self.mask.mean()) if self.mask.size else 0.0


def choose_mask_level(slide: Slide, mask_mpp: float) -> int:
    """The level whose mpp is closest (in log scale) to ``mask_mpp``, the finer one on a
    tie; level 0 only when the slide has no other level."""
    levels = range(1, slide.level_count) if slide.level_count > 1 else range(1)
    # rounded (~1 %) so that e.g. 4 and 15.99 um/px around a target of 8 count as a tie
    return min(levels, key=lambda lv: (round(abs(math.log(slide.level_mpp(lv) / mask_mpp)), 2), lv))


def mask_read_plan(slide: Slide, mask_mpp: float) -> tuple[int, int]:
    """(level, factor): the mask is that level averaged down by the integer factor."""
    level = choose_mask_level(slide, mask_mpp)
    level_mpp = slide.level_mpp(level)
    # A level much finer than the target (e.g. a single-level slide) is averaged down
    # while reading, so the mask never holds more pixels than needed.
    factor = max(1, int(round(mask_mpp / level_mpp))) if level_mpp < mask_mpp / 1.5 else 1
    return level, factor


def read_low_resolution(slide: Slide, level: int, factor: int) -> np.ndarray:
    """Level ``level`` downsampled by an integer ``factor`` (area average), read in strips
    of bounded size. Edges are padded with white up to a whole mask pixel."""
    lw, lh = slide.level_dimensions[level]
    ds = slide.level_downsamples[level]
    out_w, out_h = math.ceil(lw / factor), math.ceil(lh / factor)
    rows_per_strip = max(1, _STRIP_PIXELS // max(1, lw * factor)) * factor  # level rows, multiple of factor
    out = np.empty((out_h, out_w, 3), np.uint8)
    for y0 in range(0, out_h * factor, rows_per_strip):
        h = min(rows_per_strip, out_h * factor - y0)
        strip = slide.read_region(0, int(round(y0 * ds)), level, out_w * factor, h)
        if factor > 1:
            strip = cv2.resize(strip, (out_w, h // factor), interpolation=cv2.INTER_AREA)
        out[y0 // factor : (y0 + h) // factor] = strip
    return out


def _odd(n: float, minimum: int = 1) -> int:
    k = max(minimum, int(round(n)))
    return k if k % 2 else k + 1


def saturation_mask(rgb: np.ndarray, mpp: float, params: TissueParams) -> tuple[np.ndarray, float]:
    """(bool mask, threshold) from an RGB image whose pixels are ``mpp`` microns."""
    if rgb.size == 0:
        return np.zeros(rgb.shape[:2], bool), float(params.min_saturation)
    sat = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)[..., 1]
    return _otsu_mask(sat, mpp, params, params.min_saturation, params.max_saturation)


def intensity_mask(channels: np.ndarray, mpp: float, params: TissueParams) -> tuple[np.ndarray, float]:
    """(bool mask, threshold) of fluorescence: Otsu on the brightest chosen channel."""
    if channels.size == 0:
        return np.zeros(channels.shape[:2], bool), float(params.min_intensity)
    intensity = np.ascontiguousarray(channels.max(axis=2))
    return _otsu_mask(intensity, mpp, params, params.min_intensity, params.max_intensity)


def check_modality(slide: Slide, rgb: np.ndarray, modality: str, params: TissueParams) -> None:
    """Raise :class:`SlideError` when the mask image contradicts ``modality``: much near-
    black background for brightfield, bright glass (median) for fluorescence."""
    if rgb.size == 0:
        return
    brightness = rgb.max(axis=2)
    dark = float((brightness < params.dark_level).mean())
    if modality == "brightfield" and dark > params.brightfield_max_dark_fraction:
        raise SlideError(
            f"{slide.path}: not a brightfield slide: its background is dark ({dark:.0%} of the tissue-detection "
            f"level is below {params.dark_level} of 255, where brightfield glass is white), as in fluorescence; "
            "for a fluorescence scan give the channels to use (`pathtwt tile --channels I,J,K`, or the cohort's "
            "`modality: fluorescence` and `channels`), otherwise exclude it"
        )
    median = float(np.median(brightness))
    if modality == "fluorescence" and median > params.fluorescence_max_median:
        raise SlideError(
            f"{slide.path}: not a fluorescence slide: its background is bright (median brightness {median:.0f} of "
            f"255 at the tissue-detection level), as brightfield glass; drop --channels (cohort `modality: "
            "brightfield`), or pass --modality brightfield to keep the channel map"
        )


def _otsu_mask(signal: np.ndarray, mpp: float, params: TissueParams, floor: int, cap: int) -> tuple[np.ndarray, float]:
    signal = cv2.medianBlur(signal, _odd(params.median_um / mpp, minimum=3))
    otsu, _ = cv2.threshold(signal, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    threshold = float(np.clip(otsu, floor, cap))
    mask = (signal > threshold).astype(np.uint8)
    k = _odd(params.close_um / mpp)
    if k > 1:
        kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (k, k))
        mask = cv2.morphologyEx(mask, cv2.MORPH_CLOSE, kernel)
    px_area = mpp * mpp
    mask = _drop_small_components(mask, params.min_object_um2 / px_area)
    holes = _drop_small_components(1 - mask, params.max_hole_um2 / px_area, keep_border=True)
    return holes == 0, threshold


def _drop_small_components(binary: np.ndarray, min_area: float, keep_border: bool = False) -> np.ndarray:
    """Zero the 8-connected components of ``binary`` smaller than ``min_area`` pixels.
    With ``keep_border``, components touching the image border are kept (background
    that reaches the edge is never a hole)."""
    n, labels, stats, _ = cv2.connectedComponentsWithStats(binary.astype(np.uint8), connectivity=8)
    if n <= 1:
        return binary.astype(np.uint8)
    keep = stats[:, cv2.CC_STAT_AREA] >= min_area
    if keep_border:
        h, w = binary.shape
        x, y = stats[:, cv2.CC_STAT_LEFT], stats[:, cv2.CC_STAT_TOP]
        bw, bh = stats[:, cv2.CC_STAT_WIDTH], stats[:, cv2.CC_STAT_HEIGHT]
        keep |= (x == 0) | (y == 0) | (x + bw == w) | (y + bh == h)
    keep[0] = False  # label 0 is the other class
    return keep[labels].astype(np.uint8)


def default_modality(slide: Slide) -> str:
    """Fluorescence when the slide was opened with a channel map, else brightfield."""
    return "fluorescence" if slide.channel_map is not None else "brightfield"


def detect_tissue(slide: Slide, params: TissueParams = TissueParams(), modality: str | None = None) -> TissueMask:
    """Read the mask level once, check the modality, and return the tissue mask."""
    modality = modality or default_modality(slide)
    if modality not in MODALITIES:
        raise SlideError(f"{slide.path}: modality {modality!r} is unknown; use one of {', '.join(MODALITIES)}")
    level, factor = mask_read_plan(slide, params.mask_mpp)
    rgb = read_low_resolution(slide, level, factor)
    w0, h0 = slide.dimensions
    lw, lh = slide.level_dimensions[level]
    downsample = (w0 / lw * factor, h0 / lh * factor)
    mpp = slide.mpp * downsample[0]
    check_modality(slide, rgb, modality, params)
    if modality == "brightfield":
        mask, threshold = saturation_mask(rgb, mpp, params)
        signal = "saturation"
    else:
        mask, threshold = intensity_mask(rgb, mpp, params)
        signal = "intensity"
    return TissueMask(mask=mask, downsample=downsample, level=level, mpp=mpp, threshold=threshold, signal=signal,
                      image=rgb)
