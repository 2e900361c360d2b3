"""Where native tiles are decoded: the one resolver of ``--decode`` (``extract.decode``).

A request (auto, cpu, gpu) is resolved once, in the process that holds the model, before
any reading process starts:

- ``cpu``: the reading processes decode (tifffile's codecs, the libjpeg-turbo OpenSlide
  uses), cut and resize, and send finished tiles;
- ``gpu``: the reading processes send the compressed streams of JPEG-tiled levels and the
  embedding process decodes them on its GPU with the first decoder of
  :data:`pathtwt.features.gpu_decoders.GPU_DECODERS` installed here; slides whose read
  level is not JPEG-tiled still come as finished tiles.

``auto`` is ``gpu`` where the model runs on CUDA and a GPU decoder installed here decodes
JPEG on its GPU (each checks itself when it is made: nvImageCodec without its nvJPEG
extension is said in one line naming the pip command, and the next decoder is taken),
``cpu`` otherwise (a CPU, an AMD GPU: neither decoder runs on ROCm).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pathtwt.errors import ConfigError

DECODE_CHOICES = ("auto", "cpu", "gpu")


@dataclass(frozen=True)
class Decoding:
    where: str  # cpu | gpu
    decoder: str | None = None  # GPU_DECODERS's key for gpu

    def describe(self) -> str:
        return "CPU (reading processes)" if self.where == "cpu" else f"GPU ({self.decoder}, embedding process)"


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available()) and getattr(torch.version, "hip", None) is None
    except Exception:  # noqa: BLE001 - a broken CUDA install means no GPU decode, not a crash
        return False


def resolve_decode(request: str | None, device: Any = None) -> Decoding:
    """The decoding for ``request`` (auto, cpu, gpu; None is auto) with the model on
    ``device``. ``gpu`` where it cannot run is one line."""
    from pathtwt.features.gpu_decoders import INSTALL_GPU_DECODER, decoder_names, usable_gpu_decoder

    name = (request or "auto").strip().lower()
    if name not in DECODE_CHOICES:
        raise ConfigError(f"decode {request!r} is unknown; use one of {', '.join(DECODE_CHOICES)}")
    if name == "cpu":
        return Decoding("cpu")
    on_cuda = str(getattr(device, "type", device)).startswith("cuda")
    cuda = _cuda()
    if name == "auto":
        gpu = usable_gpu_decoder(device) if on_cuda and cuda else None
        return Decoding("gpu", gpu) if gpu else Decoding("cpu")
    if not cuda:
        raise ConfigError("decode gpu: CUDA is not available on this machine (an AMD GPU decodes on the CPU); "
                          "use --decode cpu or auto")
    if not on_cuda:
        raise ConfigError(f"decode gpu: the model runs on {device}, not CUDA; use --device cuda or --decode auto")
    gpu = usable_gpu_decoder(device)
    if gpu is None:
        installed = decoder_names()
        why = f"{', '.join(installed)} cannot (said above)" if installed else "none is installed"
        raise ConfigError(f"decode gpu: no GPU JPEG decoder decodes on {device} here ({why}; {INSTALL_GPU_DECODER}); "
                          "use --decode cpu or auto")
    return Decoding("gpu", gpu)
