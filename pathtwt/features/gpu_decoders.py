"""Batch JPEG decoders that run where the model runs: one table, one entry per decoder.

``make_decoder(name, device)`` makes a :class:`BatchDecoder` (``shared_decoder``: the one
made once per process and device, which the jobs use): called with a list of
complete JPEG streams (buffers into the ring), it gives per stream a uint8 (h, w, 3)
tensor on the device that the caller owns, or None where it gives no image (the caller
reads that as out of memory first, then as a refused stream: :mod:`device_tiles`);
``into(streams, out)`` decodes into the rows of the caller's tensor instead, and
``release()`` drops what it keeps between calls. Its attributes are what the device side
needs: ``name``, ``is_host``, ``reference`` (libjpeg on the host decoding a stream the way
this decoder does), ``tolerance`` (grey levels) and ``decodes_rgb`` (whether it decodes
RGB JPEGs with an Adobe transform-0 marker, Aperio's tiles, as RGB).

A GPU decoder checks itself when it is made (:func:`_checked`): it decodes two test
JPEGs (:func:`pathtwt.features.jpeg_reference.probes`) on the device, and its reference
is libjpeg with the chroma upsampling its pixels match; ``decodes_rgb`` is measured the
same way. A decoder that decodes nothing on the GPU (nvImageCodec without its nvJPEG
extension, torchvision built without nvJPEG) raises :class:`GpuDecoderUnavailable`, one
line saying what to install; ``--decode auto`` then takes the next decoder.

- ``nvimgcodec`` (NVIDIA nvImageCodec 0.9, ``nvidia-nvimgcodec-cu13[nvjpeg]`` or
  ``-cu12[nvjpeg]``): the choice where it is installed. It decodes a batch on the hardware
  JPEG engines of the A100, H100 and H200 (CUDA kernels elsewhere), told to upsample
  chroma fancily (``:fancy_upsampling=1``, as libjpeg does). Only its GPU backends are
  allowed: without them it would decode on the CPU in a thread pool as large as the
  machine, beside the readers. Its output Images are reused from batch to batch on the
  stream they were made on, never from the compute stream (:class:`_NvImageCodecBatches`
  says why, from the library's source).
- ``torchvision``: ``torchvision.io.decode_jpeg(device="cuda")`` (nvJPEG, plain
  upsampling; a list of streams needs torchvision 0.19); deprecated since torchvision
  0.29, kept for a CUDA machine without nvImageCodec. It holds the host every batch: its
  ``decode_images`` (``torchvision/csrc/io/image/cuda/decode_jpegs_cuda.cpp``) starts and
  ends with ``cudaStreamSynchronize`` on its own stream.
- ``host``: libjpeg-turbo (imagecodecs) in the embedding process, the tiles then copied
  to the device. The stand-in that drives the whole device path on a CPU (the tests, the
  feed-rate benchmark).

AMD GPUs (ROCm) have neither GPU decoder: ``auto`` keeps the CPU path there
(:func:`pathtwt.features.decoding.resolve_decode`).
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch

from pathtwt.errors import ConfigError
from pathtwt.features import jpeg_reference

log = logging.getLogger(__name__)

# the nvImageCodec release whose Python API the calls below are written and tested against
# (pyproject.toml's gpu extras pin the same)
NVIMGCODEC_SERIES, NVIMGCODEC_PIN = "0.9", ">=0.9,<0.10"
# what to install for the first decoder of the table
INSTALL_GPU_DECODER = (f"pip install 'nvidia-nvimgcodec-cu13[nvjpeg]{NVIMGCODEC_PIN}' for CUDA 13, "
                       "-cu12[nvjpeg] for CUDA 12 (pathtwt's extras gpu and gpu-cu12)")
# the chroma upsampling libjpeg does; nvImageCodec's default was off in 0.5-0.8
NVIMGCODEC_OPTIONS = ":fancy_upsampling=1"
# host threads of its decoder (parsing, and the Huffman decode of its hybrid backend): the
# job's other cores read slides
NVIMGCODEC_CPU_THREADS = 4


class GpuDecoderUnavailable(ConfigError):
    """A GPU decoder that cannot decode JPEG on this GPU: one line, what to install."""


def nvimgcodec_install(nvimgcodec: Any) -> str:
    """The pip command for nvImageCodec with its GPU JPEG backend, for the CUDA major
    of the wheel installed (``__cuda_version__``, e.g. 13030)."""
    major = int(getattr(nvimgcodec, "__cuda_version__", 13000)) // 1000
    return f"pip install 'nvidia-nvimgcodec-cu{major}[nvjpeg]{NVIMGCODEC_PIN}'"


def nvimgcodec_backends(nvimgcodec: Any) -> list:
    """nvImageCodec's GPU backends (the hardware engines, CUDA kernels, the hybrid nvJPEG
    decoder): never its CPU ones."""
    kinds = nvimgcodec.BackendKind
    return [nvimgcodec.Backend(kind) for kind in (kinds.HW_GPU_ONLY, kinds.GPU_ONLY, kinds.HYBRID_CPU_GPU)]


def nvimgcodec_params(nvimgcodec: Any) -> Any:
    """The decode parameters: interleaved 8-bit sRGB, as the model's input is; no EXIF
    rotation (tiles have none, and libjpeg, the reference, applies none)."""
    return nvimgcodec.DecodeParams(apply_exif_orientation=False, color_spec=nvimgcodec.ColorSpec.SRGB,
                                   allow_any_depth=False, sample_format=nvimgcodec.SampleFormat.I_RGB)


class BatchDecoder:
    """``decode(streams) -> list[Tensor | None]`` with the facts the device side uses; what
    a decoder does not state: not the host decoder, libjpeg's fancy upsampling its
    reference, the measured tolerance, RGB JPEGs not decoded as RGB (a GPU decoder's
    reference and ``decodes_rgb`` are measured when it is made: :func:`_checked`).

    ``into(streams, out)`` decodes straight into the rows of a tensor the caller owns (the
    batch's stack of native tiles), so what the decoder allocated for a part of a batch is
    freed, or back in its pool, before the next part: ``into`` (the decoder's own way to,
    if it has one) otherwise :func:`place` of its tiles. ``release`` drops the buffers it
    keeps between calls (:meth:`release`)."""

    def __init__(self, name: str, decode: Callable[[Sequence[Any]], list], *, is_host: bool = False,
                 reference: jpeg_reference.Reference = jpeg_reference.fancy, tolerance: int = jpeg_reference.TOLERANCE,
                 decodes_rgb: bool = False, into: Callable[[Sequence[Any], torch.Tensor], list] | None = None,
                 release: Callable[[bool], None] | None = None) -> None:
        self.name = name
        self._decode = decode
        self._into = into
        self._release = release
        self.is_host = is_host
        self.reference = reference
        self.tolerance = int(tolerance)
        self.decodes_rgb = decodes_rgb

    def __call__(self, streams: Sequence[Any]) -> list:
        return self._decode(streams)

    def into(self, streams: Sequence[Any], out: torch.Tensor) -> list:
        """Decode ``streams`` into the rows of ``out`` (uint8 (len(streams), h, w, 3) on the
        device): per stream True (its tile is in its row), its tile (decoded at another
        shape: the caller fits it) or None (no image)."""
        if self._into is not None:
            return self._into(streams, out)
        return place(self._decode(streams), out)

    def release(self, trim: bool = False) -> None:
        """Drop the buffers kept for the next call (a job ends: the next one decodes on
        other streams); ``trim``: give the device memory they held back too (the GPU ran
        out of memory)."""
        if self._release is not None:
            self._release(trim)

    def __repr__(self) -> str:
        upsampling = "fancy" if self.reference is jpeg_reference.fancy else "plain"
        return (f"BatchDecoder({self.name}, {upsampling} upsampling, tolerance {self.tolerance}, "
                f"RGB JPEG {'yes' if self.decodes_rgb else 'no'})")


def _owned(tensors: list) -> list:
    """The decoded tiles (None kept) as views of one tensor the caller owns: one copy
    for the batch when the tiles share a shape, one per tile otherwise (cropped edge
    tiles)."""
    present = [t for t in tensors if t is not None]
    if not present:
        return list(tensors)
    if all(t.shape == present[0].shape for t in present):
        rows = iter(torch.stack(present).unbind(0))
    else:
        rows = iter([t.clone() for t in present])
    return [None if t is None else next(rows) for t in tensors]


def as_block(tiles: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """``tiles`` (h, w, 3) viewed as one (N, h, w, 3) tensor where they are the rows of one
    tensor, in order (how a decoder's batch comes: :func:`_owned`, the stand-ins' outputs):
    one view of their storage (their ``_base`` is not kept under inference mode), so they
    are copied once and the host dispatches one operation, not one per tile. None for
    anything else."""
    first = tiles[0] if len(tiles) else None
    if first is None or not first.is_contiguous():
        return None
    storage, step, at = first.untyped_storage(), first.numel(), first.storage_offset()
    rows = (first.device, first.dtype, first.shape)
    if storage.nbytes() == len(tiles) * step * first.element_size() and at == 0 and all(
            t is not None and (t.device, t.dtype, t.shape) == rows and t.is_contiguous() and t.storage_offset() == i * step
            and t.untyped_storage()._cdata == storage._cdata for i, t in enumerate(tiles)):
        return torch.as_strided(first, (len(tiles), *first.shape), (step, *first.stride()), 0)
    return None


def place(tiles: Sequence[torch.Tensor | None], out: torch.Tensor) -> list:
    """A decoder's ``tiles`` (None: no image) written into the rows of ``out``: per tile
    True where it is in its row, the tile itself where its shape is not the rows' (the
    caller fits it), None. A batch of one shape is one copy (one operation when the tiles
    are views of one tensor)."""
    shape = tuple(out.shape[1:])
    block = as_block(tiles) if len(tiles) and tiles[0] is not None and tuple(tiles[0].shape) == shape else None
    if block is not None:  # as_block checked every tile: present, of the first's shape
        out.copy_(block)
        return [True] * len(tiles)
    if len(tiles) and all(t is not None and tuple(t.shape) == shape for t in tiles):
        torch.stack(list(tiles), out=out)
        return [True] * len(tiles)
    placed: list = []
    for k, t in enumerate(tiles):
        if t is not None and tuple(t.shape) == shape:
            out[k].copy_(t)
            placed.append(True)
        else:
            placed.append(t)
    return placed


def _nvimgcodec(device: torch.device, *, device_id: int | None = None, backends: list | None = None) -> BatchDecoder:
    """nvImageCodec on ``device``'s GPU, its GPU backends only. ``device_id`` and
    ``backends`` are for the binding tests, which run the same calls on its CPU backend."""
    from nvidia import nvimgcodec

    version = getattr(nvimgcodec, "__version__", "?")
    try:
        params = nvimgcodec_params(nvimgcodec)
        chosen = nvimgcodec_backends(nvimgcodec) if backends is None else backends
    except (TypeError, AttributeError) as exc:
        raise GpuDecoderUnavailable(f"nvImageCodec {version}'s Python API is not {NVIMGCODEC_SERIES}'s, which pathtwt "
                                    f"calls ({type(exc).__name__}: {exc}); {nvimgcodec_install(nvimgcodec)}") from None
    try:
        if device_id is None:
            device_id = device.index if device.index is not None else torch.cuda.current_device()
        # with only GPU backends allowed, no decoder can be made where none of them loads
        decoder = nvimgcodec.Decoder(device_id=device_id, max_num_cpu_threads=NVIMGCODEC_CPU_THREADS,
                                     backends=chosen, options=NVIMGCODEC_OPTIONS)
    except RuntimeError as exc:
        raise GpuDecoderUnavailable(_no_gpu_backend(nvimgcodec, device, exc)) from None
    if device.type == "cuda":
        from pathtwt.features.cuda_runtime import keep_pool_memory

        # its decodes allocate from the device's stream-ordered pool: kept across batches
        if keep_pool_memory(device_id) != 0:
            log.info("nvImageCodec: the device's memory pool could not be told to keep its memory; it may give "
                     "it back and map it again each batch")
    batches = _NvImageCodecBatches(nvimgcodec, decoder, params, device)
    return _checked(BatchDecoder("nvimgcodec", batches, into=batches.into, release=batches.release), device,
                    f"nvImageCodec {version}", nvimgcodec_install(nvimgcodec), _no_gpu_backend(nvimgcodec, device))


class _NvImageCodecBatches:
    """nvImageCodec's ``decode`` of a batch on the caller's stream, into the Images of the
    last full batch decoded on that stream (``pools``: no allocation per tile per batch).

    What the library does, and why the pools are kept per stream (nvImageCodec 0.8 source,
    the same messages in the 0.9 binary):

    - it raises for bad arguments only: an image it cannot allocate, parse or decode comes
      back as None in its place (``python/decoder.cpp``, ``Decoder::decode``: "There will
      be None on corresponding output position"), so the caller reads None as out of memory
      first (:mod:`pathtwt.features.device_tiles` retries it in smaller parts);
    - ``decode(images=...)`` resizes each reused Image's buffer, and
      ``DeviceBuffer::resize`` (``src/imgproc/device_buffer.cpp``) calls
      ``cudaStreamSynchronize`` on the stream the buffer was allocated on when the new call's
      stream differs, without taking the new one: an Image made on the compute stream would
      make every later decode wait for the forward pass queued there. So an Image is only
      reused on the stream it was made on, none is kept from torch's default stream (the
      compute stream; the check of :func:`_checked` decodes there), and :meth:`release`
      drops them all when a job ends (its side stream goes with it);
    - a new Image's buffer comes from ``cudaMallocAsync`` on the call's stream and goes back
      with ``cudaFreeAsync`` there (``device_buffer.cpp``, ``alloc_impl``), into the
      device's default memory pool, which :func:`~pathtwt.features.cuda_runtime.keep_pool_memory`
      keeps and :func:`~pathtwt.features.cuda_runtime.trim_pool` gives back after an
      out-of-memory error.
    """

    def __init__(self, nvimgcodec: Any, decoder: Any, params: Any, device: torch.device) -> None:
        self.lib, self.decoder, self.params, self.device = nvimgcodec, decoder, params, device
        self.pools: dict[int, list] = {}  # stream handle -> the Images decoded into there

    def images(self, streams: Sequence[Any]) -> list:
        """The batch's tiles as tensors over the Images (None where there is no image),
        valid until the next call on the same stream."""
        sources = [self.lib.CodeStream(np.frombuffer(s, np.uint8)) for s in streams]
        stream, keep = decode_stream(self.device)
        pool = self.pools.get(stream, []) if keep else []
        reuse = pool[:len(sources)] if len(pool) >= len(sources) else None
        images = self.decoder.decode(sources, images=reuse, params=self.params, cuda_stream=stream)
        if keep and reuse is None and all(image is not None for image in images):
            self.pools[stream] = list(images)
        return [None if image is None else _tensor(image, self.device) for image in images]

    def __call__(self, streams: Sequence[Any]) -> list:
        return _owned(self.images(streams))

    def into(self, streams: Sequence[Any], out: torch.Tensor) -> list:
        return place(self.images(streams), out)  # copied out on the same stream, before the next decode there

    def release(self, trim: bool) -> None:
        self.pools.clear()  # the Images' buffers go back to the pool, freed on their own streams
        if trim and self.device.type == "cuda":
            from pathtwt.features.cuda_runtime import trim_pool

            # a stream-ordered free counts as in use until the host has seen its stream
            # reach it (cudaMemPoolTrimTo's contract): the device is synchronised first
            torch.cuda.synchronize(self.device)
            trim_pool(self.device.index if self.device.index is not None else torch.cuda.current_device())


def decode_stream(device: torch.device) -> tuple[int, bool]:
    """The stream a decode on ``device`` runs on (the caller's current one; 0 on a CPU) and
    whether Images decoded there may be kept for the next call there: not on torch's
    default stream, which the forward passes use."""
    if device.type != "cuda":
        return 0, True
    current = torch.cuda.current_stream(device)
    return int(current.cuda_stream), current != torch.cuda.default_stream(device)


def _tensor(image: Any, device: torch.device) -> torch.Tensor:
    """A decoded nvImageCodec Image as a tensor on ``device`` without a copy: the device
    buffer through ``__cuda_array_interface__``, a host one through ``__array_interface__``."""
    if device.type == "cuda":
        return torch.as_tensor(image, device=device)
    return torch.from_numpy(np.asarray(image))


def _no_gpu_backend(nvimgcodec: Any, device: torch.device, exc: BaseException | None = None) -> str:
    version = getattr(nvimgcodec, "__version__", "?")
    why = f" ({' '.join(str(exc).split())[:160]})" if exc is not None else ""
    return (f"nvImageCodec {version} decodes no JPEG on the GPU of {device}{why}: its GPU backend is the nvJPEG "
            f"extension, without which it would decode on the CPU; {nvimgcodec_install(nvimgcodec)}")


def _torchvision(device: torch.device) -> BatchDecoder:
    import torchvision
    from torchvision.io import ImageReadMode, decode_jpeg

    version = tuple(int(p) for p in torchvision.__version__.split("+")[0].split(".")[:2])
    if version < (0, 19):
        raise GpuDecoderUnavailable(f"torchvision {torchvision.__version__} decodes one JPEG per call on the GPU; "
                                    "pathtwt's GPU decode needs 0.19 or later: pip install 'torchvision>=0.19'")
    cuda = device.type == "cuda"
    # decode_jpeg allocates its outputs on the current stream and writes them on a stream of
    # its own, which waits for nothing: a block freed by work still queued on the current
    # stream could be written under it. So the current stream is one of ours (made on the
    # first call), which nothing else queues work on; the tiles are copied out there, the
    # caller's stream waits for that copy, and the next call waits for it before
    # torchvision may be handed those blocks again.
    side: list = []  # the stream, once made
    copied: list = []  # the event after the last batch's copy

    def run(data: list) -> list:
        with warnings.catch_warnings():
            # torchvision 0.29 deprecates its image decoding (said in docs/gpus.md)
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torchvision\.")
            try:
                return list(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))
            except RuntimeError:
                pass  # one bad stream fails the whole call: one by one to find it
            out = []
            for d in data:
                try:
                    out.append(decode_jpeg(d, mode=ImageReadMode.RGB, device=device))
                except RuntimeError:
                    out.append(None)
            return out

    def decode(streams: Sequence[Any]) -> list:
        data = [torch.frombuffer(s if _writable(s) else bytearray(s), dtype=torch.uint8) for s in streams]
        if not cuda:
            return _owned([None if im is None else im.permute(1, 2, 0) for im in run(data)])
        if not side:
            side.append(torch.cuda.Stream(device))
        if copied:
            copied.pop().synchronize()  # last batch's outputs were copied out: their blocks may be reused
        with torch.cuda.device(device), torch.cuda.stream(side[0]):
            tiles = _owned([None if im is None else im.permute(1, 2, 0) for im in run(data)])
            done = torch.cuda.Event()
            done.record(side[0])
        copied.append(done)
        main = torch.cuda.current_stream(device)
        main.wait_stream(side[0])
        for t in {t.untyped_storage().data_ptr(): t for t in tiles if t is not None}.values():
            t.record_stream(main)  # allocated on our stream, used on the caller's
        return tiles

    install = "install torchvision>=0.19 built with nvJPEG (its CUDA wheels are)"
    return _checked(BatchDecoder("torchvision", decode), device, f"torchvision {torchvision.__version__}", install,
                    f"torchvision {torchvision.__version__} decoded no test JPEG on {device}; {install}")


def _writable(buffer: Any) -> bool:
    return isinstance(buffer, (bytearray, np.ndarray)) or (isinstance(buffer, memoryview) and not buffer.readonly)


def _host(device: torch.device) -> BatchDecoder:
    def decode(streams: Sequence[Any]) -> list:
        out = []
        for s in streams:
            try:
                out.append(torch.from_numpy(jpeg_reference.fancy(s)).to(device))
            except Exception:  # noqa: BLE001 - refused: the caller tries again and names the tile
                out.append(None)
        return out

    # the reference itself: nothing to check it against
    return BatchDecoder("host", decode, is_host=True, reference=jpeg_reference.fancy, tolerance=0, decodes_rgb=True)


def _checked(made: BatchDecoder, device: torch.device, library: str, install: str, nothing: str) -> BatchDecoder:
    """``made`` after it decoded the two test JPEGs: its reference the libjpeg decode its
    pixels match (fancy or plain chroma upsampling) within its tolerance, ``decodes_rgb``
    measured. :class:`GpuDecoderUnavailable` when it fails (naming ``library`` and what
    to ``install``), decodes nothing (the line ``nothing``) or matches neither."""
    ycc, rgb = jpeg_reference.probes()
    try:
        got = made([ycc, rgb])
    except Exception as exc:  # noqa: BLE001 - a library's own error types: said in one line
        raise GpuDecoderUnavailable(f"{library} could not decode a test JPEG on {device} ({type(exc).__name__}: "
                                    f"{' '.join(str(exc).split())[:160]}); {install}") from None
    if got[0] is None:
        raise GpuDecoderUnavailable(nothing)
    pixels = got[0].cpu().numpy()
    off = {ref: jpeg_reference.max_difference(pixels, ref(ycc)) for ref in (jpeg_reference.fancy, jpeg_reference.plain)}
    reference = min(off, key=off.get)
    if off[reference] > made.tolerance:
        raise GpuDecoderUnavailable(f"{library} on {device}: a test JPEG decodes {off[reference]} grey levels away "
                                    f"from libjpeg's (more than {made.tolerance}, with fancy or plain chroma "
                                    "upsampling); decode on the CPU with --decode cpu")
    made.reference = reference
    made.decodes_rgb = got[1] is not None and \
        jpeg_reference.max_difference(got[1].cpu().numpy(), reference(rgb)) <= made.tolerance
    return made


def _installed(module: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    return check


class Entry(NamedTuple):
    installed: Callable[[], bool]  # is its library installed here?
    make: Callable[[torch.device], BatchDecoder]  # maker(device) -> decoder
    on_gpu: bool  # does it decode on the GPU?


# name -> entry, in order of preference (--decode auto takes the first that works here)
GPU_DECODERS: dict[str, Entry] = {
    "nvimgcodec": Entry(_installed("nvidia.nvimgcodec"), _nvimgcodec, True),
    "torchvision": Entry(_installed("torchvision"), _torchvision, True),
    "host": Entry(lambda: True, _host, False),
}


def decoder_names(on_gpu: bool = True, only_installed: bool = True) -> list[str]:
    """The decoders of :data:`GPU_DECODERS` that decode on the GPU (``on_gpu``; the host
    decoder otherwise) and, with ``only_installed``, whose library is installed here, in
    order of preference."""
    entries = {name: Entry(*entry) for name, entry in GPU_DECODERS.items()}
    return [name for name, entry in entries.items()
            if entry.on_gpu == on_gpu and (not only_installed or entry.installed())]


def make_decoder(name: str, device: Any) -> BatchDecoder:
    """The decoder ``name`` of :data:`GPU_DECODERS` on ``device``."""
    return Entry(*GPU_DECODERS[name]).make(torch.device(device))


# (name, maker, device) -> the decoder made there, or why it cannot decode there
_USABLE: dict[tuple[str, Any, str], BatchDecoder | str] = {}


def shared_decoder(name: str, device: Any) -> BatchDecoder:
    """The decoder ``name`` of :data:`GPU_DECODERS` on ``device``, made (and so checked)
    once per process, maker and device and then used by every job there, as a job's slides
    use it in turn: the one :func:`usable_gpu_decoder` made when the decoding was resolved.
    Each call decodes on the caller's current stream and hands back tensors the caller
    owns; the buffers a decoder keeps (nvImageCodec's output Images, torchvision's stream)
    are reused from call to call. One that cannot decode there raises
    :class:`GpuDecoderUnavailable`, each time with the line it raised when made."""
    key = _key(name, device)
    if key not in _USABLE:
        try:
            _USABLE[key] = make_decoder(name, device)
        except GpuDecoderUnavailable as exc:
            _USABLE[key] = str(exc)
            raise
    made = _USABLE[key]
    if isinstance(made, str):
        raise GpuDecoderUnavailable(made)
    return made


def usable_gpu_decoder(device: Any) -> str | None:
    """The first decoder of the table installed here that decodes JPEG on ``device``'s
    GPU (:func:`shared_decoder`: each made once per process and device, checking itself);
    one warning per decoder that cannot, naming what to install. None when none can."""
    for name in decoder_names():
        tried = _key(name, device) in _USABLE
        try:
            shared_decoder(name, device)
            return name
        except GpuDecoderUnavailable as exc:
            if not tried:
                log.warning("%s; decoding with the next decoder instead", exc)
    return None


def _key(name: str, device: Any) -> tuple[str, Any, str]:
    return name, Entry(*GPU_DECODERS[name]).make, _device_key(device)


def _device_key(device: Any) -> str:
    """``device`` as one name for the same GPU ("cuda" and "cuda:0" where 0 is current)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        try:
            return f"cuda:{torch.cuda.current_device()}"
        except (RuntimeError, AssertionError):  # no CUDA here (tests): the name as given
            pass
    return str(device)
