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
_SOI, _EOI, _SOS, _APP14 = b"\xff\xd8", b"\xff\xd9", b"\xff\xda", b"\xff\xee"


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
        if rgb:
            # markers cannot occur in entropy-coded data (an FF there is followed by 00), and
            # the header ends at the first SOS: search only before it
            head = body + (bytes(first_stream)[2:] if first_stream else b"")
            sos = head.find(_SOS)
            if _APP14 not in head[: sos if sos >= 0 else len(head)]:
                body = ADOBE_RGB + body
        return cls(_SOI + body)

    @classmethod
    def of_page(cls, page: Any) -> "StreamHeader":
        rgb = int(page.photometric) == PHOTOMETRIC_RGB
        first = None
        if rgb:
            first = next((data for i in range(min(4, len(page.dataoffsets))) if (data := tile_bytes(page, i))), None)
        return cls.of(page.jpegtables, first, rgb=rgb)


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
