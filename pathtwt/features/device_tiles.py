"""Tiles made on the model's device from what the reading processes ship.

The GPU path (``--decode gpu``): a batch arrives as the complete JPEG streams of the native
tiles under it (in a ring slot) and a :class:`~pathtwt.wsi.cut_plan.CutPlan`. Here, in the
one process that owns the job's GPU, the streams are decoded as one batch
(:mod:`pathtwt.features.gpu_decoders`), stacked with the native tiles the band's previous
batch left on the device, every output tile is cut with one gather (:func:`cut`), shrunk
(:func:`area_resize`) and handed to the model. The pixels never cross PCIe after the bytes do.

The CPU path: a batch arrives as finished uint8 tiles in a ring slot; it is copied to the
device (from pinned memory, without a staging copy) and the slot goes back to the readers
once the copy is done.

Faults, each said once and never fatal to the job: a stream the GPU decoder refuses is
decoded on the host (imagecodecs: the libjpeg-turbo OpenSlide uses); a page whose GPU
pixels differ from the host decoder's by more than :data:`TOLERANCE` grey levels (checked
on each slide's first stream) is read on the CPU path from then on; a native tile neither
decoder reads fails its slide with one line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from pathtwt.features.reading import BatchMessage
from pathtwt.features.ring import Ring
from pathtwt.wsi.cut_plan import CutPlan, gather_plan

log = logging.getLogger(__name__)

# the most two decoders of the same JPEG stream may differ (IDCT and upsampling rounding)
TOLERANCE = 2


def host_decode(stream: Any) -> np.ndarray:
    """One complete JPEG stream decoded on the host: uint8 (h, w, 3)."""
    import imagecodecs

    return np.asarray(imagecodecs.jpeg8_decode(bytes(stream)))


def pin_host_memory(ring: Ring, device: Any) -> Callable[[], None]:
    """Page-lock the ring once on a CUDA ``device`` (cudaHostRegister), so a slot's tiles
    cross by DMA; returns the undo. Nothing to do elsewhere."""
    if torch.device(device).type != "cuda":
        return lambda: None
    import ctypes

    from pathtwt.features.cuda_runtime import clear_last_error

    address = ctypes.addressof(ctypes.c_char.from_buffer(ring.memory))
    cudart = torch.cuda.cudart()
    status = int(cudart.cudaHostRegister(address, ring.size.total, 0))
    if status != 0:
        why = f"could not pin the tile ring ({ring.describe()}): cudaHostRegister failed, " \
              f"{cudart.cudaGetErrorString(cudart.cudaError(status))} ({status})"
        # its error stays the runtime's last one, which the next kernel launch would report
        # as its own: cleared, or the job stops with this line
        clear_last_error(why)
        log.warning("%s; copies to the GPU go through a staging buffer", why)
        return lambda: None
    return lambda: cudart.cudaHostUnregister(address)


def cut(stack: torch.Tensor, plan: CutPlan) -> torch.Tensor:
    """The output tiles of ``plan`` (N, side, side, 3) uint8, cut from ``stack``: the
    decoded native tiles in ``plan.natives``'s order and, after them, one tile of
    ``plan.fill`` (pixels outside the level). The index arithmetic is the host's
    (:func:`~pathtwt.wsi.cut_plan.gather_plan`, small arrays); here two gathers."""
    axes, lut = gather_plan(plan)
    axes = torch.from_numpy(axes).to(stack.device, non_blocking=True)
    lut = torch.from_numpy(lut).to(stack.device, non_blocking=True)
    rows, y_in, cols, x_in = axes
    slot = lut[rows[:, :, None], cols[:, None, :]]  # (N, side, side): each pixel's native tile in the stack
    return stack[slot, y_in[:, :, None], x_in[:, None, :]]


_WEIGHTS: dict[tuple[int, int, str], torch.Tensor] = {}


def _area_weights(src: int, dst: int, device: Any) -> torch.Tensor:
    """(dst, src) float32 weights of INTER_AREA: output pixel i averages the source span
    [i * src / dst, (i + 1) * src / dst), edge pixels weighted by the part inside it."""
    edges = torch.arange(dst + 1, dtype=torch.float64) * (src / dst)
    left, right = edges[:-1, None], edges[1:, None]
    pixel = torch.arange(src, dtype=torch.float64)[None, :]
    overlap = (torch.minimum(right, pixel + 1) - torch.maximum(left, pixel)).clamp(min=0)
    return (overlap / (src / dst)).to(torch.float32).to(device)


def _cached_weights(src: int, dst: int, device: Any) -> torch.Tensor:
    key = (src, dst, str(device))
    if key not in _WEIGHTS:
        _WEIGHTS[key] = _area_weights(src, dst, device)
    return _WEIGHTS[key]


def area_resize(batch: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 (N, h, w, 3) -> uint8 (N, size, size, 3) on the same device, as
    ``cv2.resize`` does in :meth:`pathtwt.wsi.slides.Slide.read_tile`: INTER_AREA to
    shrink (a separable box filter with fractional edge weights, two matrix products, with
    cv2's rounding: cv2's pixels on whole factors up to 5; on fractional ones the sums run
    in another order than cv2's, so a pixel on a rounding boundary can differ by one grey
    level), bilinear with half-pixel centres to enlarge (cv2's INTER_LINEAR within one grey
    level: cv2 uses fixed-point weights)."""
    import torch.nn.functional as F

    n, h, w, _ = batch.shape
    if (h, w) == (size, size):
        return batch
    x = batch.permute(0, 3, 1, 2).to(torch.float32)  # (N, 3, h, w)
    if h > size and w > size:
        wy, wx = _cached_weights(h, size, batch.device), _cached_weights(w, size, batch.device)
        out = torch.matmul(torch.matmul(wy, x), wx.T)
        # cv2 rounds a halving's box mean half up ((sum + 2) >> 2, its 2x2 fast path), any
        # other factor's float mean half to even (cvRound)
        halving = h == 2 * size and w == 2 * size
        out = torch.floor(out + 0.5) if halving else torch.round(out)
    else:
        out = torch.floor(F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False) + 0.5)
    return out.clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


@dataclass
class DecodeCounts:
    """What the device side did over a job (the job's log line and the features attrs)."""

    decoded: int = 0  # native tiles decoded on the device
    reused: int = 0  # native tiles taken from the band's previous batch instead
    host_streams: int = 0  # streams the GPU decoder refused, decoded on the host
    pages_to_cpu: set = field(default_factory=set)


class DeviceTiles:
    """Batches of uint8 tiles (N, S, S, 3) on ``device`` from reading-process messages.

    ``decoder``: a batch decoder of :mod:`pathtwt.features.gpu_decoders` (None: the CPU
    path only). ``use_tiles(slide)``: tells the readers to send a slide as finished tiles
    from now on (a page whose GPU pixels are off). ``input_size``: the model's."""

    def __init__(self, ring: Ring, device: Any, input_size: int, decoder: Any = None,
                 use_tiles: Callable[[int], None] = lambda slide: None) -> None:
        self.ring = ring
        self.device = torch.device(device)
        self.input_size = int(input_size)
        self.decoder = decoder
        self.use_tiles = use_tiles
        # each slide's first stream is compared with the host decoder's, unless the decoder
        # is the host decoder itself
        self.check = decoder is not None and not getattr(decoder, "is_host", False)
        self.counts = DecodeCounts()
        self._bands: dict[int, tuple[np.ndarray, torch.Tensor]] = {}  # band -> (native indices, their tiles)
        self._checked: dict[int, bool] = {}  # slide -> the GPU decoder's pixels agree with the host's
        self._told: set[tuple[int, str]] = set()

    def batch(self, msg: BatchMessage) -> torch.Tensor:
        """The tiles of ``msg`` on the device. The caller gives the slot back once the work
        queued on the device so far is done (:meth:`pathtwt.features.loop` records an event)."""
        if msg.kind == "tiles":
            self._bands.pop(msg.band, None)  # the reader keeps nothing past a batch it sent as tiles
            host = torch.from_numpy(self.ring.tiles(msg.slot, msg.end - msg.start, self.input_size))
            return host.to(self.device, non_blocking=True)
        if msg.kind != "bytes":
            raise ValueError(f"no tiles in a {msg.kind!r} message")
        return self._from_bytes(msg)  # a band's last batch keeps nothing: its keep is empty

    def forget(self, band: int) -> None:
        """Drop what a band left on the device (its slide failed)."""
        self._bands.pop(band, None)

    def _from_bytes(self, msg: BatchMessage) -> torch.Tensor:
        plan: CutPlan = msg.plan
        slot = self.ring.slot(msg.slot)
        streams = [slot[int(o):int(o) + int(n)] for o, n in zip(msg.offsets, msg.lengths)]
        fresh_tiles = self._decode(msg, streams, (plan.grid.tile_height, plan.grid.tile_width))
        shape = (plan.grid.tile_height, plan.grid.tile_width, 3)
        stack = torch.empty((len(plan.natives) + 1, *shape), dtype=torch.uint8, device=self.device)
        stack[-1] = plan.fill  # the tile pixels outside the level come from
        if len(msg.fresh) == len(plan.natives):
            stack[:-1] = fresh_tiles
        elif len(msg.fresh):
            stack[torch.from_numpy(np.asarray(msg.fresh, np.int64)).to(self.device)] = fresh_tiles
        held = np.setdiff1d(np.arange(len(plan.natives)), msg.fresh)
        if len(held):
            kept_natives, kept = self._bands[msg.band]
            rows = np.searchsorted(kept_natives, plan.natives[held])
            stack[torch.from_numpy(held).to(self.device)] = kept[torch.from_numpy(rows).to(self.device)]
            self.counts.reused += len(held)
        if msg.keep is not None and len(msg.keep):
            at = np.searchsorted(plan.natives, msg.keep)
            self._bands[msg.band] = (np.asarray(msg.keep), stack[torch.from_numpy(at).to(self.device)])
        else:
            self._bands.pop(msg.band, None)
        tiles = area_resize(cut(stack, plan), plan.patch_size)
        return area_resize(tiles, self.input_size)

    def _decode(self, msg: BatchMessage, streams: list, shape: tuple[int, int]) -> torch.Tensor:
        """The fresh native tiles of a batch (F, h, w, 3) on the device; empty tiles of a
        sparse TIFF (length 0) white."""
        present = [k for k, s in enumerate(streams) if len(s)]
        if not present:
            return torch.full((len(streams), *shape, 3), 255, dtype=torch.uint8, device=self.device)
        decoded = self.decoder([streams[k] for k in present]) if self.decoder is not None else [None] * len(present)
        if len(present) == len(streams) and all(t is not None and tuple(t.shape[:2]) == shape for t in decoded):
            out = torch.stack(decoded)  # the usual batch: one copy, not one per tile
        else:
            out = torch.full((len(streams), *shape, 3), 255, dtype=torch.uint8, device=self.device)
            for k, tile in zip(present, decoded):
                if tile is None:
                    self.counts.host_streams += 1
                    self._tell(msg.slide, "refused", f"slide {msg.slide}: the GPU decoder refused a JPEG stream; "
                                                     "it is decoded on the host")
                    tile = torch.from_numpy(self._host_decode(msg, streams[k])).to(self.device)
                out[k] = _fit(tile, shape)
        self.counts.decoded += len(present)
        if self.check and msg.slide not in self._checked:
            k = present[0]
            reference = self._host_decode(msg, streams[k])
            diff = int((out[k].cpu().to(torch.int16) - torch.from_numpy(_fit_np(reference, shape)).to(torch.int16))
                       .abs().max())
            self._checked[msg.slide] = diff <= TOLERANCE
            if diff > TOLERANCE:
                # from now on the readers decode this slide; this batch and those in flight
                # are decoded on the host here
                self.use_tiles(msg.slide)
                self.counts.pages_to_cpu.add(msg.slide)
                log.warning("slide %d: the GPU decoder's pixels differ from libjpeg's by %d grey levels (more than "
                            "%d); its tiles are decoded on the CPU", msg.slide, diff, TOLERANCE)
        if self._checked.get(msg.slide) is False:
            for k in present:
                out[k] = torch.from_numpy(_fit_np(self._host_decode(msg, streams[k]), shape)).to(self.device)
        return out

    def _host_decode(self, msg: BatchMessage, stream: Any) -> np.ndarray:
        try:
            return host_decode(stream)
        except Exception as exc:  # noqa: BLE001 - imagecodecs raises its own error types
            raise UndecodableTile(f"cannot decode a native tile at level {msg.level} (tiles {msg.start}-{msg.end - 1} of "
                                  f"the slide): {' '.join(str(exc).split())}") from None

    def _tell(self, slide: int, what: str, line: str) -> None:
        if (slide, what) not in self._told:
            self._told.add((slide, what))
            log.warning(line)


class UndecodableTile(RuntimeError):
    """A native tile that neither the GPU nor the host decoder reads: its slide fails."""


def _fit(tile: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A decoded tile at the page's tile shape: a stream encoded smaller than the tile
    (some writers crop edge tiles) is padded with white, a larger one cropped."""
    h, w = int(tile.shape[0]), int(tile.shape[1])
    if (h, w) == tuple(shape):
        return tile
    out = torch.full((*shape, 3), 255, dtype=torch.uint8, device=tile.device)
    hh, ww = min(h, shape[0]), min(w, shape[1])
    out[:hh, :ww] = tile[:hh, :ww]
    return out


def _fit_np(tile: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    return _fit(torch.from_numpy(np.ascontiguousarray(tile)), shape).numpy()
