"""Where native tiles are decoded: the one resolver of ``--decode`` (``extract.decode``).

A request (auto, cpu, gpu) is resolved once, in the process that holds the model, into a
decoder name (:data:`DECODERS`'s key) that travels to the reading processes as it is, so
no reading process probes CUDA again. The names:

- ``cpu``: tifffile's own codecs (:func:`pathtwt.wsi.native_tiles.decode_native_tiles`),
  the same libjpeg-turbo OpenSlide uses.
- ``gpu``: a batch of a page's JPEG streams decoded by nvJPEG
  (:func:`pathtwt.wsi.jpeg_tiles.gpu_decoder`); pages that are not JPEG-tiled, and
  streams nvJPEG refuses, are decoded on the CPU with one log line per page.

CUDA cannot start in a forked process, so reading processes that decode on the GPU are
spawned (:func:`worker_context`).
"""

from __future__ import annotations

import importlib.util
from typing import Any, Callable

from pathtwt.errors import ConfigError

DECODE_CHOICES = ("auto", "cpu", "gpu")


def _cpu_decoder() -> Callable:
    from pathtwt.wsi.native_tiles import decode_native_tiles

    return decode_native_tiles


def _gpu_decoder() -> Callable:
    from pathtwt.wsi.jpeg_tiles import gpu_decoder

    return gpu_decoder


# decoder name -> a function that gives the decoder (imported on use: the GPU one needs torchvision)
DECODERS: dict[str, Callable[[], Callable]] = {"cpu": _cpu_decoder, "gpu": _gpu_decoder}


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken CUDA install means no GPU decode, not a crash
        return False


def _gpu_decoder_installed() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def resolve_decode(request: str | None, device: Any = None) -> str:
    """The decoder name for ``request`` (auto, cpu, gpu; None is cpu) with the model on
    ``device`` (None: not known). ``auto`` is ``gpu`` where the model runs on CUDA and a
    GPU decoder is installed, ``cpu`` otherwise; ``gpu`` where it cannot run is one line."""
    name = (request or "cpu").strip().lower()
    if name not in DECODE_CHOICES:
        raise ConfigError(f"decode {request!r} is unknown; use one of {', '.join(DECODE_CHOICES)}")
    if name == "cpu":
        return "cpu"
    on_cuda = device is None or str(getattr(device, "type", device)).startswith("cuda")
    usable = _cuda() and _gpu_decoder_installed()
    if name == "auto":
        return "gpu" if on_cuda and usable else "cpu"
    if not _cuda():
        raise ConfigError("decode gpu: CUDA is not available on this machine; use --decode cpu or auto")
    if not _gpu_decoder_installed():
        raise ConfigError("decode gpu: no GPU JPEG decoder (torchvision) is installed here; use --decode cpu or auto")
    if not on_cuda:
        raise ConfigError(f"decode gpu: the model runs on {device}, not CUDA; use --device cuda or --decode auto")
    return "gpu"


def decoder(name: str) -> Callable:
    """The decoder a resolved ``name`` stands for (``decoder(page, indices)``)."""
    try:
        return DECODERS[name]()
    except KeyError:
        raise ConfigError(f"decode {name!r} is unknown; use one of {', '.join(DECODERS)}") from None


def worker_context(name: str, workers: int) -> str | None:
    """The multiprocessing start method of reading processes that decode with ``name``:
    "spawn" for the GPU decoder (CUDA cannot start in a forked process), else the default."""
    return "spawn" if name == "gpu" and workers > 0 else None
