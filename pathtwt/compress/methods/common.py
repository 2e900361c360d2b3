"""What the methods add to the shared route (:mod:`pathtwt.compress.pipeline`): short side
runs of the distillation loop (Raptor's stage 1, the subset search's candidate scoring),
the selection score, and untying students whose weights are tied for export.

Every method is judged like TWT (:mod:`pathtwt.compress.fidelity`): centred fidelity of
its tile embedding to the teacher's on the calibration set's report tiles. Choices a
method makes are scored on the select tiles only (:func:`select_r2`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import TYPE_CHECKING, Iterator

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:
    from pathtwt.compress.calibration import CalibrationSet
    from pathtwt.compress.distill import DistillOptions
    from pathtwt.compress.pipeline import CompressOptions
    from pathtwt.models.registry import Backbone


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Layers a method adds drawn from ``seed``, the global RNG left as it was: Raptor's
    time scales, WDPruning's probe and TWT's random surrogates are the same for the same
    ``--seed``, so the exported file is too."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield


def selection_tiles(calib: CalibrationSet) -> tuple[str, np.ndarray]:
    """(split name, tiles) on which a method scores its candidates: the calibration set's
    ``select`` split where it has one, else its fit tiles."""
    return calib.choosing_split(), calib.choosing_tiles()


def embedding_r2(student_emb: torch.Tensor, teacher_emb: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Centred fidelity of tile embeddings (N, E): overall R^2 = 1 - SS_res / SS_tot over
    all channels, and the per-channel R^2 (E,). SS_tot is the teacher's spread about its own
    mean, so a student that outputs the teacher's mean embedding scores 0, not ~1."""
    t = teacher_emb.double()
    res = ((student_emb.double() - t) ** 2).sum(dim=0)
    tot = ((t - t.mean(dim=0)) ** 2).sum(dim=0).clamp_min(1e-12)
    return float(1 - res.sum() / tot.sum()), 1 - res / tot


def side_run_options(options: CompressOptions, *, steps: int, augment: bool | None = None,
                     seed_offset: int = 0) -> DistillOptions:
    """Loop options for a run that is not the method's main distillation: no checkpoint
    (the main run's file must not be mixed up with it), no progress bar."""
    from pathtwt.compress.pipeline import distill_options

    base = distill_options(options)
    return dataclasses.replace(base, steps=int(steps), epochs=None, checkpoint=None, stop_after=None, progress=False,
                               augment=base.augment if augment is None else bool(augment), seed=base.seed + seed_offset)


def variant_name(teacher: Backbone, method: str, n: int) -> str:
    """``<backbone>/<method>-<n>`` where the exported depth is not the number that names the
    variant (NOSE: layers keeping attention; Raptor: distinct shared layers)."""
    return f"{teacher.spec.base_backbone or teacher.spec.name}/{method}-{int(n)}"


def untied_copy(model: nn.Module) -> nn.Module:
    """A copy in which every block is its own module (tied blocks duplicated), so the
    state dict holds plain tensors that safetensors and timm accept."""
    out = copy.deepcopy(model)
    out.blocks = nn.Sequential(*(copy.deepcopy(b) for b in model.blocks))
    return out


def select_r2(student: nn.Module, teacher: Backbone, calib: CalibrationSet, options: CompressOptions) -> float:
    """The score every choice is made by: embedding R^2 on the select tiles (never report)."""
    from pathtwt.compress.fidelity import measure

    return float(measure(student, teacher, calib, on="select", device=options.distill.device, batch_size=options.forward_batch)["r2"])
