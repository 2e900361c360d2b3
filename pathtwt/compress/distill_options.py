"""What the distillation loop is given: its options (:class:`DistillOptions`, one object
built once per run and passed down), the tile transform and the objective protocol every
method's loss follows. Apart from the loop so that the modules it calls (the targets, the
bf16 guard) can name them without importing the loop."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch
from torch import nn

from pathtwt.compress.defaults import COMPRESS_DEFAULTS as D

# bf16 is kept only when the first step's bf16 loss is within this relative difference of
# the fp32 loss (bf16 keeps 8 bits of mantissa: a few 1e-3 per value, averaged in the MSE)
BF16_LOSS_TOLERANCE = 0.02


Transform = Callable[[np.ndarray], torch.Tensor]


@dataclass
class DistillOptions:
    steps: int | None = D.steps  # optimiser steps; None: derived from epochs
    epochs: float | None = D.epochs  # passes over the training tiles (used when steps is None)
    batch_size: int = D.batch_size  # global micro-batch, split over the ranks
    accumulate: int = D.accumulate  # micro-batches per optimiser step (effective batch = batch_size x accumulate)
    lr: float = D.lr  # peak learning rate (the paper's)
    weight_decay: float = 0.05
    warmup_steps: int = D.warmup_steps
    grad_clip: float = 1.0
    augment: bool = D.augment  # colour jitter + Gaussian blur; off allows caching teacher targets
    seed: int = D.seed
    device: str = "cpu"
    # fp32 | bf16 (autocast; master weights and optimiser state stay fp32): the resolved
    # value, "auto" decided once where the run starts (cli/compress.py)
    precision: str = "fp32"
    workers: int = 0  # DataLoader workers reading and resizing tiles (augmentation runs on the device)
    checkpoint: Path | None = None  # file; resumed from when it exists
    checkpoint_every: int = D.checkpoint_every
    stop_after: int | None = None  # stop after this step as if interrupted (checkpoint kept)
    progress: bool = True
    cache_limit_bytes: int = 4 * 2**30  # largest in-memory teacher-target cache
    # "variance": each loss term divided by its teacher target's variance on the first
    # training tiles (term ~ 1 - R^2, so layers whose norms grow ~30x do not drown the
    # early ones); "none": plain MSE sums (the paper's loss)
    loss_norm: str = D.loss_norm
    # bf16 is kept only when the first step's loss under bf16 autocast is within this
    # relative difference of the fp32 loss (pathtwt.compress.bf16_step.check_bf16_first_step), else fp32
    bf16_tolerance: float = BF16_LOSS_TOLERANCE

    def resolved_steps(self, n_tiles: int) -> int:
        if self.steps is not None:
            return int(self.steps)
        epochs = 1.0 if self.epochs is None else float(self.epochs)
        return max(1, math.ceil(epochs * n_tiles / self.effective_batch))

    @property
    def effective_batch(self) -> int:
        return max(1, int(self.batch_size)) * max(1, int(self.accumulate))


class Objective(Protocol):
    def targets(self, teacher: nn.Module, x: torch.Tensor) -> list[torch.Tensor]: ...

    def loss(self, student: nn.Module, x: torch.Tensor, targets: list[torch.Tensor], step: int) -> tuple[torch.Tensor, dict[str, "torch.Tensor | float"]]: ...
