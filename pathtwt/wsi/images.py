"""Plain images (JPEG, PNG) as one-level slides.

Regions of interest, TMA cores and microscope photos come as ordinary image files that
neither OpenSlide nor tiffslide opens. :class:`ImageHandle` decodes such a file once, in
full (a few thousand pixels a side: tens of MB), and answers the handful of calls
:class:`pathtwt.wsi.slides.Slide` makes of a reader handle, so tiling, thumbnails,
calibration, streamed training tiles and extraction read it like any slide. (A
single-level, non-pyramidal TIFF needs nothing here: tiffslide reads it.)

Such files rarely state a physical pixel size: JFIF and PNG carry a dpi that is nearly
always a screen placeholder (72 or 96 dpi, i.e. 350 or 265 um/px), which the slide
layer's plausibility range discards, so the cohort must state the size.

A truncated or undecodable file is refused by name at open time (Pillow decodes the
whole image there, and a JPEG without its end-of-image marker is cut short).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pathtwt.errors import SlideError

# File signatures of the formats this reader opens (a suffix can lie; the bytes do not).
SIGNATURES = {b"\xff\xd8\xff": "JPEG", b"\x89PNG\r\n\x1a\n": "PNG"}
SUFFIXES = (".jpg", ".jpeg", ".png")
DPI_KEY = "image.dpi"  # the property with the dpi the file states (its pixel size: 25400 / dpi um)


def image_format(path: str | Path) -> str | None:
    """"JPEG" or "PNG" when the file starts with that format's signature, else None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError:
        return None
    return next((fmt for sig, fmt in SIGNATURES.items() if head.startswith(sig)), None)


def stated_mpp(path: str | Path) -> float | None:
    """The pixel size an image file states (JFIF or PNG pHYs dpi), in um/px, without
    decoding the pixels; None when it states none. Placeholder dpi values are not
    filtered here (the slide layer's plausibility range does that)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            dpi = im.info.get("dpi")
    except (OSError, ValueError, SyntaxError):
        return None
    try:
        x = float(dpi[0]) if dpi else 0.0
    except (TypeError, ValueError, IndexError):
        return None
    return 25400.0 / x if x > 0 else None


def jpeg_is_complete(path: str | Path) -> bool:
    # A JPEG ends with the end-of-image marker FF D9 (a few padding bytes may follow).
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        fh.seek(max(0, size - 64))
        return b"\xff\xd9" in fh.read()


class ImageHandle:
    """A decoded plain image behind the reader-handle calls :class:`Slide` makes
    (``level_count``, ``level_dimensions``, ``level_downsamples``, ``properties``,
    ``read_region(..., as_array=True)``, ``close``)."""

    def __init__(self, path: str | Path):
        from PIL import Image

        path = Path(path)
        fmt = image_format(path)
        if fmt is None:
            raise SlideError(f"{path}: not a JPEG or PNG file (its first bytes say otherwise); convert or exclude it")
        if fmt == "JPEG" and not jpeg_is_complete(path):
            raise SlideError(
                f"{path}: the JPEG is truncated (no end-of-image marker); copy it again from the source or exclude it"
            )
        try:
            with Image.open(path) as im:
                im.load()  # Pillow raises on truncated or undecodable data (LOAD_TRUNCATED_IMAGES off)
                info, mode = dict(im.info), im.mode
                rgb = _as_rgb(im, path)
        except SlideError:
            raise
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            raise SlideError(
                f"{path}: the {fmt} file cannot be decoded ({type(exc).__name__}: {' '.join(str(exc).split())}); "
                "it is corrupt or truncated: copy it again from the source or exclude it"
            ) from None
        self._pixels: np.ndarray | None = rgb
        h, w = rgb.shape[:2]
        self.level_count = 1
        self.level_dimensions = [(w, h)]
        self.level_downsamples = [1.0]
        self.properties: dict[str, Any] = {"image.format": fmt, "image.mode": mode}
        dpi = info.get("dpi")
        if dpi:
            self.properties[DPI_KEY] = float(dpi[0])

    def read_region(self, location: tuple[int, int], level: int, size: tuple[int, int], as_array: bool = True) -> np.ndarray:
        if self._pixels is None:
            raise ValueError("image is closed")
        if level != 0:
            raise ValueError(f"a plain image has one level, not level {level}")
        (x, y), (w, h) = location, size
        # the caller (Slide) only asks for in-bounds regions; a copy keeps the image private
        return np.array(self._pixels[y : y + h, x : x + w])

    def close(self) -> None:
        self._pixels = None


def _as_rgb(im: Any, path: Path) -> np.ndarray:
    """RGB uint8 (h, w, 3). Palette images are expanded, alpha is composited on white;
    grey or 16-bit images are refused (the pipeline is for brightfield RGB)."""
    if im.mode == "P":
        im = im.convert("RGBA")
    if im.mode == "RGBA" or im.mode == "LA":
        rgba = np.asarray(im.convert("RGBA"), dtype=np.uint16)
        a = rgba[..., 3:4]
        return ((rgba[..., :3] * a + 255 * (255 - a) + 127) // 255).astype(np.uint8)
    if im.mode != "RGB":
        raise SlideError(
            f"{path}: pixels are {im.mode} (Pillow mode), not 8-bit RGB; convert it to RGB or exclude it"
        )
    return np.ascontiguousarray(np.asarray(im, dtype=np.uint8))
