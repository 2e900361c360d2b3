"""The precision a distillation computes in: bf16 autocast or plain fp32, and the
teacher's targets under it (shared by the loop and its first-step bf16 check)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn


def autocast(device: str, precision: str) -> Any:
    """bf16 autocast on ``device``'s type, or nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def teacher_targets(objective: Any, teacher: nn.Module, x: torch.Tensor, precision: str) -> list[torch.Tensor]:
    """The teacher's targets (``objective.targets``) under inference mode (no autograd
    bookkeeping at all), returned as ordinary float32 tensors so the loss may save them
    for its backward pass."""
    with torch.inference_mode(), autocast(str(x.device), precision):
        targets = objective.targets(teacher, x)
    return [t.to(torch.float32, copy=True) for t in targets]
