"""A tiled TIFF pyramid level read through its own compressed tiles, each decoded once.

OpenSlide and tiffslide decode every native tile a region overlaps, for every region: a
224 px tile over a 256 px grid overlaps four native tiles, so a slide read tile by tile
decodes each native tile about four times. :class:`NativeLevel` keeps the decoded native
tiles of the last regions (a small per-slide cache, bounded in bytes) and cuts any number
of regions out of them with numpy.

The decode seam: a level decodes a list of native tiles with ONE call,
``decoder(page, indices) -> list[np.ndarray]`` (each (tile length, tile width, 3) uint8),
:func:`decode_native_tiles` by default (tifffile's own codecs: imagecodecs, the same
libjpeg-turbo OpenSlide uses, so the pixels are OpenSlide's). Another decoder is passed as
``NativeLevel(page, decoder=...)``, or set on a slide as ``slide.decoder``; it must raise on
a stream it cannot decode or fall back itself. (Decoding on a GPU does not go through this
seam: the reading processes ship the compressed streams, :mod:`pathtwt.wsi.jpeg_streams`,
and the process that owns the GPU decodes them.)

:func:`native_page` says whether a slide level can be read this way at all: a tiled,
8-bit, three-sample, interleaved (chunky) page whose size is the reader's level size.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Sequence

import numpy as np

Decoder = Callable[[Any, Sequence[int]], list]

# compressions whose tifffile decode gives the pixels OpenSlide gives (checked by
# tests/test_native_reader.py): none, LZW, JPEG, Adobe deflate, deflate
NATIVE_COMPRESSIONS = frozenset({1, 5, 7, 8, 32946})
PHOTOMETRIC_RGB, PHOTOMETRIC_YCBCR = 2, 6  # TIFF Photometric values of three-sample colour pages

# decoded native tiles kept per slide level: about two rows of 256 px tiles across a
# 100,000 px wide slide, so a slide read in row order decodes each native tile once
CACHE_BYTES = 160 * 2**20


def decode_native_tiles(page: Any, indices: Sequence[int]) -> list[np.ndarray]:
    """The decoded native tiles ``indices`` of tifffile ``page``: (tile length, tile
    width, 3) uint8 each (edge tiles at full tile size, as stored). An empty tile (byte
    count 0, a sparse TIFF) comes back white, as OpenSlide shows a missing tile."""
    shape = (page.tilelength, page.tilewidth, 3)
    out = []
    for index in indices:
        data = tile_bytes(page, index)
        if data is None:
            out.append(np.full(shape, 255, np.uint8))
            continue
        segment = page.decode(data, int(index), jpegtables=page.jpegtables)[0]
        if segment is None:
            raise ValueError(f"native tile {index} of page {page.index} is empty")
        out.append(np.asarray(segment).reshape(shape))
    return out


def tile_bytes(page: Any, index: int) -> bytes | None:
    """Native tile ``index`` of ``page`` as stored (its compressed bytes), read from the
    page's file handle; None for an empty tile (byte count 0, a sparse TIFF)."""
    offset, count = int(page.dataoffsets[index]), int(page.databytecounts[index])
    if count == 0 or offset == 0:
        return None
    fh = page.parent.filehandle
    with fh.lock:
        fh.seek(offset)
        return fh.read(count)


def interleaved_rgb_tiles(page: Any) -> bool:
    """Whether tifffile ``page`` is tiled, 8-bit, three-sample, interleaved (chunky) and
    RGB or YCbCr: the pages whose native tiles are read here."""
    try:
        return bool(
            getattr(page, "is_tiled", False)
            and getattr(page, "tiledepth", 1) == 1
            and int(page.samplesperpixel) == 3
            and int(page.bitspersample) == 8
            and int(page.planarconfig) == 1
            and int(page.photometric) in (PHOTOMETRIC_RGB, PHOTOMETRIC_YCBCR)
        )
    except (AttributeError, TypeError, ValueError):
        return False


def native_page(tif: Any, level: int, size: tuple[int, int]) -> Any | None:
    """The tifffile page of pyramid ``level`` of the first series when it can be read tile
    by tile here and is ``size`` (width, height) pixels; None otherwise."""
    try:
        levels = tif.series[0].levels
        if level >= len(levels):
            return None
        page = levels[level].keyframe  # the level's own page (a SubIFD in an OME pyramid)
    except Exception:  # noqa: BLE001 - odd files: the reader library's own path reads them
        return None
    ok = (
        interleaved_rgb_tiles(page)
        and int(page.compression) in NATIVE_COMPRESSIONS
        and (int(page.imagewidth), int(page.imagelength)) == tuple(size)
        and len(page.dataoffsets) == _tiles_across(page) * _tiles_down(page)
    )
    return page if ok else None


def _tiles_across(page: Any) -> int:
    return -(-int(page.imagewidth) // int(page.tilewidth))


def _tiles_down(page: Any) -> int:
    return -(-int(page.imagelength) // int(page.tilelength))


class NativeLevel:
    """One pyramid level: regions (level pixels) assembled from native tiles decoded
    once and cached (least recently used first out, ``cache_bytes`` at most)."""

    def __init__(self, page: Any, *, decoder: Decoder = decode_native_tiles, fill: int = 255,
                 cache_bytes: int = CACHE_BYTES) -> None:
        self.page = page
        self.decoder = decoder
        self.fill = fill
        self.width, self.height = int(page.imagewidth), int(page.imagelength)
        self.tw, self.tl = int(page.tilewidth), int(page.tilelength)
        self.across = _tiles_across(page)
        self.capacity = max(4, int(cache_bytes) // (self.tw * self.tl * 3))
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self.decoded = 0  # native tiles decoded so far (a tile decoded twice counts twice)

    def tiles_under(self, x: int, y: int, w: int, h: int) -> list[int]:
        """Native tile indices the region (level pixels) overlaps, inside the level."""
        x0, y0 = max(x, 0) // self.tw, max(y, 0) // self.tl
        x1 = (min(x + w, self.width) - 1) // self.tw
        y1 = (min(y + h, self.height) - 1) // self.tl
        if x + w <= 0 or y + h <= 0 or x >= self.width or y >= self.height:
            return []
        return [r * self.across + c for r in range(y0, y1 + 1) for c in range(x0, x1 + 1)]

    def fetch(self, indices: Sequence[int]) -> None:
        """Make sure the native tiles ``indices`` are decoded (one decoder call for those
        not cached)."""
        missing = sorted({int(i) for i in indices if int(i) not in self._cache})
        for index in indices:
            if int(index) in self._cache:
                self._cache.move_to_end(int(index))
        if not missing:
            return
        decoded = self.decoder(self.page, missing)
        self.decoded += len(missing)
        for index, tile in zip(missing, decoded):
            self._cache[index] = tile
        while len(self._cache) > max(self.capacity, len(indices)):
            self._cache.popitem(last=False)

    def regions(self, boxes: Sequence[tuple[int, int, int, int]]) -> list[np.ndarray]:
        """uint8 (h, w, 3) for each (x, y, w, h) box in level pixels; pixels outside the
        level are ``fill``. The native tiles of all boxes are decoded in one call."""
        needed: list[int] = []
        for box in boxes:
            needed.extend(self.tiles_under(*box))
        self.fetch(list(dict.fromkeys(needed)))
        return [self._assemble(*box) for box in boxes]

    def _blank(self, w: int, h: int, inside: bool) -> Any:
        """The (h, w, 3) uint8 canvas a region is assembled on: filled where it reaches past
        the level (the device-side reader makes it on its device)."""
        return np.empty((h, w, 3), np.uint8) if inside else np.full((h, w, 3), self.fill, np.uint8)

    def _assemble(self, x: int, y: int, w: int, h: int) -> Any:
        out = self._blank(w, h, x >= 0 and y >= 0 and x + w <= self.width and y + h <= self.height)
        for index in self.tiles_under(x, y, w, h):
            tile = self._cache[index]
            tx, ty = (index % self.across) * self.tw, (index // self.across) * self.tl
            # the overlap of the box, the tile and the level, in level pixels (edge tiles are
            # stored at full size: the part past the level is cut off, as tifffile does)
            ax0, ay0 = max(x, tx), max(y, ty)
            ax1, ay1 = min(x + w, tx + self.tw, self.width), min(y + h, ty + self.tl, self.height)
            out[ay0 - y:ay1 - y, ax0 - x:ax1 - x] = tile[ay0 - ty:ay1 - ty, ax0 - tx:ax1 - tx]
        return out
