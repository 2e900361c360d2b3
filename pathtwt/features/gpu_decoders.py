"""Batch JPEG decoders that run where the model runs: one table, one entry per decoder.

Each is made once per job for its device and called with a list of complete JPEG streams
(buffers into the ring); it gives, per stream, a uint8 (h, w, 3) tensor on the device, or
None for a stream it refuses (the caller decodes that one on the host, with one log line).

- ``nvimgcodec`` (NVIDIA nvImageCodec, ``nvidia-nvimgcodec-cu12`` / ``-cu13``): the
  choice where it is installed. It decodes a batch on the hardware JPEG engines of the
  A100, H100 and H200 (falling back to CUDA kernels elsewhere), is maintained, and also
  decodes JPEG 2000 on the GPU. Output is interleaved RGB, as the model's input is.
- ``torchvision``: ``torchvision.io.decode_jpeg(device="cuda")`` (nvJPEG through CUDA
  kernels, no hardware engine); deprecated since torchvision 0.29, kept for a CUDA
  machine without nvImageCodec.
- ``host``: libjpeg-turbo (imagecodecs) in the embedding process, the tiles then copied to
  the device. The stand-in that drives the whole device path on a CPU (the tests, the
  feed-rate benchmark), and what a GPU without a GPU decoder would use.

AMD GPUs (ROCm) have neither GPU decoder: ``auto`` keeps the CPU path there
(:func:`pathtwt.features.decoding.resolve_decode`).
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import torch

Decoder = Callable[[Sequence[Any]], list]


def _nvimgcodec(device: torch.device) -> Decoder:
    from nvidia import nvimgcodec

    index = device.index if device.index is not None else torch.cuda.current_device()
    decoder = nvimgcodec.Decoder(device_id=index)
    params = nvimgcodec.DecodeParams(color_spec=nvimgcodec.ColorSpec.RGB, allow_any_depth=False)

    def decode(streams: Sequence[Any]) -> list:
        stream = torch.cuda.current_stream(device).cuda_stream
        images = decoder.decode([np.frombuffer(s, np.uint8) for s in streams], params=params, cuda_stream=stream)
        return [None if image is None else torch.as_tensor(image, device=device) for image in images]

    return decode


def _torchvision(device: torch.device) -> Decoder:
    from torchvision.io import ImageReadMode, decode_jpeg

    def decode(streams: Sequence[Any]) -> list:
        data = [torch.frombuffer(bytearray(s), dtype=torch.uint8) for s in streams]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=UserWarning)  # its deprecation, said in the docs
            try:
                images = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
            except RuntimeError:
                # one bad stream fails the whole call: decode one by one to find it
                images = []
                for d in data:
                    try:
                        images.append(decode_jpeg(d, mode=ImageReadMode.RGB, device=device))
                    except RuntimeError:
                        images.append(None)
        return [None if im is None else im.permute(1, 2, 0) for im in images]

    return decode


def _host(device: torch.device) -> Decoder:
    from pathtwt.features.device_tiles import host_decode

    def decode(streams: Sequence[Any]) -> list:
        out = []
        for s in streams:
            try:
                out.append(torch.from_numpy(host_decode(s)).to(device))
            except Exception:  # noqa: BLE001 - refused: the caller tries again and names the tile
                out.append(None)
        return out

    decode.is_host = True  # type: ignore[attr-defined] - the reference other decoders are checked against
    return decode


def _installed(module: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False

    return check


# name -> (is it installed?, maker(device) -> decoder, needs CUDA), in order of preference
GPU_DECODERS: dict[str, tuple[Callable[[], bool], Callable[[torch.device], Decoder], bool]] = {
    "nvimgcodec": (_installed("nvidia.nvimgcodec"), _nvimgcodec, True),
    "torchvision": (_installed("torchvision"), _torchvision, True),
    "host": (lambda: True, _host, False),
}


def usable_gpu_decoder(cuda: bool) -> str | None:
    """The first decoder of the table installed here that decodes on the GPU (None when
    none does, or without CUDA)."""
    if not cuda:
        return None
    return next((name for name, (installed, _make, on_gpu) in GPU_DECODERS.items() if on_gpu and installed()), None)


def make_decoder(name: str, device: Any) -> Decoder:
    return GPU_DECODERS[name][1](torch.device(device))
