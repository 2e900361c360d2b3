"""Whole-slide images behind one factory.

``open_slide(path)`` tries OpenSlide first (Aperio, Hamamatsu, MIRAX, DICOM, generic
tiled TIFF, ...) and falls back to tiffslide for TIFF variants OpenSlide refuses
(single-level stripped TIFFs included); plain JPEG and PNG images are read as one-level
slides (:mod:`pathtwt.wsi.images`), OME-Zarr folders by :mod:`pathtwt.wsi.ome_zarr`.
``reader=`` forces one of them. What differs between the readers (where a region starts,
who pads it, native tiles, the pixel-size key, the order they are tried in) is one row
each in :mod:`pathtwt.wsi.readers`. Either way the result is a :class:`Slide` context
manager with one API: level geometry, microns per pixel (mpp) and RGB ``read_region`` /
``read_tile`` returning numpy arrays.

Non-RGB slides (fluorescence, multiplexed) are refused unless ``channel_map`` names the
three channels shown as red, green and blue (interleaved samples or one page per
channel). Formats no reader here handles faithfully (Olympus VSI, MIRAX without its
folder, a file whose largest image is a label) are refused by name
(:mod:`pathtwt.wsi.formats`); the readers' own log lines and warnings are collected per
slide (:mod:`pathtwt.wsi.reader_notes`), not printed.

Opening a slide also reads a few small regions, so a slide whose tiles cannot be
decoded fails here, with one line naming the file, rather than hours later inside
feature extraction.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from pathtwt.errors import SlideError
from pathtwt.wsi import readers
from pathtwt.wsi.formats import format_of, refuse_associated_image, refuse_unsupported, truncation_note
from pathtwt.wsi.reader_notes import capture_reader_messages
from pathtwt.wsi.readers import NotThisReader, SlideHandle, SlideReader

# (the title of the reader that said a file is none of its formats, what it said)
Refusal = tuple[str, str]

# Plausible microns per pixel for a slide scan. Values outside this range come from
# placeholder TIFF resolution tags (e.g. 72 dpi => 352.8 um/px) and are treated as absent.
MPP_MIN, MPP_MAX = 0.05, 100.0

# Size of the regions read at open time to prove the pixel data decodes.
_PROBE = 32


def _as_float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out > 0 else None


def _mpp_from_tiff_resolution(props: Mapping[str, Any]) -> float | None:
    xres = _as_float(props.get("tiff.XResolution"))
    unit = str(props.get("tiff.ResolutionUnit", "")).strip().lower()
    if xres is None:
        return None
    # microns per unit / pixels per unit
    if unit in ("centimeter", "cm", "3"):
        return 1e4 / xres
    if unit in ("inch", "2"):
        return 25400.0 / xres
    return None  # unit "none": the resolution is a ratio, not a physical size


def _mpp_from_dicom(props: Mapping[str, Any]) -> float | None:
    # DICOM PixelSpacing is (row spacing, column spacing) in millimetres.
    for key in sorted(props):
        if key.startswith("dicom.") and key.endswith("PixelSpacing[1]"):
            mm = _as_float(props[key])
            if mm is not None:
                return mm * 1000.0
    return None


# OME units of PhysicalSizeX, in microns
_OME_UNITS = {"µm": 1.0, "um": 1.0, "\u03bcm": 1.0, "nm": 1e-3, "mm": 1e3, "cm": 1e4, "m": 1e6}


def _mpp_from_ome(props: Mapping[str, Any]) -> float | None:
    # OME-TIFF keeps the pixel size in the OME-XML of the first ImageDescription
    import re

    text = str(props.get("tiff.ImageDescription", ""))
    if "<OME" not in text:
        return None
    pixels = re.search(r"<(?:\w+:)?Pixels\b[^>]*>", text)
    if pixels is None:
        return None
    size = re.search(r'\bPhysicalSizeX="([^"]+)"', pixels.group(0))
    unit = re.search(r'\bPhysicalSizeXUnit="([^"]+)"', pixels.group(0))
    value = _as_float(size.group(1)) if size else None
    scale = _OME_UNITS.get(unit.group(1) if unit else "µm")
    return None if value is None or scale is None else value * scale


def _reader_mpp(reader: SlideReader) -> tuple[str, Callable[[Mapping[str, Any]], float | None]]:
    key = str(reader.mpp_key)

    def mpp(props: Mapping[str, Any]) -> float | None:
        value = _as_float(props.get(key))
        return 25400.0 / value if value is not None and reader.mpp_in_dpi else value

    return key, mpp


def mpp_from_properties(props: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """Level-0 microns per pixel from slide metadata, in order of trust: the readers' own
    keys trusted above the file's tags (``openslide.mpp-x``), ``aperio.MPP``,
    ``tiff.XResolution`` with its unit, the other readers' own keys (``tiffslide.mpp-x``, a
    plain image's dpi from JFIF or PNG pHYs, ``ome-zarr.mpp-x``: :mod:`pathtwt.wsi.readers`),
    DICOM pixel spacing, OME-XML ``PhysicalSizeX``. Returns (mpp, key) or (None, None);
    implausible values (outside [MPP_MIN, MPP_MAX]) are skipped."""
    own = [r for r in readers.READERS if r.mpp_key]
    candidates = (
        *(_reader_mpp(r) for r in own if r.mpp_over_tags),
        ("aperio.MPP", lambda p: _as_float(p.get("aperio.MPP"))),
        ("tiff.XResolution", _mpp_from_tiff_resolution),
        # one reader's properties never hold another reader's key: their order among
        # themselves does not matter
        *(_reader_mpp(r) for r in own if not r.mpp_over_tags),
        ("dicom.PixelSpacing", _mpp_from_dicom),
        ("ome.PhysicalSizeX", _mpp_from_ome),
    )
    for key, getter in candidates:
        mpp = getter(props)
        if mpp is not None and MPP_MIN <= mpp <= MPP_MAX:
            return mpp, key
    return None, None


class Slide:
    """An open whole-slide image. Use as a context manager (or call :meth:`close`).

    Coordinates are level-0 pixels (x to the right, y down) unless said otherwise.
    """

    def __init__(
        self,
        path: Path,
        handle: SlideHandle,
        reader: SlideReader,
        mpp: float,
        mpp_source: str,
        channel_map: tuple[int, int, int] | None = None,
    ):
        self.path = path
        self.reader_spec = reader  # its row of pathtwt.wsi.readers.READERS
        self.reader = reader.name  # recorded in the coords file, so extraction reopens it the same way
        self.channel_map = channel_map  # source channels shown as R, G, B; None for RGB slides
        self.mpp = float(mpp)  # level-0 microns per pixel
        self.mpp_source = mpp_source  # metadata key, or "fallback"
        self._handle: SlideHandle | None = handle
        self.level_count: int = int(handle.level_count)
        self.level_dimensions: list[tuple[int, int]] = [(int(w), int(h)) for w, h in handle.level_dimensions]
        self.level_downsamples: list[float] = [float(d) for d in handle.level_downsamples]
        self.dimensions: tuple[int, int] = self.level_dimensions[0]
        self.properties: dict[str, Any] = dict(handle.properties)
        # out-of-slide pixels: white glass for brightfield, black for mapped fluorescence channels
        self.fill = 255 if channel_map is None else 0
        self.reader_notes: list[str] = []  # reader-library messages met on this slide
        # the native-tile view of each read level (pathtwt.wsi.native_tiles), opened on first use
        self._native: dict[int, Any] = {}
        self._tif: Any = None
        self.decoder: Any = None  # how native tiles are decoded (the decode seam; None: tifffile's codecs)

    # -- context manager -------------------------------------------------------------
    def __enter__(self) -> "Slide":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._tif is not None:
            self._tif.close()
            self._tif = None
        self._native = {}

    def __repr__(self) -> str:
        return f"Slide({str(self.path)!r}, reader={self.reader}, levels={self.level_count}, mpp={self.mpp:.4g})"

    # -- geometry ----------------------------------------------------------------------
    def level_mpp(self, level: int) -> float:
        return self.mpp * self.level_downsamples[level]

    def level_for_mpp(self, target_mpp: float) -> int:
        """The coarsest level whose mpp is <= target_mpp * 1.01, so pixels are only ever
        downsampled to reach the target. Level 0 when even level 0 is coarser than the
        target (tiling refuses that unless upsampling is allowed, see pathtwt.wsi.tiling)."""
        fine_enough = [lv for lv in range(self.level_count) if self.level_mpp(lv) <= target_mpp * 1.01]
        return max(fine_enough, key=lambda lv: self.level_downsamples[lv], default=0)

    # -- pixels ------------------------------------------------------------------------
    def read_region(self, x: int, y: int, level: int, w: int, h: int) -> np.ndarray:
        """RGB uint8 (h, w, 3) of the region whose top-left is level-0 (x, y), of size
        (w, h) in ``level`` pixels. Transparent and out-of-slide pixels are white."""
        if self._handle is None:
            raise SlideError(f"{self.path}: slide is closed")
        w, h = int(w), int(h)
        if w <= 0 or h <= 0:
            raise ValueError(f"region size must be positive, got {w}x{h}")
        try:
            with capture_reader_messages(self.reader_notes):
                return self._read_raw(int(x), int(y), int(level), w, h)
        except Exception as exc:  # the reader libraries raise many types on corrupt data
            raise self._decode_error(exc, x, y, level, w, h) from None

    def _read_raw(self, x: int, y: int, level: int, w: int, h: int) -> np.ndarray:
        if self.reader_spec.pads:
            return self._to_rgb(np.asarray(self._handle.read_region((x, y), level, (w, h))))
        return self._read_clipped(x, y, level, w, h)

    def _decode_error(self, exc: BaseException, x: int, y: int, level: int, w: int, h: int) -> SlideError:
        notes = "".join(f"; {n}" for n in self.reader_notes[:3])
        return SlideError(
            f"{self.path}: cannot decode region x={x} y={y} level={level} size={w}x{h} "
            f"({type(exc).__name__}: {_one_line(exc)}{notes}); the file is corrupt or truncated: "
            "re-export or exclude it"
        )

    def _read_clipped(self, x: int, y: int, level: int, w: int, h: int) -> np.ndarray:
        # A reader that does not pad as OpenSlide does (tiffslide pads with black, the
        # image and OME-Zarr handles not at all): read the in-bounds part, which starts at
        # the truncated level pixel, and place it on the slide's fill so every reader agrees.
        ds = self.level_downsamples[level]
        lw, lh = self.level_dimensions[level]
        lx, ly = int(math.floor(x / ds)), int(math.floor(y / ds))
        x0, y0 = max(lx, 0), max(ly, 0)
        x1, y1 = min(lx + w, lw), min(ly + h, lh)
        if x0 == lx and y0 == ly and x1 - x0 == w and y1 - y0 == h:
            return self._to_rgb(np.asarray(self._handle.read_region((x, y), level, (w, h), as_array=True)))
        out = np.full((h, w, 3), self.fill, np.uint8)
        if x1 > x0 and y1 > y0:
            part = np.asarray(
                self._handle.read_region(
                    (int(round(x0 * ds)), int(round(y0 * ds))), level, (x1 - x0, y1 - y0), as_array=True
                )
            )
            out[y0 - ly : y1 - ly, x0 - lx : x1 - lx] = self._to_rgb(part)
        return out

    def _to_rgb(self, arr: np.ndarray) -> np.ndarray:
        if self.channel_map is None:
            return _to_rgb(arr)
        return map_channels(arr, self.channel_map)

    def read_tile(self, x: int, y: int, patch_size_level0: int, read_level: int, patch_size: int) -> np.ndarray:
        """The level-0 square [x, x + patch_size_level0) read at ``read_level`` (one
        read_region) and resized to (patch_size, patch_size, 3) uint8."""
        import cv2

        side = max(1, int(round(patch_size_level0 / self.level_downsamples[read_level])))
        region = self.read_region(x, y, read_level, side, side)
        if side == patch_size:
            return region
        interp = cv2.INTER_AREA if side > patch_size else cv2.INTER_LINEAR
        return cv2.resize(region, (patch_size, patch_size), interpolation=interp)

    def read_tiles(self, xy: Any, patch_size_level0: int, read_level: int, patch_size: int,
                   out: np.ndarray | None = None) -> Any:
        """:meth:`read_tile` for each level-0 (x, y) of ``xy``, with the same pixels, read as
        few regions as the layout allows (:mod:`pathtwt.wsi.supertiles`): each native tile
        under the batch is decoded once. The reader messages are collected once. ``out``
        (N, patch_size, patch_size, 3) uint8 receives the tiles (and is returned) instead of
        a list."""
        from pathtwt.wsi import supertiles

        xy = np.asarray(xy, dtype=np.int64).reshape(-1, 2)
        if self._handle is None:
            raise SlideError(f"{self.path}: slide is closed")
        if not len(xy):
            return [] if out is None else out
        ds = self.level_downsamples[read_level]
        side = max(1, int(round(patch_size_level0 / ds)))
        origins, exact = supertiles.level_origins(xy, ds, self.reader)
        native = self.native_level(read_level) if exact else None
        try:
            with capture_reader_messages(self.reader_notes):
                if native is not None:
                    regions = native.regions(supertiles.boxes(origins, side))
                elif exact and self.reader_spec.bands:
                    regions = []
                    for start, end in supertiles.runs(origins, side):
                        x, y = (int(v) for v in xy[start])
                        band = self._read_raw(x, y, int(read_level), side * (end - start), side)
                        regions += supertiles.cut_run(band, end - start, side)
                else:
                    regions = [self._read_raw(int(x), int(y), int(read_level), side, side) for x, y in xy]
        except Exception as exc:  # the reader libraries raise many types on corrupt data
            x0, y0, w, h = supertiles.bounding_box(xy, int(patch_size_level0))
            raise self._decode_error(exc, x0, y0, read_level, int(round(w / ds)), int(round(h / ds))) from None
        return fit_regions(regions, patch_size, out)

    def native_level(self, level: int) -> Any:
        """The :class:`~pathtwt.wsi.native_tiles.NativeLevel` of ``level`` (its native tiles
        decoded once), or None where the reader's own ``read_region`` must read it."""
        if level not in self._native:
            self._native[level] = self._open_native(level)
        return self._native[level]

    def _open_native(self, level: int) -> Any:
        from pathtwt.wsi.native_tiles import NativeLevel, native_page

        if self.channel_map is not None or not self.reader_spec.native_tiles(self.properties):
            return None
        import tifffile

        try:
            if self._tif is None:
                self._tif = tifffile.TiffFile(self.path)
            page = native_page(self._tif, level, self.level_dimensions[level])
        except Exception:  # noqa: BLE001 - not a TIFF tifffile reads: the reader's own path
            return None
        if page is None:
            return None
        return NativeLevel(page, fill=self.fill) if self.decoder is None else \
            NativeLevel(page, decoder=self.decoder, fill=self.fill)


def fit_regions(regions: list[np.ndarray], patch_size: int, out: np.ndarray | None = None) -> Any:
    """Read regions resized to (patch_size, patch_size) as :meth:`Slide.read_tile` does:
    larger ones shrunk together with cv2.INTER_AREA's pixels
    (:func:`pathtwt.wsi.area_shrink.shrink`), smaller ones enlarged (INTER_LINEAR). Into
    ``out`` (N, patch_size, patch_size, 3) when given, else a list."""
    import cv2

    from pathtwt.wsi.area_shrink import shrink

    size = (patch_size, patch_size)
    if out is not None and regions and all(r.shape[0] > patch_size and r.shape[1] > patch_size and
                                          r.shape == regions[0].shape for r in regions):
        shrink(list(regions), patch_size, out=out)  # the usual batch: straight into ``out``
        return out
    tiles: list[np.ndarray] = [np.ascontiguousarray(r) for r in regions]
    larger = [k for k, r in enumerate(regions) if r.shape[0] > patch_size and r.shape[1] > patch_size]
    for shape in {regions[k].shape for k in larger}:  # one shape in a batch, as a rule
        same = [k for k in larger if regions[k].shape == shape]
        for k, tile in zip(same, shrink([regions[k] for k in same], patch_size)):
            tiles[k] = tile
    for k, region in enumerate(regions):
        if region.shape[:2] != size and k not in larger:
            interp = cv2.INTER_AREA if max(region.shape[:2]) > patch_size else cv2.INTER_LINEAR
            tiles[k] = cv2.resize(tiles[k], size, interpolation=interp)
    if out is None:
        return tiles
    for tile, dst in zip(tiles, out):
        dst[...] = tile
    return out


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _to_rgb(arr: np.ndarray) -> np.ndarray:
    """RGB uint8 from RGB/RGBA arrays; alpha is composited on white."""
    arr = np.asarray(arr)
    if arr.ndim == 3 and arr.shape[2] == 4:
        alpha = arr[..., 3]
        if alpha.min() == 255:
            return np.ascontiguousarray(arr[..., :3])
        # OpenSlide returns un-premultiplied RGBA: out = rgb * a + 255 * (1 - a)
        a = alpha[..., None].astype(np.uint16)
        rgb = (arr[..., :3].astype(np.uint16) * a + 255 * (255 - a) + 127) // 255
        return rgb.astype(np.uint8)
    if arr.ndim == 3 and arr.shape[2] == 3:
        return arr.astype(np.uint8, copy=False)
    raise ValueError(f"pixel data has shape {arr.shape}, not RGB")


def map_channels(arr: np.ndarray, channel_map: tuple[int, int, int]) -> np.ndarray:
    """RGB uint8 from the three channels ``channel_map`` of a (h, w[, c]) array; 16-bit
    samples are scaled by 1/257 so that full scale stays full scale."""
    arr = np.asarray(arr)
    if arr.ndim == 2:
        arr = arr[..., None]
    rgb = arr[..., list(channel_map)]
    if rgb.dtype == np.uint16:
        rgb = (rgb.astype(np.uint32) * 255 + 32767) // 65535
    return np.ascontiguousarray(rgb.astype(np.uint8))


def _readers_for(path: Path, reader: str | None) -> tuple[SlideReader, ...]:
    """The readers to try on ``path``, in turn: the one named; else the one the file's
    bytes call for (JPEG and PNG, which neither slide library reads); else its format's
    reader and the readers tried after it; else every reader ``open_slide`` tries."""
    if reader is not None:
        return (readers.reader_named(reader),)
    claimed = readers.claimed_by(path)
    if claimed is not None:
        return (claimed,)
    tried = readers.tried_in_order()
    named = format_of(path)
    row = readers.reader_named(named.reader) if named is not None else None
    if row is None or row.claims is not None:  # no format, or the bytes belie the suffix
        return tried
    return tried[tried.index(row):] if row in tried else (row,)


def _open_handle(path: Path, reader: str | None, notes: list[str]) -> tuple[SlideHandle, SlideReader, Refusal | None]:
    """(handle, its reader, what a reader that declined the file said, or None)."""
    *before, last = _readers_for(path, reader)
    refused: Refusal | None = None
    # OpenSlide alone tells "none of my formats" (NotThisReader) from failing on a file it
    # reads; only then is the next reader asked, and the last one's failure is reported
    # beside what OpenSlide said
    for row in before:
        try:
            return row.opener(path), row, None
        except NotThisReader as exc:
            refused = refused or (row.title, str(exc))
    try:
        return last.opener(path), last, refused
    except SlideError:
        raise
    except Exception as exc:  # noqa: BLE001 - the readers raise many types; each said in one line
        raise SlideError(_open_failure(path, last, exc, refused, named=reader is not None, notes=notes)) from None


def _open_failure(path: Path, row: SlideReader, exc: BaseException, refused: Refusal | None, *, named: bool,
                  notes: list[str]) -> str:
    if isinstance(exc, NotThisReader) and named:
        others = ", ".join(r.name for r in readers.tried_in_order() if r is not row)
        return f"{path}: {row.title} cannot open it ({exc}); use reader {others} or auto"
    if row.tried:  # no reader opens the file: say whether it is cut short, damaged or no slide
        return _refusal(path, refused, row, exc, notes)
    return f"{path}: {row.name} cannot open it ({type(exc).__name__}: {_one_line(exc)})"


def _refusal(path: Path, refused: Refusal | None, reader: SlideReader, exc: BaseException, notes: list[str]) -> str:
    """One line for a file no reader can open: what the reader that declined it said, the
    last reader's error, the readers' log lines, and whether the file is truncated (or not
    a slide at all)."""
    reasons = [f"{refused[0]}: {refused[1]}"] if refused else []
    reasons.append(f"{reader.title}: {type(exc).__name__}: {_one_line(exc)}")
    reasons += notes[:3]
    state = truncation_note(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        head = b""
    if head[:2] not in (b"II", b"MM") and state == "truncated or damaged":
        # not a TIFF: an unknown or non-slide file rather than a damaged one
        return f"{path}: not a readable whole-slide image ({'; '.join(reasons)}); convert it to a pyramidal TIFF or exclude it"
    return (
        f"{path}: the file is {state} ({'; '.join(reasons)}); copy it again from the source "
        "(compare its size or checksum), or exclude it"
    )


def _check_pixels(slide: Slide, refused: Refusal | None) -> None:
    """Make sure the image is colour (or has a channel map), then decode a small region
    at the centre of level 0 and of the coarsest level."""
    _check_colour(slide)
    why = f" ({refused[0]} refused it: {refused[1]})" if refused else ""
    for level in sorted({0, slide.level_count - 1}):
        lw, lh = slide.level_dimensions[level]
        if lw < 2 or lh < 2:
            raise SlideError(
                f"{slide.path}: {slide.reader} sees only {lw}x{lh} pixels at level {level}{why}; "
                "the file is not a supported slide: convert it to a pyramidal TIFF or exclude it"
            )
        w, h = min(_PROBE, lw), min(_PROBE, lh)
        ds = slide.level_downsamples[level]
        try:
            slide.read_region(int(((lw - w) // 2) * ds), int(((lh - h) // 2) * ds), level, w, h)
        except SlideError as exc:
            raise SlideError(f"{exc}{why}") from None


def _check_colour(slide: Slide) -> None:
    """Refuse grey, multi-channel (fluorescence) or 16-bit slides unless a channel map
    says which three channels to show as RGB: the pipeline is for brightfield RGB. Both
    readers would silently turn a grey TIFF into RGB, so the TIFF header of level 0 is
    inspected; non-TIFF formats (DICOM, MIRAX, ...) are colour by the readers' own checks."""
    import tifffile

    try:
        with tifffile.TiffFile(slide.path) as tif:
            page = tif.pages[0]
            samples, bits, photometric = page.samplesperpixel, page.bitspersample, page.photometric
            samples = _channels_in_pages(tif, samples)
    except (tifffile.TiffFileError, OSError, ValueError, IndexError):
        samples, bits, photometric = 3, 8, 2
    if slide.channel_map is not None:
        if slide.reader_spec.renders_rgb:
            if samples < 3 or bits != 8 or int(photometric) in (0, 1):
                raise SlideError(
                    f"{slide.path}: {slide.reader_spec.title} turns its {samples} channel(s) into RGB itself; "
                    f"a channel map needs reader {readers.raw_channel_reader().name} (or auto)"
                )
            samples = 3  # such a reader always delivers RGB(A)
        if any(not 0 <= c < samples for c in slide.channel_map) or bits not in (8, 16):
            raise SlideError(
                f"{slide.path}: channel map {list(slide.channel_map)} does not fit its {samples} channel(s) of "
                f"{bits} bits; give three channel indices in 0..{samples - 1}"
            )
        return
    # Photometric: 1 = min-is-black (grey), 2 = RGB, 6 = YCbCr (JPEG), 0 = min-is-white
    if samples < 3 or bits != 8 or int(photometric) in (0, 1):
        raise SlideError(
            f"{slide.path}: pixels are {samples} sample(s) of {bits} bits ({getattr(photometric, 'name', photometric)}), "
            "not 8-bit RGB; for fluorescence or multiplexed slides set the cohort's `channels` key "
            "(three channel indices shown as R, G, B), otherwise convert or exclude it"
        )


def _channels_in_pages(tif: Any, samples: int) -> int:
    """The channel count of a series stored one page per channel (OME, QPTIFF: axes
    CYX, which tiffslide stacks into (h, w, C)); ``samples`` otherwise."""
    try:
        axes, shape = tif.series[0].axes, tif.series[0].shape
    except Exception:  # noqa: BLE001 - tifffile's series parsing fails in many ways on odd files
        return samples
    if "C" in axes and "S" not in axes:
        return int(shape[axes.index("C")])
    return samples


def _check_channel_map(path: Path, channel_map: Any) -> tuple[int, int, int] | None:
    if channel_map is None or (isinstance(channel_map, str) and not channel_map.strip()):
        return None
    if isinstance(channel_map, str):
        channel_map = channel_map.replace(",", " ").split()
    try:
        out = tuple(int(c) for c in channel_map)
    except (TypeError, ValueError):
        out = ()
    if len(out) != 3 or min(out) < 0:
        raise SlideError(f"{path}: channel map {channel_map!r} must be three channel indices >= 0 (R, G, B)")
    return out  # type: ignore[return-value]


def open_slide(
    path: str | os.PathLike,
    mpp_fallback: float | None = None,
    *,
    reader: str | None = None,
    channel_map: Any = None,
) -> Slide:
    """Open a whole-slide image. Raises :class:`SlideError` (one line) when the file is
    missing, unreadable, corrupt, not RGB (and no ``channel_map``), or has no usable mpp
    and no ``mpp_fallback``.

    ``reader``: None (JPEG/PNG: the image reader; an OME-Zarr folder: its reader; else
    OpenSlide, then tiffslide) or a name of :mod:`pathtwt.wsi.readers` to force one;
    the level list (and so a coords file's ``read_level``) belongs to the reader.
    ``channel_map``: three channel indices (or "i,j,k") shown as R, G, B, for
    fluorescence or multiplexed slides stored with interleaved channels.
    """
    path = Path(path)
    if reader in ("", "auto"):
        reader = None
    if reader is not None and reader not in readers.names():
        raise SlideError(f"{path}: reader {reader!r} is unknown; use auto, {', '.join(readers.names())}")
    if not path.exists():
        raise SlideError(f"{path}: slide file not found")
    refuse_unsupported(path)
    channels = _check_channel_map(path, channel_map)
    if channels is not None and reader is None:
        # the raw channels: OpenSlide would hand over its own RGB rendering
        reader = readers.raw_channel_reader().name
    notes: list[str] = []
    with capture_reader_messages(notes):
        slide = _open_checked(path, reader, channels, notes)
    slide.reader_notes = notes + [n for n in slide.reader_notes if n not in notes]
    return _resolve_mpp(slide, mpp_fallback)


def _open_checked(path: Path, reader: str | None, channels: tuple[int, int, int] | None, notes: list[str]) -> Slide:
    handle, spec, refused = _open_handle(path, reader, notes)
    # mpp is resolved after the pixel check: a corrupt file should say so, not ask for an mpp
    try:
        slide = Slide(path, handle, spec, mpp=math.nan, mpp_source="", channel_map=channels)
    except Exception as exc:  # tiffslide parses lazily: unsupported (or truncated) layouts surface here
        handle.close()
        if refused:
            raise SlideError(_refusal(path, refused, spec, exc, notes)) from None
        raise SlideError(
            f"{path}: {spec.name} cannot read its layout ({type(exc).__name__}: {_one_line(exc)}); "
            "convert it to a pyramidal TIFF with interleaved channels or exclude it"
        ) from None
    try:
        refuse_associated_image(path, str(slide.properties.get("tiff.ImageDescription", "")), slide.dimensions)
        _check_pixels(slide, refused)
    except BaseException:
        slide.close()
        raise
    return slide


def _resolve_mpp(slide: Slide, mpp_fallback: float | None) -> Slide:
    path = slide.path
    try:
        mpp, source = mpp_from_properties(slide.properties)
        if mpp is None:
            if mpp_fallback is None:
                raise SlideError(
                    f"{path}: {slide.reader_spec.no_mpp}; set the cohort's `mpp_fallback` config key "
                    "(or pass --slide-mpp) to the scan resolution in um/px"
                )
            fallback = _as_float(mpp_fallback)
            if fallback is None or not MPP_MIN <= fallback <= MPP_MAX:
                raise SlideError(f"{path}: mpp_fallback={mpp_fallback!r} is not a plausible microns-per-pixel value")
            mpp, source = fallback, "fallback"
    except BaseException:
        slide.close()
        raise
    slide.mpp, slide.mpp_source = float(mpp), source
    return slide


def open_options_from_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """``open_slide`` keyword arguments that reopen a slide exactly as a coords file was
    made: same reader (``read_level`` indexes that reader's levels), same channel map,
    and the level-0 mpp as fallback."""
    channel_map = attrs.get("channel_map")
    return {
        "mpp_fallback": _as_float(attrs.get("level0_mpp")),
        "reader": str(attrs.get("reader") or "") or None,
        "channel_map": list(channel_map) if channel_map not in (None, "", []) else None,
    }
