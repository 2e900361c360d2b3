"""One rule for ``--device auto|cpu|cuda`` in every command."""

from __future__ import annotations

from pathtwt.errors import ConfigError


def resolve_device(name: object = "auto") -> str:
    """A device name (or torch.device) as a string. ``auto`` -> CUDA (ROCm builds included)
    when visible, else CPU; ``cuda`` without a visible device is a one-line error rather
    than a failure deep inside torch."""
    import torch

    name = str(name)
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: no CUDA device is visible; use --device cpu or auto")
    return name


def native_bf16(device: object) -> bool:
    """Whether ``device`` computes bf16 natively (CUDA/ROCm GPUs that support it; CPUs with
    AVX512-BF16 or AMX). Elsewhere bf16 autocast is emulated and slower than fp32."""
    import torch

    name = str(device)
    if name.startswith("cuda"):
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if name == "cpu":
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as fh:
                flags = next((line for line in fh if line.startswith("flags")), "").split()
        except OSError:
            return False
        return "avx512_bf16" in flags or "amx_bf16" in flags
    return False


def resolve_training_precision(name: str, device: object) -> str:
    """``--precision auto|fp32|bf16`` of a training run: auto is bf16 where native."""
    if name == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if name not in ("fp32", "bf16"):
        raise ConfigError(f"--precision {name}: use auto, fp32 or bf16")
    return name
