"""Tiles made on the model's device from what the reading processes ship.

The GPU path (``--decode gpu``): a batch arrives as the complete JPEG streams of the native
tiles under it (in a ring slot) and a :class:`~pathtwt.wsi.cut_plan.CutPlan`. Here, in the
one process that owns the job's GPU, the streams are decoded as one batch
(:mod:`pathtwt.features.gpu_decoders`) and stacked with the native tiles the band's
previous batch left on the device; every output tile is cut with two gathers (:func:`cut`)
and shrunk (:func:`area_resize`). The pixels never cross PCIe after the bytes do.

The CPU path: a batch arrives as finished uint8 tiles in a ring slot and is copied to the
device from it (pinned memory, without a staging copy).

What a batch costs the host does not grow with its native tiles: the gathers' index arrays
(:func:`~pathtwt.wsi.cut_plan.gather_plan`, with the stack's order folded into its lookup
table) are written into the free end of the batch's ring slot, pinned, and cross in one
asynchronous copy; the stack is one tensor, allocated once, that the decoder decodes into
(one copy of its batch, or of each part of it), then the band's kept tiles and the fill
tile. Nothing waits for the device, except the one comparison per slide below. Cut and
shrink run in IEEE fp32 whatever precision the forward passes run in.

Faults, each said once in one line naming the slide, and recorded in the slide's features
file (:class:`SlideDecode`):

- a stream the GPU decoder gives no image for, even alone, is refused: it is decoded on
  the host (:func:`~pathtwt.features.jpeg_reference.fancy`, imagecodecs: the libjpeg-turbo
  OpenSlide and the CPU path use), the batch's such tiles crossing in one copy. Streams it
  gives none for among several and then decodes in smaller calls ran out of memory
  (nvImageCodec says so with None, not an error): a step down, said as that;
- a slide whose first GPU-decoded tile differs from the decoder's own reference
  (``decoder.reference``: the host decoding as the decoder does, e.g. the same chroma
  upsampling) by more than ``decoder.tolerance`` grey levels, a slide of RGB JPEG tiles
  (Adobe transform 0) with a decoder that does not decode RGB ones (``decoder.decodes_rgb``),
  and a slide whose tiles mix RGB and YCbCr go to the CPU path: the readers send its tiles
  finished from then on, and what is in flight is decoded on the host here;
- a native tile neither decoder reads fails its slide;
- running out of GPU memory halves the batch (:mod:`pathtwt.features.step_down`); decoding
  in parts lowers the peak, since each part's decoded tiles are copied into the stack and
  freed before the next; what is done of a batch is not done again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from pathtwt.features import jpeg_reference
from pathtwt.features.gpu_decoders import BatchDecoder, place
from pathtwt.features.reading import BatchMessage
from pathtwt.features.ring import Ring
from pathtwt.features.step_down import StepDown
from pathtwt.models.precision import exact_fp32
from pathtwt.wsi.cut_plan import CutPlan, gather_plan

log = logging.getLogger(__name__)

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


def cut(stack: torch.Tensor, axes: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """Output tiles (N, side, side, 3) uint8 cut from ``stack`` (decoded native tiles, the
    fill tile among them) with two gathers: ``axes`` (4, N, side) and ``lut`` are
    :func:`~pathtwt.wsi.cut_plan.gather_plan`'s, on the stack's device, the lookup table's
    values rows of the stack."""
    rows, y_in, cols, x_in = axes.unbind(0)
    slot = lut[rows.unsqueeze(2), cols.unsqueeze(1)]  # (N, side, side): each pixel's native tile in the stack
    return stack[slot, y_in.unsqueeze(2), x_in.unsqueeze(1)]


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
    level: cv2 uses fixed-point weights). In IEEE fp32 whatever the caller's precision
    (:class:`~pathtwt.models.precision.exact_fp32`): under the job's bf16 autocast the two
    products would run in bf16 and move pixels by up to 2 grey levels."""
    import torch.nn.functional as F

    n, h, w, _ = batch.shape
    if (h, w) == (size, size):
        return batch
    with exact_fp32(batch.device):  # pixels, not model arithmetic: never the job's bf16 autocast, nor TF32
        x = batch.permute(0, 3, 1, 2).to(torch.float32)  # (N, 3, h, w)
        if h > size and w > size:
            wy, wx_t = _cached_weights(h, size, batch.device), _cached_weights(w, size, batch.device).T
            out = torch.matmul(torch.matmul(wy, x), wx_t)
            # cv2 rounds a halving's box mean half up ((sum + 2) >> 2, its 2x2 fast path), any
            # other factor's float mean half to even (cvRound)
            halving = h == 2 * size and w == 2 * size
            out = torch.floor(out + 0.5) if halving else torch.round(out)
        else:
            out = torch.floor(F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False) + 0.5)
        return out.clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


@dataclass
class SlideDecode:
    """Where one slide's native tiles were decoded on the GPU path, and why any were not
    decoded on the device (its features file's natives_decoded_* and decode_fallback)."""

    device: int = 0  # native tiles the GPU decoder decoded (and whose pixels were used)
    host: int = 0  # native tiles decoded on the host here: refused streams, batches of a slide sent to the CPU
    reused: int = 0  # native tiles taken from the band's previous batch instead of being shipped again
    refused: int = 0  # streams the GPU decoder refused
    tile_batches: int = 0  # batches that came from the readers as finished tiles
    checked: bool = False  # the decoder's first tile of the slide was compared with its reference
    to_cpu: bool = False  # the slide is decoded on the host (the readers told to send it as tiles)
    said_refused: bool = False
    colours: set = field(default_factory=set)  # rgb, ycbcr: the colour spaces of its JPEG tiles
    reasons: list = field(default_factory=list)  # why tiles were decoded off the device, in order

    def fell_back(self, reason: str) -> None:
        if reason and reason not in self.reasons:
            self.reasons.append(reason)

    def fallback(self) -> str:
        """Why any native tile of the slide was decoded off the device ('' when none was)."""
        refused = [f"the GPU decoder refused {self.refused} JPEG stream(s), decoded on the host"] if self.refused else []
        return "; ".join(refused + self.reasons)

    def attrs(self, describe: str, gpu_path: bool, reader_decoded: int) -> dict[str, Any]:
        """The features file's attributes: ``describe``, the decoding asked for
        (:meth:`~pathtwt.features.decoding.Decoding.describe`), unless the slide was decoded
        elsewhere in whole or in part; ``reader_decoded``: the natives its readers decoded."""
        host = self.host + int(reader_decoded)
        off_device = host > 0 or self.tile_batches > 0
        if gpu_path and off_device:
            describe = "CPU (the GPU path fell back: decode_fallback says why)" if not self.device else \
                f"{describe} for {self.device} native tiles, CPU for the rest (decode_fallback says why)"
        return {"decode": describe, "natives_decoded_device": self.device, "natives_decoded_host": host,
                "decode_fallback": self.fallback() if gpu_path else ""}


@dataclass
class DeviceBatch:
    """A batch's tiles on the device: ``make(lo, hi)`` makes tiles [lo, hi) (the whole
    batch at once, or in parts after the GPU ran out of memory). ``holds``: the device
    tensors the parts read, for a stream other than the one that made them."""

    n: int
    make: Callable[[int, int], torch.Tensor]
    holds: tuple = ()

    def tiles(self, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        return self.make(lo, self.n if hi is None else hi)

    def used_on(self, stream: Any) -> None:
        for t in self.holds:
            t.record_stream(stream)


@dataclass
class _Stacking:
    """One batch's stack of native tiles as it is filled (rows: its fresh streams in the
    slot's order, the band's kept tiles, the fill tile), kept across the retries after an
    out-of-memory error so that nothing done is done again or counted twice."""

    streams: list
    lengths: np.ndarray  # the streams' bytes (0: an empty tile)
    shape: tuple[int, int]
    rows: int
    stack: torch.Tensor | None = None
    done: int = 0  # streams decoded into the stack (on the device, or queued for the host)
    tail: bool = False  # the kept tiles and the fill tile are in
    device_rows: list = field(default_factory=list)  # rows the GPU decoder decoded
    host: list = field(default_factory=list)  # rows to decode on the host, copied in together
    host_done: int = 0
    refused: int = 0
    indices: tuple | None = None  # the cut's axes and lookup table, the rows to keep, on the device


class DeviceTiles:
    """Batches of uint8 tiles (N, S, S, 3) on ``device`` from reading-process messages.

    ``decoder``: a :class:`~pathtwt.features.gpu_decoders.BatchDecoder`, whose attributes
    say how its pixels are checked (None: the CPU path only). ``use_tiles(slide)``: tells the readers to send a slide as finished tiles
    from now on. ``input_size``: the model's. ``steps``: the job's out-of-memory step-down.
    ``slide_name(slide)``: the slide's file, for the lines said."""

    def __init__(self, ring: Ring, device: Any, input_size: int, decoder: BatchDecoder | None = None,
                 use_tiles: Callable[[int], None] = lambda slide: None, steps: StepDown | None = None,
                 slide_name: Callable[[int], str] = lambda slide: f"slide {slide}") -> None:
        self.ring = ring
        self.device = torch.device(device)
        self.input_size = int(input_size)
        self.decoder = decoder
        self.use_tiles = use_tiles
        self.steps = steps or StepDown()
        self.slide_name = slide_name
        # each slide's first stream is compared with the decoder's reference, unless the
        # decoder is the host decoder itself (the CPU path's pixels)
        self.check = decoder is not None and not decoder.is_host
        if decoder is not None:  # a step down gives back what the decoder keeps, and its pool's memory
            self.steps.releases.append(lambda: decoder.release(trim=True))
        self.records: dict[int, SlideDecode] = {}
        self._bands: dict[int, tuple[np.ndarray, torch.Tensor]] = {}  # band -> (native indices, their tiles)

    def record(self, slide: int) -> SlideDecode:
        rec = self.records.get(slide)
        if rec is None:
            rec = self.records[slide] = SlideDecode()
        return rec

    def take_record(self, slide: int) -> SlideDecode:
        """A finished slide's record (forgotten here)."""
        return self.records.pop(slide, None) or SlideDecode()

    def batch(self, msg: BatchMessage) -> DeviceBatch:
        """The tiles of ``msg`` on the device. The caller gives the slot back once the work
        queued on the device that reads it is done (:mod:`pathtwt.features.loop` records
        an event)."""
        if msg.kind == "tiles":
            self._bands.pop(msg.band, None)  # the reader keeps nothing past a batch it sent as tiles
            if self.decoder is not None:
                rec = self.record(msg.slide)
                rec.tile_batches += 1
                rec.fell_back(msg.why_tiles and f"{msg.why_tiles}: decoded by the reading processes")
            host = torch.from_numpy(self.ring.tiles(msg.slot, msg.end - msg.start, self.input_size))
            n = msg.end - msg.start
            return DeviceBatch(n, lambda lo, hi: (host if (lo, hi) == (0, n) else host[lo:hi])
                               .to(self.device, non_blocking=True))
        if msg.kind != "bytes":
            raise ValueError(f"no tiles in a {msg.kind!r} message")
        return self._from_bytes(msg)

    def forget(self, band: int) -> None:
        """Drop what a band left on the device (its slide failed)."""
        self._bands.pop(band, None)

    def close(self) -> None:
        """The job ended: the buffers its decoder keeps for the job's streams are dropped
        (the next job decodes on streams of its own)."""
        self._bands.clear()
        if self.decoder is not None:
            self.decoder.release()

    # -- the GPU path ----------------------------------------------------------------------
    def _from_bytes(self, msg: BatchMessage) -> DeviceBatch:
        plan: CutPlan = msg.plan
        kept_natives, kept = self._bands.get(msg.band, (np.zeros(0, np.int64), None))
        if len(msg.fresh) + len(kept_natives) != len(plan.natives):
            raise RuntimeError(f"band {msg.band}: the native tiles kept on the device do not match the reader's")
        rec = self.record(msg.slide)
        self._colours(msg, rec)
        slot = self.ring.slot(msg.slot)
        streams = [slot[o:o + n] for o, n in zip(msg.offsets.tolist(), msg.lengths.tolist())]
        batch = _Stacking(streams, np.asarray(msg.lengths), (plan.grid.tile_height, plan.grid.tile_width),
                          len(streams) + len(kept_natives) + 1)

        def build() -> torch.Tensor | None:  # every device step of the batch, resumed after a step down
            self._stack(msg, rec, kept, batch)
            if batch.indices is None:
                batch.indices = self._indices(msg, kept_natives)
            keep = batch.indices[2]
            return batch.stack.index_select(0, keep) if len(keep) else None

        kept_next = self.steps.attempt(build, max(len(streams), 1), "decoding a batch of JPEG streams")
        rec.device += len(batch.device_rows)
        rec.host += batch.host_done
        rec.refused += batch.refused
        rec.reused += len(kept_natives)
        if kept_next is not None:
            self._bands[msg.band] = (np.asarray(msg.keep), kept_next)
        else:
            self._bands.pop(msg.band, None)
        stack, (axes, lut, _keep) = batch.stack, batch.indices
        n, size = msg.end - msg.start, self.input_size

        def make(lo: int, hi: int) -> torch.Tensor:
            part = axes if (lo, hi) == (0, n) else axes[:, lo:hi]
            return area_resize(area_resize(cut(stack, part, lut), plan.patch_size), size)

        return DeviceBatch(n, make, (stack, axes, lut))

    def _stack(self, msg: BatchMessage, rec: SlideDecode, kept: torch.Tensor | None, batch: _Stacking) -> None:
        """The batch's native tiles on the device, in one tensor allocated once: the fresh
        ones in the slot's order, decoded straight into their rows part by part (what the
        decoder allocated for a part is freed before the next, so parts lower the peak), the
        ones the band kept, the fill tile; then the rows decoded on the host, in one copy.
        Resumes where an out-of-memory error stopped it."""
        if batch.stack is None:
            batch.stack = torch.empty((batch.rows, *batch.shape, 3), dtype=torch.uint8, device=self.device)
        fresh = len(batch.streams)
        while batch.done < fresh:
            hi = min(batch.done + self.steps.part(fresh), fresh)  # the part after a step down is the smaller one
            self._decode_part(msg, rec, batch, batch.done, hi)
            batch.done = hi
        if not batch.tail:
            if kept is not None:
                batch.stack[fresh:fresh + len(kept)].copy_(kept)
            batch.stack[-1].fill_(int(msg.plan.fill))
            batch.tail = True
        self._host_rows(msg, batch)

    def _decode_part(self, msg: BatchMessage, rec: SlideDecode, batch: _Stacking, lo: int, hi: int) -> None:
        """Streams [lo, hi) into their rows of the stack; empty streams (a sparse TIFF's
        empty tiles) white. A stream the decoder gives no image for, even alone, is decoded
        on the host (refused); one it gave none for among several and then did in smaller
        calls ran out of memory: the job's parts are halved, said as that."""
        present = (np.flatnonzero(batch.lengths[lo:hi]) + lo).tolist()
        if len(present) < hi - lo:
            for k in sorted(set(range(lo, hi)) - set(present)):
                batch.stack[k].fill_(255)
        if not present:
            return
        if rec.to_cpu:
            batch.host.extend(present)
            return
        got, recovered = self._decode_rows(batch, present)
        if recovered:
            self.steps.halve(len(present), f"decoding a batch of JPEG streams (the GPU decoder gave no image for "
                                           f"{recovered} of {len(present)} until given fewer at a time)")
        if got.count(True) == len(got):  # the usual batch: every tile in its row
            batch.device_rows.extend(present)
        else:
            self._odd_rows(msg, rec, batch, present, got)
        if self.check and not rec.checked and batch.device_rows:
            first = batch.device_rows[0]  # the slide's check: a tile the decoder made
            rec.checked = True
            self._check(msg, rec, batch.stack[first], batch.streams[first], batch.shape)
            if rec.to_cpu:  # this batch's tiles too, those decoded so far included
                batch.host.extend(batch.device_rows)
                batch.device_rows = []

    def _odd_rows(self, msg: BatchMessage, rec: SlideDecode, batch: _Stacking, present: list[int], got: list) -> None:
        """A part's rows the decoder did not fill: tiles decoded at another shape, fitted;
        streams it gave no image for even alone, refused (decoded on the host, said once)."""
        refused = [k for k, g in zip(present, got) if g is None]
        for k, g in zip(present, got):
            if g is not None and g is not True:
                _fit_into(batch.stack[k], g)  # a stream encoded at another size than the page's tiles
        batch.device_rows.extend(k for k, g in zip(present, got) if g is not None)
        batch.host.extend(refused)
        batch.refused += len(refused)
        if refused and not rec.said_refused:
            rec.said_refused = True
            log.warning("%s: the GPU decoder (%s) refused a JPEG stream: it gave no image for it even when given it "
                        "alone (not for lack of memory); it and any other it refuses are decoded on the host",
                        self.slide_name(msg.slide), self.decoder.name)

    def _decode_rows(self, batch: _Stacking, present: list[int]) -> tuple[list, int]:
        """The streams of rows ``present`` decoded into those rows: per row True, its tile
        decoded at another shape, or None (no image, after :meth:`_retried`); and how many
        came back only in smaller calls."""
        lo, hi = present[0], present[-1] + 1
        contiguous = hi - lo == len(present)
        target = batch.stack[lo:hi] if contiguous else \
            torch.empty((len(present), *batch.shape, 3), dtype=torch.uint8, device=self.device)
        streams = [batch.streams[k] for k in present]
        got = self.decoder.into(streams, target)
        recovered = self._retried(streams, target, got)
        if not contiguous:
            for i, k in enumerate(present):
                if got[i] is True:
                    batch.stack[k].copy_(target[i])
        return got, recovered

    def _retried(self, streams: list, target: torch.Tensor, got: list) -> int:
        """The streams ``got`` has no image for, decoded again into ``target``: a lone one
        alone, several in halves, after the device memory nothing holds is given back.
        nvImageCodec answers an image it cannot allocate (or parse, or decode) with None in
        its place, not an error (``python/decoder.cpp``, ``Decoder::decode``): out of memory
        comes first. ``got`` is filled in; returns how many of several missing came back."""
        missing = [i for i, g in enumerate(got) if g is None]
        if not missing or len(got) == 1:
            return 0
        several = len(missing) > 1
        if several:
            self.steps.free()
        recovered, groups = 0, [missing]
        while groups:
            group = groups.pop()
            for half in (group[:len(group) // 2], group[len(group) // 2:]) if len(group) > 1 else (group,):
                tiles = self.decoder([streams[i] for i in half])
                again = [i for i, t in zip(half, tiles) if t is None]
                for i, t in zip(half, tiles):
                    if t is not None:
                        got[i] = place([t], target[i:i + 1])[0]
                recovered += len(half) - len(again)
                if again and len(half) > 1:
                    groups.append(again)
        return recovered if several else 0

    def _host_rows(self, msg: BatchMessage, batch: _Stacking) -> None:
        """The batch's rows to decode on the host (refused streams; all of a slide sent to
        the CPU path) decoded here into one host buffer, pinned on CUDA, that crosses in one
        non-blocking copy. The buffer may be dropped at once: torch's pinned-memory cache
        takes a block back only after the copies queued from it are done (a non-blocking
        copy records an event on it, ``aten/src/ATen/native/cuda/Copy.cu``)."""
        if not batch.host:
            return
        rows = sorted(set(batch.host))
        host = torch.empty((len(rows), *batch.shape, 3), dtype=torch.uint8, pin_memory=self.device.type == "cuda")
        pixels = host.numpy()
        for i, k in enumerate(rows):
            pixels[i] = _fit_np(self._host_decode(msg, batch.streams[k]), batch.shape)
        tiles = host.to(self.device, non_blocking=True)
        at = 0
        for a, b in _runs(rows):
            batch.stack[a:b].copy_(tiles[at:at + b - a])
            at += b - a
        batch.host_done += len(rows)
        batch.host = []

    def _indices(self, msg: BatchMessage, kept_natives: np.ndarray) -> tuple[torch.Tensor, ...]:
        """The cut's ``axes`` and ``lut`` and the stack rows to keep for the band's next
        batch, on the device, in one copy from the free end of the batch's ring slot
        (pinned on CUDA, and the slot is the batch's until its device work is done). The
        stack is the fresh natives in the slot's order, the kept ones, the fill tile: the
        lookup table's positions in ``plan.natives`` are mapped to those rows here."""
        plan = msg.plan
        keep = msg.keep if msg.keep is not None else np.zeros(0, np.int64)
        tail = self._tail(msg)
        a = 4 * len(plan.origins) * plan.side
        axes, lut = gather_plan(plan, out=tail[:a] if len(tail) >= a else None)
        b = a + lut.size
        host = tail[:b + len(keep)] if len(tail) >= b + len(keep) else np.empty(b + len(keep), np.int32)
        if not np.shares_memory(host, axes):
            host[:a] = axes.reshape(-1)  # the streams left too little room: a plain (pageable) copy
        fresh = len(msg.fresh)
        order = np.empty(len(plan.natives) + 1, np.int32)  # position in plan.natives -> stack row
        order[msg.fresh] = np.arange(fresh, dtype=np.int32)
        order[np.searchsorted(plan.natives, kept_natives)] = np.arange(fresh, fresh + len(kept_natives),
                                                                       dtype=np.int32)
        order[-1] = len(plan.natives)  # the fill tile, the stack's last row
        np.take(order, lut.reshape(-1), out=host[a:b])
        host[b:] = order[np.searchsorted(plan.natives, keep)]
        block = torch.from_numpy(host).to(self.device, non_blocking=True)
        return block[:a].view(axes.shape), block[a:b].view(lut.shape), block[b:]

    def _tail(self, msg: BatchMessage) -> np.ndarray:
        """The batch's ring slot after its streams, as int32."""
        end = int((msg.offsets + msg.lengths).max()) if len(msg.offsets) else 0
        at = -(-end // 64) * 64
        return np.frombuffer(self.ring.slot(msg.slot), np.int32, offset=min(at, self.ring.size.slot_bytes))

    def _colours(self, msg: BatchMessage, rec: SlideDecode) -> None:
        """RGB JPEG tiles (Adobe transform 0) with a decoder that reads them as YCbCr, or
        RGB and YCbCr tiles in one slide (the first-tile check sees one of them): the slide
        goes to the CPU path."""
        if not self.check:
            return
        present = int(np.count_nonzero(msg.lengths))
        if msg.rgb:
            rec.colours.add("rgb")
        if present > msg.rgb:
            rec.colours.add("ycbcr")
        if rec.to_cpu:
            return
        name = self.slide_name(msg.slide)
        if len(rec.colours) > 1:
            self._to_cpu(msg.slide, rec, "its JPEG tiles mix RGB and YCbCr colour spaces",
                         f"{name}: its JPEG tiles mix RGB and YCbCr colour spaces, which one GPU decoder call cannot "
                         "tell apart; its tiles are decoded on the CPU")
        elif "rgb" in rec.colours and not self.decoder.decodes_rgb:
            self._to_cpu(msg.slide, rec, f"RGB JPEG tiles (Adobe transform 0), which the {self.decoder.name} "
                                         "decoder reads as YCbCr",
                         f"{name}: its JPEG tiles are RGB (Adobe transform 0), which the {self.decoder.name} decoder "
                         "reads as YCbCr; its tiles are decoded on the CPU")

    def _to_cpu(self, slide: int, rec: SlideDecode, reason: str, line: str) -> None:
        """From now on the readers decode ``slide``; this batch and those in flight are
        decoded on the host here."""
        rec.to_cpu = True
        rec.fell_back(f"{reason}: decoded on the CPU")
        self.use_tiles(slide)
        log.warning(line)

    def _check(self, msg: BatchMessage, rec: SlideDecode, tile: torch.Tensor, stream: Any,
               shape: tuple[int, int]) -> None:
        """The slide's first GPU-decoded tile against the decoder's reference (the one
        host sync of a slide)."""
        name, reference, tolerance = self.decoder.name, self.decoder.reference, self.decoder.tolerance
        diff = jpeg_reference.max_difference(tile.cpu().numpy(), _fit_np(np.asarray(reference(stream)), shape))
        if diff > tolerance:
            self._to_cpu(msg.slide, rec, f"the {name} decoder's pixels differ from its reference by {diff} grey "
                                         f"levels (more than {tolerance})",
                         f"{self.slide_name(msg.slide)}: the {name} decoder's pixels differ from its host "
                         f"reference by {diff} grey levels (more than {tolerance}); its tiles are decoded on the "
                         "CPU")

    def _host_decode(self, msg: BatchMessage, stream: Any) -> np.ndarray:
        try:
            return jpeg_reference.fancy(stream)
        except Exception as exc:  # noqa: BLE001 - imagecodecs raises its own error types
            raise UndecodableTile(f"cannot decode a native tile at level {msg.level} (tiles {msg.start}-{msg.end - 1} of "
                                  f"the slide): {' '.join(str(exc).split())}") from None


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


def _fit_into(row: torch.Tensor, tile: torch.Tensor) -> None:
    """``tile`` written into a stack ``row`` of another shape, as :func:`_fit` pads or crops."""
    hh, ww = min(int(tile.shape[0]), int(row.shape[0])), min(int(tile.shape[1]), int(row.shape[1]))
    row.fill_(255)
    row[:hh, :ww].copy_(tile[:hh, :ww])


def _fit_np(tile: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    return _fit(torch.from_numpy(np.ascontiguousarray(tile)), shape).numpy()


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct ``rows`` as runs [a, b) of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for k in rows:
        if runs and runs[-1][1] == k:
            runs[-1] = (runs[-1][0], k + 1)
        else:
            runs.append((k, k + 1))
    return runs
