"""Distillation's bf16 guard: bf16 autocast is kept for a run only when the first step's
loss under it agrees with the fp32 loss.

:func:`check_bf16_first_step` computes the first step's loss twice, teacher targets and
student forward both in fp32 and both under bf16 autocast, and keeps bf16 when the two
differ by at most ``tolerance`` relative to fp32. No gradient is computed and no parameter
changes, so the check does not alter the run it guards. :func:`check_bf16` runs it on the
first training tiles in index order, the same on every rank and on a resumed run.
Inference has its own guard on the first tiles' embeddings
(:func:`pathtwt.models.bf16_guard.check_bf16_on`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from pathtwt.compress.distill_options import BF16_LOSS_TOLERANCE
from pathtwt.compress.intermediates import tiles_to_batch
from pathtwt.compress.side_passes import named_out_of_memory, rank_batch
from pathtwt.compress.targets import teacher_targets

if TYPE_CHECKING:
    from pathtwt.compress.distill_options import DistillOptions, Objective, Transform
    from pathtwt.compress.targets import TargetCache

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
    in fp32 and under bf16 autocast on the batch ``x``; see the module doc.
    ``targets``: the fp32 targets of ``x`` the loop will train on whatever its precision
    (its target cache from the teacher's shared outputs); then only the student's side
    differs between the two losses, as it does in the loop."""
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


def first_step_precision(student: nn.Module, teacher: nn.Module, source: Any, transform: Transform, objective: Objective,
                options: DistillOptions, shared: "TargetCache | None" = None) -> dict[str, Any]:
    """bf16 or fp32 for this run, from the first step's loss on the first training tiles in
    index order, a rank's micro-batch of them (the same tiles on every rank and on a
    resumed run, so the choice is the same everywhere); every rank falls back when one does."""
    from pathtwt.compress import ranks

    n = min(len(source), rank_batch(options.batch_size))
    with named_out_of_memory("the bf16 first-step check", n, skip="--precision fp32 (no check)"):
        x = tiles_to_batch(transform, np.stack([source.read(j) for j in range(n)]), options.device)
        targets = None if shared is None else shared.get(torch.arange(n), options.device)
        check = check_bf16_first_step(student, teacher, x, objective, tolerance=options.bf16_tolerance, targets=targets)
    kept = float(ranks.all_mean(torch.tensor([1.0 if check.precision == "bf16" else 0.0], dtype=torch.float64))[0]) == 1.0
    return {**asdict(check), "precision": "bf16" if kept else "fp32", "tolerance": options.bf16_tolerance, "tiles": n}
