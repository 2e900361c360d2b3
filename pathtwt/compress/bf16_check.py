"""The distillation's bf16 guard: the first step's loss under bf16 autocast against fp32.

Extraction keeps bf16 only when its first tiles' embeddings agree with fp32 ones
(``pathtwt.models.bf16_guard``); this is the same guard for training. On the
first micro-batch, before any update, the objective's loss is computed twice, teacher
targets and student forward both in fp32 and both under bf16 autocast. bf16 is kept when
the two losses differ by at most ``tolerance`` relative to the fp32 loss; otherwise the
run trains in fp32 and says so in the log. No gradient is computed and no parameter
changes, so the check does not alter the run it guards.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from torch import nn

# the largest relative difference between the first step's bf16 and fp32 losses that
# keeps bf16 (bf16 keeps 8 bits of mantissa: a few 1e-3 per value, averaged in the MSE)
BF16_LOSS_TOLERANCE = 0.02

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Bf16Check:
    precision: str  # "bf16" (kept) or "fp32" (fell back)
    loss_fp32: float
    loss_bf16: float
    relative_difference: float
    note: str


def check_bf16_first_step(student: nn.Module, teacher: nn.Module, x: torch.Tensor, objective,
                          tolerance: float = BF16_LOSS_TOLERANCE, step: int = 0,
                          targets: list[torch.Tensor] | None = None) -> Bf16Check:
    """Compare the first-step loss of ``objective`` (``targets(teacher, x)`` and
    ``loss(student, x, targets, step)``, as the distillation loop computes them)
    in fp32 and under bf16 autocast on the batch ``x``; see the module docstring.
    ``targets``: the fp32 targets of ``x`` the loop will train on whatever its precision
    (its target cache from the teacher's shared outputs); then only the student's side
    differs between the two losses, as it does in the loop."""
    from pathtwt.compress.autocast import teacher_targets

    device_type = x.device.type
    was_training = student.training
    losses = {}
    try:
        with torch.no_grad():
            for precision in ("fp32", "bf16"):
                used = targets if targets is not None else teacher_targets(objective, teacher, x, precision)
                amp = torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=precision == "bf16")
                with amp:
                    loss, _terms = objective.loss(student, x, used, step)
                losses[precision] = float(loss.float())
    finally:
        student.train(was_training)
    ref, low = losses["fp32"], losses["bf16"]
    rel = abs(low - ref) / max(abs(ref), 1e-12)
    measured = f"first-step loss bf16 {low:.6g} vs fp32 {ref:.6g} (relative difference {rel:.3g})"
    if math.isfinite(low) and math.isfinite(rel) and rel <= tolerance:
        log.info("bf16 autocast kept: %s <= %s", measured, tolerance)
        return Bf16Check("bf16", ref, low, rel, f"bf16 autocast kept: first-step loss within {tolerance} of fp32")
    log.warning("distillation falls back to fp32: %s > %s", measured, tolerance)
    return Bf16Check("fp32", ref, low, rel, f"fell back to fp32: first-step bf16 loss differs from fp32 by more than {tolerance}")
