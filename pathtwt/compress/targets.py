"""Where distillation's teacher targets come from, and how they are computed: in
inference mode, in the run's precision, as float32 tensors the loss may keep.

The source is decided once per run, before the bf16 check (:func:`target_source`): the
teacher's shared fp32 layer outputs (:mod:`pathtwt.compress.teacher_cache`), a cache of
every in-memory tile's targets computed once in a fixed order (:class:`TargetCache`), or
a teacher pass per step (augmentation, streamed tiles, or targets above the cache limit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
from torch import nn

from pathtwt.compress.intermediates import tiles_to_batch
from pathtwt.models.bf16_guard import autocast

if TYPE_CHECKING:
    from pathtwt.compress.distill_options import DistillOptions, Objective, Transform


def teacher_targets(objective: Any, teacher: nn.Module, x: torch.Tensor, precision: str) -> list[torch.Tensor]:
    """The teacher's targets (``objective.targets``) in ``precision`` under inference mode
    (no autograd bookkeeping at all), returned as ordinary float32 tensors so the loss may
    save them for its backward pass."""
    with torch.inference_mode(), autocast(str(x.device), precision):
        targets = objective.targets(teacher, x)
    return [t.to(torch.float32, copy=True) for t in targets]


class TargetCache:
    """Teacher targets of every in-memory tile, computed once in a fixed order (so the
    values do not depend on when a run was resumed), kept in memory."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors

    @classmethod
    def build(cls, teacher: nn.Module, tiles: np.ndarray, *, transform: Transform, objective: Objective, device: str,
              chunk: int, precision: str) -> "TargetCache":
        parts: list[list[torch.Tensor]] = []
        for i in range(0, len(tiles), chunk):
            x = tiles_to_batch(transform, tiles[i : i + chunk], device)
            parts.append([t.cpu() for t in teacher_targets(objective, teacher, x, precision)])
        return cls([torch.cat(list(col)) for col in zip(*parts)])

    @classmethod
    def from_outputs(cls, teacher: nn.Module, outputs: Sequence[torch.Tensor], *, objective: Objective,
                     n_tiles: int, device: str, chunk: int) -> "TargetCache":
        """The targets of the first ``n_tiles`` tiles from the teacher's layer outputs of
        them, already computed (in fp32) for auditioning: no forward pass."""
        parts: list[list[torch.Tensor]] = []
        with torch.inference_mode():
            for i in range(0, n_tiles, chunk):
                outs = [o[i : min(n_tiles, i + chunk)].to(device) for o in outputs]
                parts.append([t.to("cpu", torch.float32, copy=True) for t in objective.targets_from_outputs(teacher, outs)])
        return cls([torch.cat(list(col)) for col in zip(*parts)])

    def get(self, idx: torch.Tensor, device: str) -> list[torch.Tensor]:
        return [t.index_select(0, idx.cpu()).to(device) for t in self.tensors]


def estimate_target_bytes(teacher: nn.Module, tiles: np.ndarray, transform: Transform, objective: Objective, device: str) -> int:
    probe = teacher_targets(objective, teacher, tiles_to_batch(transform, tiles[:1], device), "fp32")
    return sum(t.numel() * 4 for t in probe) * len(tiles)


TARGET_SOURCES = ("shared outputs", "target cache", "teacher pass per step")


def target_source(teacher: nn.Module, tiles: Any, transform: Transform, objective: Objective, options: DistillOptions,
                   teacher_outputs: Sequence[torch.Tensor] | None) -> str:
    """Where the loop's teacher targets come from, decided once before the bf16 check: the
    teacher's shared fp32 outputs (in-memory tiles without augmentation that they cover), a
    cache of every in-memory tile's targets computed once (without augmentation), or a
    teacher pass per step (augmentation, streamed tiles, or targets above the cache limit)."""
    if not isinstance(tiles, np.ndarray) or options.augment:
        return TARGET_SOURCES[2]
    if estimate_target_bytes(teacher, tiles, transform, objective, options.device) > options.cache_limit_bytes:
        return TARGET_SOURCES[2]
    if teacher_outputs is not None and len(teacher_outputs[0]) >= len(tiles) and hasattr(objective, "targets_from_outputs"):
        return TARGET_SOURCES[0]
    return TARGET_SOURCES[1]
