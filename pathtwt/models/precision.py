"""What a run computes in, decided in one place for every command.

``--precision auto|fp32|bf16|fp16`` meets a device and, for inference, the backbone's
default precision (the registry's ``default_precision``, fp32 for every shipped backbone):

* inference (``extract``, ``probe``, and the ``auto`` of :func:`create_backbone`): where the
  device computes bf16 natively, ``auto`` keeps fp32 weights under bf16 autocast, kept for
  the run only when its first tiles agree with fp32 ones
  (:func:`pathtwt.models.bf16_guard.check_bf16_on`); elsewhere the backbone's default.
  ``fp32``, ``bf16``, ``fp16``: the weights are cast (fp16 only on a GPU).
* training (``compress``): ``auto`` is bf16 autocast where native, fp32 elsewhere; weights
  and optimiser state stay fp32, and the first step's loss decides whether bf16 is kept
  (:func:`pathtwt.compress.bf16_step.check_bf16_first_step`).
* a teacher (``discover``, the ``compress`` teacher, fidelity) is loaded with ``fp32``: its
  outputs are the reference everything else is measured against.

"Native" excludes emulation: a V100 or T4 runs bf16 autocast through fp32 units, slower
than fp32 itself, so there ``auto`` means fp32. On CUDA GPUs of compute capability 8.0
and later, fp32 matrix multiplies and convolutions use TF32 (:func:`choose_fp32_matmul`),
which every run that records its precision also records.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from pathtwt.errors import ConfigError

INFERENCE_REQUESTS = ("auto", "fp32", "bf16", "fp16")
TRAINING_REQUESTS = ("auto", "fp32", "bf16")
# the first CUDA compute capability with bf16 and TF32 tensor cores (Ampere)
NATIVE_BF16_CAPABILITY = (8, 0)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Precision:
    """The outcome of :func:`resolve_precision`: the dtype the weights are cast to and
    whether the run computes under bf16 autocast over them (``autocast``, always with fp32
    weights; subject to the run's bf16 guard)."""

    weights: str  # fp32 | bf16 | fp16
    autocast: bool = False

    @property
    def compute(self) -> str:
        """What the matrix multiplies run in: bf16 under autocast, else the weights' dtype."""
        return "bf16" if self.autocast else self.weights


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return set(next((line for line in fh if line.startswith("flags")), "").split())
    except OSError:
        return set()


def _cuda_capability(device: object) -> tuple[int, int] | None:
    """(major, minor) of the CUDA device ``device`` names; None without CUDA or on ROCm."""
    import torch

    if not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        return None
    name = str(device)
    index = int(name[5:]) if name.startswith("cuda:") else torch.cuda.current_device()
    return tuple(torch.cuda.get_device_capability(index))


def native_bf16(device: object) -> bool:
    """Whether ``device`` computes bf16 natively: CUDA GPUs of compute capability 8.0 and
    later (not the emulated bf16 that ``torch.cuda.is_bf16_supported()`` also accepts by
    default), ROCm GPUs, and CPUs with AVX512-BF16 or AMX. Elsewhere bf16 autocast is
    slower than fp32."""
    import torch

    name = str(device)
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            return False
        if getattr(torch.version, "hip", None):
            return True  # every ROCm GPU torch supports (MI100 and later) has bf16 units
        capability = _cuda_capability(name)
        return capability is not None and capability >= NATIVE_BF16_CAPABILITY
    if name == "cpu":
        flags = _cpu_flags()
        return ("avx512_bf16" in flags or "amx_bf16" in flags) and not _cpu_isa_capped()
    return False


# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) that still reach AVX512-BF16 or AMX instructions
_BF16_ISAS = {"ALL", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512",
              "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2"}


def _cpu_isa_capped() -> bool:
    """Whether the process holds its kernels below the CPU's bf16 instructions: oneDNN's
    ``ONEDNN_MAX_CPU_ISA`` below AVX512-BF16, or torch's ``ATEN_CPU_CAPABILITY`` below
    AVX512. bf16 is then emulated and slower than fp32, as on an AVX2-only CPU."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    return bool(isa and isa not in _BF16_ISAS) or aten in {"default", "avx2"}


def resolve_precision(request: str, device: object, *, default: str = "fp32", training: bool = False) -> Precision:
    """The one rule for ``--precision``; see the module doc. ``default``: the backbone's
    default precision (inference only)."""
    allowed = TRAINING_REQUESTS if training else INFERENCE_REQUESTS
    if request not in allowed:
        raise ConfigError(f"--precision {request}: use {', '.join(allowed)}")
    if training:
        compute = ("bf16" if native_bf16(device) else "fp32") if request == "auto" else request
        return Precision(weights="fp32", autocast=compute == "bf16")
    if request == "auto" and native_bf16(device):
        return Precision(weights="fp32", autocast=True)
    choice = default if request == "auto" else request
    if choice not in INFERENCE_REQUESTS[1:]:
        raise ConfigError(f"default precision {choice!r} of the backbone: expected fp32, bf16 or fp16")
    if choice == "fp16" and not str(device).startswith("cuda"):
        raise ConfigError("--precision fp16 needs --device cuda; use fp32 or bf16 on CPU")
    return Precision(weights=choice)


# set by pin_fp32_matmul: what fp32 matmuls compute in for the rest of the process, whatever
# a later choose_fp32_matmul (every create_backbone) would pick
_pinned_fp32_matmul: str | None = None


def _set_fp32_matmul(mode: str) -> None:
    """torch's switches for fp32 matmuls and convolutions to ``mode`` (ieee | tf32), set so
    that every reader of them agrees.

    torch >= 2.9 keeps two records of the TF32 switch: the legacy one (``allow_tf32``,
    ``torch.get_float32_matmul_precision()``) and ``fp32_precision``. The legacy setters
    write both records; ``fp32_precision``'s setter writes only its own, after which every
    legacy getter raises ("mix of the legacy and new APIs"). torch's own compiler reads the
    legacy ones (torch 2.14: inductor's autotuning keys call
    ``torch.get_float32_matmul_precision()`` in ``select_algorithm.create_precompile_key``
    and ``codecache``, dynamo's graph deduplication ``torch._C._get_cublas_allow_tf32()``),
    as may any library. So the switch is set only through the legacy setters, and read only
    through :func:`_tf32_switches`, which never raises."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = mode == "tf32"


def _tf32_switches() -> dict[str, str]:
    """What the matmul and convolution switches say now (``tf32`` or ``ieee``), read through
    ``fp32_precision`` where torch has it (it never raises), else ``allow_tf32``."""
    import torch

    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    if hasattr(matmul, "fp32_precision"):
        return {"matmul": "tf32" if matmul.fp32_precision == "tf32" else "ieee",
                "conv": "tf32" if cudnn.conv.fp32_precision == "tf32" else "ieee"}
    return {"matmul": "tf32" if matmul.allow_tf32 else "ieee", "conv": "tf32" if cudnn.allow_tf32 else "ieee"}


def fp32_matmul_in_effect(device: object) -> dict[str, str]:
    """What fp32 matrix multiplies and convolutions compute in on ``device`` now: the
    switches on CUDA GPUs that have TF32 units (compute capability 8.0 and later), ``ieee``
    elsewhere (CPUs, ROCm, older GPUs), whatever the switches say. Part of every cached
    value's key (:func:`pathtwt.compress.teacher_cache.teacher_identity`)."""
    return _tf32_switches() if _has_tf32(device) else {"matmul": "ieee", "conv": "ieee"}


def _has_tf32(device: object) -> bool:
    """Whether ``device`` is a CUDA GPU with TF32 units (compute capability 8.0 and later)."""
    capability = _cuda_capability(device) if str(device).startswith("cuda") else None
    return capability is not None and capability >= NATIVE_BF16_CAPABILITY


def pin_fp32_matmul(mode: str) -> None:
    """Fix what fp32 matmuls compute in for this process (``ieee``: a benchmark's fp32 rows
    measure fp32), so that the backbones built afterwards keep it."""
    global _pinned_fp32_matmul
    if mode not in ("ieee", "tf32"):
        raise ValueError(f"fp32 matmul mode {mode!r}: ieee or tf32")
    _set_fp32_matmul(mode)
    _pinned_fp32_matmul = mode


def choose_fp32_matmul(device: object) -> str:
    """Set, for this process, what fp32 matrix multiplies and convolutions compute in on
    ``device``, and return it: ``tf32`` on CUDA GPUs of compute capability 8.0 and later
    (10-bit mantissa products with fp32 accumulation, several times the fp32 rate; finer
    than the bf16 autocast that ``auto`` already accepts), ``ieee`` elsewhere (CPUs and
    ROCm keep full fp32). Chosen explicitly rather than left to torch's default, which
    has changed between releases; a mode pinned by :func:`pin_fp32_matmul` wins."""
    if _pinned_fp32_matmul is not None:
        return _pinned_fp32_matmul
    if not _has_tf32(device):
        return "ieee"
    _set_fp32_matmul("tf32")
    log.info("fp32 matrix multiplies on %s use TF32", device)
    return "tf32"


class exact_fp32:
    """Within the block, float32 arithmetic on ``device`` is IEEE fp32 whatever precision the
    run's forward passes compute in: autocast off for ``device``'s type and, on a CUDA GPU
    where fp32 matmuls use TF32, TF32 off for the matmuls dispatched inside; both restored
    after. For pixels, which are data, not model arithmetic: extraction's cut, resize and
    normalisation on the device run inside it, though the loop around them runs under the
    job's bf16 autocast.

    Why both switches: torch's autocast lists ``matmul`` among its lower-precision ops on
    CUDA and on CPU (``aten/src/ATen/autocast_mode.cpp``: ``KERNEL_CUDA(matmul,
    lower_precision_fp)``, ``KERNEL_CPU(matmul, lower_precision_fp)``), so a resize's two
    matrix products would run in bf16 (a 267 -> 224 shrink then moves 16 % of pixels by up to
    2 grey levels); and TF32 products move a few per cent of pixels by one. The TF32 switch is
    process-wide but read when a product is dispatched (``getCurrentCUDABlasHandle`` in
    ``aten/src/ATen/cuda/CublasHandlePool.cpp`` sets the handle's math mode from
    ``allowTF32CuBLAS()`` at each call), so the forward passes dispatched outside the block
    keep it. A class, not a generator: it is entered for every
    batch, and costs the host a few microseconds."""

    __slots__ = ("kind", "_autocast", "_tf32")

    def __init__(self, device: object) -> None:
        import torch

        self.kind = torch.device(device).type
        self._autocast = None
        self._tf32 = False

    def __enter__(self) -> "exact_fp32":
        import torch

        if self.kind in ("cuda", "cpu") and torch.is_autocast_enabled(self.kind):
            self._autocast = torch.autocast(device_type=self.kind, enabled=False)
            self._autocast.__enter__()
        # set through the legacy setter only, as _set_fp32_matmul says why
        self._tf32 = self.kind == "cuda" and _tf32_switches()["matmul"] == "tf32"
        if self._tf32:
            torch.backends.cuda.matmul.allow_tf32 = False
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        if self._tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            self._tf32 = False
        if self._autocast is not None:
            autocast, self._autocast = self._autocast, None
            autocast.__exit__(*exc)
