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
