"""Batch decode of JPEG-tiled TIFF pages with torchvision (nvJPEG on a GPU), and the
cut and resize of output tiles on the same device.

A JPEG-tiled TIFF page stores each native tile as an abbreviated JPEG stream: the
quantisation and Huffman tables usually live once in the page's JPEGTables tag (347).
:func:`splice` rebuilds a complete baseline JPEG from the two (the tables' markers between
their SOI and EOI, then the tile's stream after its SOI), so a general JPEG decoder can
read it. ``torchvision.io.decode_jpeg`` decodes a list of such streams in one call:
nvJPEG with ``device="cuda"``, libjpeg-turbo with ``device="cpu"`` (which the tests use,
through the same splicing).

Aperio writes its JPEG tiles in the RGB colour space (TIFF Photometric RGB, component
ids 0, 1, 2, no Adobe marker), which a JPEG decoder takes for YCbCr by default: the
colours come out wrong by up to 248 grey levels. tifffile tells libjpeg the colour space
explicitly; torchvision cannot be told, so :func:`splice` adds an Adobe APP14 marker
with transform 0 ("no colour transform"), which libjpeg reads as RGB (the pixels then
equal tifffile's exactly). Whether nvJPEG honours that marker is not known here, so
:class:`TorchJpegDecoder` compares the first batch of every page with tifffile's own
decode and reads a page whose pixels differ by more than :data:`TOLERANCE` grey levels
on the CPU, with one log line.

A stream the decoder refuses is not a crash: that batch is decoded on the CPU
(tifffile/imagecodecs), with one log line; a stream neither decodes raises, so the
slide is reported as failed by the reader.

:func:`area_resize` resizes a batch as ``cv2.resize`` does in
:meth:`pathtwt.wsi.slides.Slide.read_tile` (INTER_AREA to shrink, INTER_LINEAR to
enlarge): INTER_AREA is a separable box filter with fractional edge weights, written
here as two small matrix products, so any factor (448 -> 224, 256 -> 224) gives cv2's
pixels exactly (with cv2's rounding); INTER_LINEAR is within one grey level (cv2 uses
fixed-point weights).

Which decoder a run uses is :mod:`pathtwt.wsi.decoding`'s.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Sequence

import numpy as np

from pathtwt.wsi.native_tiles import PHOTOMETRIC_RGB, NativeLevel, decode_native_tiles, interleaved_rgb_tiles, tile_bytes

log = logging.getLogger(__name__)

JPEG = 7  # TIFF Compression: "new-style" JPEG (TIFF technote 2); old-style (6) is left to tifffile

# the most two decoders of the same JPEG stream may differ (IDCT and upsampling
# rounding); beyond it a page is read on the CPU
TOLERANCE = 2

# Adobe APP14, version 100, no flags, transform 0: three components are RGB, not YCbCr
ADOBE_RGB = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"
_SOI, _EOI, _SOS, _APP14 = b"\xff\xd8", b"\xff\xd9", b"\xff\xda", b"\xff\xee"


# -- streams -----------------------------------------------------------------------


def splice(tables: bytes | None, stream: bytes, *, rgb: bool = False) -> bytes:
    """A complete JPEG from a tile's abbreviated ``stream`` and the page's JPEGTables
    ``tables`` (None or empty: the stream is complete already). ``rgb``: add an Adobe
    marker saying the components are RGB (unless the stream has one already)."""
    stream = bytes(stream)
    if not stream.startswith(_SOI):
        raise ValueError("the tile's stream does not start with a JPEG SOI marker")
    body = stream[2:]
    if tables:
        tables = bytes(tables)
        if not tables.startswith(_SOI):
            raise ValueError("the page's JPEGTables do not start with a JPEG SOI marker")
        end = len(tables) - 2 if tables.endswith(_EOI) else len(tables)
        body = tables[2:end] + body
    if rgb:
        # markers cannot occur in entropy-coded data (an FF there is followed by 00), and
        # the header ends at the first SOS: search only before it
        sos = body.find(_SOS)
        if _APP14 not in body[: sos if sos >= 0 else len(body)]:
            body = ADOBE_RGB + body
    return _SOI + body


def is_jpeg_tiled(page: Any) -> bool:
    """Whether tifffile ``page`` is a tiled, 8-bit, three-sample interleaved page of
    new-style JPEG tiles in RGB or YCbCr: what :class:`TorchJpegDecoder` decodes."""
    try:
        return interleaved_rgb_tiles(page) and int(page.compression) == JPEG
    except (AttributeError, TypeError, ValueError):
        return False


def tile_streams(page: Any, indices: Sequence[int]) -> list[bytes | None]:
    """The complete JPEG of each native tile ``indices`` of ``page`` (None for an empty
    tile of a sparse TIFF), read from the page's file handle."""
    rgb = int(page.photometric) == PHOTOMETRIC_RGB
    tables = page.jpegtables
    return [None if (data := tile_bytes(page, index)) is None else splice(tables, data, rgb=rgb) for index in indices]


def decode_streams(streams: Sequence[bytes], device: Any = "cpu") -> list[Any]:
    """torchvision's batch decode of complete JPEG ``streams``: uint8 (3, h, w) tensors
    on ``device`` (nvJPEG for a CUDA device)."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    data = [torch.frombuffer(bytearray(s), dtype=torch.uint8) for s in streams]
    if not data:
        return []
    return list(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))


# -- the decoder -------------------------------------------------------------------


def _page_key(page: Any) -> tuple[str, int]:
    return (str(getattr(page.parent.filehandle, "path", id(page.parent))), int(page.index))


class TorchJpegDecoder:
    """Decodes native tiles of a tifffile page with torchvision on ``device``.

    :meth:`tensors` gives (tile length, tile width, 3) uint8 tensors on the device (for
    :class:`DeviceLevel`); calling the decoder gives numpy arrays, the seam of
    :class:`pathtwt.wsi.native_tiles.NativeLevel`. Pages it does not decode (not JPEG,
    or pixels off tifffile's) and batches it refuses go through tifffile's own codecs,
    with one log line per page."""

    def __init__(self, device: Any = "cpu", *, check: bool = True) -> None:
        import torch

        self.device = torch.device(device)
        self.check = check
        self._checked: dict[tuple[str, int], bool] = {}  # page -> torchvision's pixels are right
        self._told: set[tuple[str, int]] = set()  # pages whose CPU fallback was logged
        self.fallbacks = 0  # batches decoded on the CPU because the decoder refused a stream
        self._disabled = ""  # why CUDA cannot be used in this process, once known
        self.levels: dict[tuple[str, int], DeviceLevel] = {}  # read_tiles_on_device's level of the current slide

    def __call__(self, page: Any, indices: Sequence[int]) -> list[np.ndarray]:
        decoded = self._decode(page, [int(i) for i in indices])
        if decoded is None:
            return decode_native_tiles(page, indices)
        return [t.cpu().numpy() for t in decoded]

    def tensors(self, page: Any, indices: Sequence[int]) -> list[Any]:
        import torch

        decoded = self._decode(page, [int(i) for i in indices])
        if decoded is not None:
            return decoded
        # np.require copies a read-only decoder buffer: torch refuses to wrap one without a warning
        return [torch.from_numpy(np.require(t, requirements=["C", "W"])).to(self.device) for t in decode_native_tiles(page, indices)]

    def _decode(self, page: Any, indices: list[int]) -> list[Any] | None:
        """The tiles decoded by torchvision, or None where the CPU must decode them."""
        import torch

        key = _page_key(page)
        if not indices:
            return []
        if self._disabled:
            return None
        if not is_jpeg_tiled(page):
            self._tell(key, f"TIFF compression {int(page.compression)} is not JPEG tiles torchvision decodes")
            return None
        if self._checked.get(key) is False:
            return None
        shape = (int(page.tilelength), int(page.tilewidth), 3)
        streams = tile_streams(page, indices)
        present = [k for k, s in enumerate(streams) if s is not None]
        try:
            decoded = decode_streams([streams[k] for k in present], self.device)
        except Exception as exc:  # noqa: BLE001 - torchvision raises RuntimeError and others on bad streams
            self.fallbacks += 1
            if self.device.type == "cuda" and not torch.cuda.is_initialized():
                # CUDA cannot start here (a forked reading process, a broken driver): every
                # page of this process goes to the CPU, said once
                self._disabled = " ".join(str(exc).split())[:200]
                log.warning("%s cannot start CUDA in this process (%s); native tiles are decoded on the CPU",
                            self._name(), self._disabled)
                return None
            self._tell(key, f"{self._name()} refused a JPEG stream among native tiles {indices[0]}-{indices[-1]} "
                            f"({' '.join(str(exc).split())[:200]})", force=True)
            return None
        out: list[Any] = [None] * len(indices)
        for k, tile in zip(present, decoded):
            out[k] = _fit_tile(tile.permute(1, 2, 0), shape)
        for k in set(range(len(indices))) - set(present):  # an empty tile of a sparse TIFF: white
            out[k] = torch.full(shape, 255, dtype=torch.uint8, device=self.device)
        if self.check and key not in self._checked and present:
            self._checked[key] = self._agrees(page, indices[present[0]], out[present[0]], key)
            if not self._checked[key]:
                return None
        return out

    def _tell(self, key: tuple[str, int], why: str, *, force: bool = False) -> None:
        # one line per page (a refused batch: one line per batch), not one per call
        if force or key not in self._told:
            self._told.add(key)
            log.warning("%s page %d: %s; its tiles are decoded on the CPU", key[0], key[1], why)

    def _name(self) -> str:
        return "nvJPEG" if self.device.type == "cuda" else "torchvision's JPEG decoder"

    def _agrees(self, page: Any, index: int, tile: Any, key: tuple[str, int]) -> bool:
        reference = decode_native_tiles(page, [index])[0]
        diff = int(np.abs(tile.cpu().numpy().astype(np.int16) - reference.astype(np.int16)).max())
        if diff > TOLERANCE:
            self._tell(key, f"{self._name()}'s pixels differ from tifffile's by {diff} grey levels (more than "
                            f"{TOLERANCE}; photometric {int(page.photometric)})", force=True)
        return diff <= TOLERANCE


_GPU_DECODER: TorchJpegDecoder | None = None


def process_gpu_decoder() -> TorchJpegDecoder:
    """This process's one CUDA decoder, made on first use (each reading process has its own)."""
    global _GPU_DECODER
    if _GPU_DECODER is None:
        _GPU_DECODER = TorchJpegDecoder("cuda")
    return _GPU_DECODER


def gpu_decoder(page: Any, indices: Sequence[int]) -> list[np.ndarray]:
    """The ``gpu`` decoder of :data:`pathtwt.wsi.decoding.DECODERS` (native tiles back to
    the host, for the levels and readers that cut on the CPU)."""
    return process_gpu_decoder()(page, indices)


def _fit_tile(tile: Any, shape: tuple[int, int, int]) -> Any:
    """A decoded tile at the page's tile shape: a stream encoded smaller than the tile
    (some writers crop edge tiles) is padded with white, a larger one cropped."""
    h, w = int(tile.shape[0]), int(tile.shape[1])
    if (h, w) == shape[:2]:
        return tile.contiguous()
    import torch

    out = torch.full(shape, 255, dtype=torch.uint8, device=tile.device)
    hh, ww = min(h, shape[0]), min(w, shape[1])
    out[:hh, :ww] = tile[:hh, :ww]
    return out


# -- regions, cut and resize on the device ------------------------------------------


class DeviceLevel(NativeLevel):
    """A :class:`~pathtwt.wsi.native_tiles.NativeLevel` whose decoded native tiles,
    regions and output tiles stay on the decoder's device (torch tensors)."""

    def __init__(self, page: Any, decoder: TorchJpegDecoder, **kwargs: Any) -> None:
        super().__init__(page, decoder=decoder.tensors, **kwargs)
        self.device = decoder.device

    def _blank(self, w: int, h: int, inside: bool) -> Any:
        import torch

        return torch.full((h, w, 3), self.fill, dtype=torch.uint8, device=self.device)

    def tiles(self, origins: Iterable[tuple[int, int]], side: int, patch_size: int) -> Any:
        """(N, patch_size, patch_size, 3) uint8 on the device: the ``side`` px squares at
        level-pixel ``origins``, resized as :meth:`Slide.read_tile` resizes."""
        import torch

        regions = self.regions([(int(x), int(y), int(side), int(side)) for x, y in origins])
        if not regions:
            return torch.empty((0, patch_size, patch_size, 3), dtype=torch.uint8, device=self.device)
        return area_resize(torch.stack(regions), patch_size)


def read_tiles_on_device(slide: Any, xy: Any, patch_size_level0: int, read_level: int, patch_size: int,
                         decoder: TorchJpegDecoder) -> Any | None:
    """:meth:`pathtwt.wsi.slides.Slide.read_tiles` decoded, cut and resized on the
    decoder's device: uint8 (N, patch_size, patch_size, 3), or None where the read level
    is not a JPEG-tiled native page (the caller reads those on the CPU). A native tile
    that decodes nowhere raises the slide's one-line :class:`SlideError`."""
    from pathtwt.wsi import supertiles

    xy = np.asarray(xy, dtype=np.int64).reshape(-1, 2)
    ds = slide.level_downsamples[read_level]
    origins, exact = supertiles.level_origins(xy, ds, slide.reader)
    native = slide.native_level(read_level) if exact and len(xy) else None
    if native is None or not is_jpeg_tiled(native.page):
        return None
    key = (str(slide.path), int(read_level))
    level = decoder.levels.get(key)
    if level is None or level.page is not native.page:
        decoder.levels.clear()  # one slide at a time: its decoded tiles are the device cache
        level = decoder.levels[key] = DeviceLevel(native.page, decoder, fill=slide.fill)
    side = max(1, int(round(patch_size_level0 / ds)))
    try:
        return level.tiles(origins, side, patch_size)
    except Exception as exc:  # noqa: BLE001 - both decoders refused a native tile
        x0, y0, w, h = supertiles.bounding_box(xy, int(patch_size_level0))
        raise slide._decode_error(exc, x0, y0, read_level, int(round(w / ds)), int(round(h / ds))) from None


def _area_weights(src: int, dst: int, device: Any) -> Any:
    """(dst, src) float32 weights of INTER_AREA: output pixel i averages the source span
    [i * src / dst, (i + 1) * src / dst), edge pixels weighted by the part inside it."""
    import torch

    edges = torch.arange(dst + 1, dtype=torch.float64) * (src / dst)
    left, right = edges[:-1, None], edges[1:, None]
    pixel = torch.arange(src, dtype=torch.float64)[None, :]
    overlap = (torch.minimum(right, pixel + 1) - torch.maximum(left, pixel)).clamp(min=0)
    return (overlap / (src / dst)).to(torch.float32).to(device)


def area_resize(batch: Any, size: int) -> Any:
    """uint8 (N, h, w, 3) -> uint8 (N, size, size, 3) on the same device: INTER_AREA to
    shrink, bilinear (half-pixel centres, cv2's INTER_LINEAR) to enlarge."""
    import torch
    import torch.nn.functional as F

    n, h, w, _ = batch.shape
    if (h, w) == (size, size):
        return batch
    x = batch.permute(0, 3, 1, 2).to(torch.float32)  # (N, 3, h, w)
    if h > size and w > size:
        wy, wx = _area_weights(h, size, batch.device), _area_weights(w, size, batch.device)
        out = torch.matmul(torch.matmul(wy, x), wx.T)
        # cv2 rounds a whole-factor box mean half up (integer sums), any other factor's
        # float mean half to even (cvRound)
        whole = h % size == 0 and w % size == 0
        out = torch.floor(out + 0.5) if whole else torch.round(out)
    else:
        out = torch.floor(F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False) + 0.5)
    return out.clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()
