"""Complete JPEG streams from the native tiles of a JPEG-tiled TIFF page (torch-free).

A JPEG-tiled TIFF page stores each native tile as an abbreviated JPEG stream: the
quantisation and Huffman tables usually live once in the page's JPEGTables tag (347).
:func:`splice` rebuilds a complete baseline JPEG from the two (the tables' markers between
their SOI and EOI, then the tile's stream after its SOI), so any JPEG decoder (nvJPEG,
nvImageCodec, libjpeg-turbo) reads it.

Aperio writes its JPEG tiles in the RGB colour space (TIFF Photometric RGB, component
ids 0, 1, 2, no Adobe marker), which a JPEG decoder takes for YCbCr by default: the
colours come out wrong by up to 248 grey levels. tifffile tells libjpeg the colour space
explicitly; a general decoder cannot be told, so :func:`splice` adds an Adobe APP14
marker with transform 0 ("no colour transform"), which libjpeg reads as RGB.

:class:`StreamHeader` and :func:`pack_streams` are what a reading process does for the
GPU decoder: each stream written straight into a shared buffer with one ``preadv`` (the
header written in front of it), so its bytes are copied once, from the page cache into
the buffer the decoding process reads.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from pathtwt.wsi.native_tiles import PHOTOMETRIC_RGB, interleaved_rgb_tiles, tile_bytes

JPEG = 7  # TIFF Compression: "new-style" JPEG (TIFF technote 2); old-style (6) is left to tifffile

# Adobe APP14, version 100, no flags, transform 0: three components are RGB, not YCbCr
ADOBE_RGB = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"
_SOI, _EOI = b"\xff\xd8", b"\xff\xd9"


def splice(tables: bytes | None, stream: bytes, *, rgb: bool = False) -> bytes:
    """A complete JPEG from a tile's abbreviated ``stream`` and the page's JPEGTables
    ``tables`` (None or empty: the stream is complete already). ``rgb``: add an Adobe
    marker saying the components are RGB (unless the stream has one already)."""
    stream = bytes(stream)
    if not stream.startswith(_SOI):
        raise ValueError("the tile's stream does not start with a JPEG SOI marker")
    return StreamHeader.of(tables, stream, rgb=rgb).bytes + stream[2:]


class StreamHeader:
    """What goes in front of a native tile's stream (without its own SOI) to make it a
    complete JPEG: the SOI, the page's tables and, for RGB pages, the Adobe marker."""

    def __init__(self, data: bytes) -> None:
        self.bytes = data

    @classmethod
    def of(cls, tables: bytes | None, first_stream: bytes | None = None, *, rgb: bool = False) -> "StreamHeader":
        """The header of a page with JPEGTables ``tables``; ``first_stream`` (any tile of
        the page) tells whether its streams carry their own Adobe marker already."""
        body = b""
        if tables:
            tables = bytes(tables)
            if not tables.startswith(_SOI):
                raise ValueError("the page's JPEGTables do not start with a JPEG SOI marker")
            body = tables[2: len(tables) - 2 if tables.endswith(_EOI) else len(tables)]
        if rgb and adobe_transform(body + (bytes(first_stream)[2:] if first_stream else b"")) is None:
            body = ADOBE_RGB + body
        return cls(_SOI + body)

    @property
    def rgb(self) -> bool:
        """Whether a stream behind this header decodes as RGB (Adobe transform 0), unless
        the stream carries an Adobe marker of its own."""
        return adobe_transform(self.bytes, 2) == 0

    @classmethod
    def of_page(cls, page: Any) -> "StreamHeader":
        rgb = int(page.photometric) == PHOTOMETRIC_RGB
        first = None
        if rgb:
            first = next((data for i in range(min(4, len(page.dataoffsets))) if (data := tile_bytes(page, i))), None)
        return cls.of(page.jpegtables, first, rgb=rgb)


def adobe_transform(data: Any, start: int = 0) -> int | None:
    """The colour transform of the last Adobe APP14 marker among the JPEG marker segments of
    ``data`` (bytes or a memoryview) from ``start`` (just after an SOI) to the first SOS:
    0 for RGB, 1 for YCbCr; None where there is none (a decoder then takes three components
    for YCbCr). As libjpeg reads them, the last marker wins. The segments are walked by
    their lengths, so a table's bytes are never taken for a marker."""
    transform = None
    at, end = int(start), len(data)
    while at + 4 <= end and data[at] == 0xFF:
        marker = data[at + 1]
        if marker == 0xFF:  # a fill byte before a marker
            at += 1
            continue
        if marker in (0xDA, 0xD9):  # SOS: the entropy-coded data begins; EOI
            break
        if marker == 0xD8 or 0xD0 <= marker <= 0xD7 or marker == 0x01:  # markers without a length
            at += 2
            continue
        length = (data[at + 2] << 8) | data[at + 3]
        if marker == 0xEE and length >= 14 and at + 16 <= end and bytes(data[at + 4: at + 9]) == b"Adobe":
            transform = int(data[at + 15])
        at += 2 + length
    return transform


def rgb_streams(arena: Any, offsets: np.ndarray, lengths: np.ndarray, header: StreamHeader) -> int:
    """How many of the complete streams :func:`pack_streams` wrote into ``arena`` with
    ``header`` decode as RGB (Adobe transform 0): the header's colour space, unless a
    stream's own segments carry an Adobe marker (the last one read wins)."""
    h, default = len(header.bytes), header.rgb
    count = 0
    for offset, length in zip(offsets.tolist(), lengths.tolist()):
        if not length:
            continue
        # most streams hold no APP14 before their SOS: two searches say so, no walk
        head = bytes(arena[offset + h: offset + min(length, h + 2048)])
        sos = head.find(b"\xff\xda")
        own = None if sos >= 0 and b"\xff\xee" not in head[:sos] else adobe_transform(arena[offset: offset + length], h)
        count += (own == 0) if own is not None else default
    return count


def is_jpeg_tiled(page: Any) -> bool:
    """Whether tifffile ``page`` is a tiled, 8-bit, three-sample interleaved page of
    new-style JPEG tiles in RGB or YCbCr: the pages whose tiles a GPU decoder takes."""
    try:
        return interleaved_rgb_tiles(page) and int(page.compression) == JPEG
    except (AttributeError, TypeError, ValueError):
        return False


def tile_streams(page: Any, indices: Sequence[int]) -> list[bytes | None]:
    """The complete JPEG of each native tile ``indices`` of ``page`` (None for an empty
    tile of a sparse TIFF), read from the page's file handle."""
    header = StreamHeader.of_page(page).bytes
    return [None if (data := tile_bytes(page, index)) is None else header + data[2:] for index in indices]


def pack_streams(page: Any, header: StreamHeader, indices: Sequence[int], fd: int, arena: memoryview,
                 start: int = 0) -> tuple[np.ndarray, np.ndarray] | None:
    """Write the complete JPEG of each native tile ``indices`` of ``page`` into ``arena``
    from byte ``start`` on, reading the file ``fd`` (the slide opened by this process).
    Returns (offsets, lengths) int64 in the arena (length 0: an empty tile of a sparse
    TIFF), or None when they do not fit (the caller decodes that batch itself)."""
    head = header.bytes
    h = len(head)
    offsets = np.zeros(len(indices), np.int64)
    lengths = np.zeros(len(indices), np.int64)
    at = int(start)
    file_offsets, counts = page.dataoffsets, page.databytecounts
    for k, index in enumerate(indices):
        offset, count = int(file_offsets[index]), int(counts[index])
        if count == 0 or offset == 0:
            continue
        size = h + count - 2
        if at + size > len(arena):
            return None
        # the stream lands after the header less its own two-byte SOI, which the header's
        # last two bytes then overwrite: one read, no second copy of the tile's bytes
        got = os.preadv(fd, [arena[at + h - 2: at + size]], offset)
        if got != count:
            raise OSError(f"native tile {index} of page {page.index}: read {got} of {count} bytes (truncated file)")
        if bytes(arena[at + h - 2: at + h]) != _SOI:
            raise ValueError(f"native tile {index} of page {page.index} does not start with a JPEG SOI marker")
        arena[at: at + h] = head
        offsets[k], lengths[k] = at, size
        at += size
    return offsets, lengths
