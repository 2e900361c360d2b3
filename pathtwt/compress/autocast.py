"""The precision a distillation computes in: bf16 autocast or plain fp32 (on CPU with the
attention computed explicitly, as extraction does), and the teacher's targets under it
(shared by the loop, its first-step bf16 check and auditioning)."""

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


def bf16_attention(modules: list[nn.Module], device: str, precision: str) -> contextlib.ExitStack:
    """Within the block, bf16 on CPU computes the attention of ``modules`` explicitly: the
    fused kernel runs no faster in bf16 than in fp32 there, the explicit q @ k^T and @ v run
    on the bf16 matrix units (:mod:`pathtwt.models.cpu_attention`; a ViT-S distillation
    step 1.34x faster, ``benchmarks/cpu_precision.py``). Nothing changes in fp32 or on GPUs."""
    from pathtwt.models.cpu_attention import explicit_attention

    stack = contextlib.ExitStack()
    if precision == "bf16" and torch.device(device).type == "cpu":
        for module in modules:
            stack.enter_context(explicit_attention(module))
    return stack


def teacher_targets(objective: Any, teacher: nn.Module, x: torch.Tensor, precision: str) -> list[torch.Tensor]:
    """The teacher's targets (``objective.targets``) under inference mode (no autograd
    bookkeeping at all), returned as ordinary float32 tensors so the loss may save them
    for its backward pass."""
    with torch.inference_mode(), autocast(str(x.device), precision):
        targets = objective.targets(teacher, x)
    return [t.to(torch.float32, copy=True) for t in targets]
