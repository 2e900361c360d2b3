"""What the comparison methods add to the shared compression machinery
(:mod:`pathtwt.compress.registry`): short side runs of the distillation loop (Raptor's
stage 1, the subset search's candidate scoring), the selection score, and export of
students whose weights are tied.

Every method is judged like TWT (:mod:`pathtwt.compress.fidelity`): centred fidelity of
its tile embedding to the teacher's on the calibration set's report tiles. Choices a
method makes are scored on the select tiles only (:func:`select_r2`).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn


def selection_tiles(calib: Any) -> tuple[str, Any]:
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


def fit_steps(options: Any, n_fit: int) -> int:
    """The method's full distillation budget in optimiser steps (``--steps`` or ``--epochs``)."""
    from pathtwt.compress.pipeline import distill_options

    return distill_options(options).resolved_steps(n_fit)


def side_run_options(options: Any, *, steps: int, augment: bool | None = None, seed_offset: int = 0) -> Any:
    """Loop options for a run that is not the method's main distillation: no checkpoint
    (the main run's file must not be mixed up with it), no progress bar."""
    from pathtwt.compress.pipeline import distill_options

    base = distill_options(options)
    return dataclasses.replace(base, steps=int(steps), epochs=None, checkpoint=None, stop_after=None, progress=False,
                               augment=base.augment if augment is None else bool(augment), seed=base.seed + seed_offset)


def variant_name(teacher: Any, method: str, n: int) -> str:
    """``<backbone>/<method>-<n>`` where the exported depth is not the number that names the
    variant (NOSE: layers keeping attention; Raptor: distinct shared layers)."""
    return f"{teacher.spec.base_backbone or teacher.spec.name}/{method}-{int(n)}"


def untied_copy(model: nn.Module) -> nn.Module:
    """A copy in which every block is its own module (tied blocks duplicated), so the
    state dict holds plain tensors that safetensors and timm accept."""
    out = copy.deepcopy(model)
    out.blocks = nn.Sequential(*(copy.deepcopy(b) for b in model.blocks))
    return out


def report_fidelity(student: nn.Module, teacher: Any, calib: Any, options: Any,
                    boundaries: list[int] | None = None) -> dict[str, Any]:
    """The shared fidelity record on the report tiles (fit tiles if the set holds none out)."""
    from pathtwt.compress.fidelity import measure

    return measure(student, teacher, calib, on="report", boundaries=boundaries, device=options.device,
                   batch_size=options.batch_size)


def select_r2(student: nn.Module, teacher: Any, calib: Any, options: Any) -> float:
    """The score every choice is made by: embedding R^2 on the select tiles (never report)."""
    from pathtwt.compress.fidelity import measure

    return float(measure(student, teacher, calib, on="select", device=options.device, batch_size=options.batch_size)["r2"])


@torch.no_grad()
def export_with_fidelity(student: nn.Module, *, teacher: Any, calib: Any, options: Any, method: str, extra: dict[str, Any],
                         initial: dict[str, Any] | None = None, layer_patches: dict[str, Any] | None = None,
                         selection_split: str | None = None, trains: bool = True,
                         boundaries: list[int] | None = None) -> Path:
    """Measure report fidelity and write the variant folder through the shared exporter.
    ``initial`` is the fidelity before training (None: the method does not train, so the
    final numbers are also the initial ones). ``selection_split`` names the split the
    method chose anything on (None: it chose nothing from data)."""
    from pathtwt.compress.export import export_backbone
    from pathtwt.compress.fidelity import fidelity_record
    from pathtwt.compress.pipeline import budget_record, training_record
    from pathtwt.compress.ranks import is_writer

    student.eval()
    if not is_writer():
        return Path(options.out)  # rank 0 measures and writes
    final = report_fidelity(student, teacher, calib, options, boundaries)
    record = fidelity_record(teacher, calib, initial=final if initial is None else initial, final=final,
                             device=options.device, batch_size=options.batch_size, seed=options.seed)
    return export_backbone(
        options.out, student, teacher=teacher, method=method, layer_patches=layer_patches,
        calibration_sources=list(getattr(calib, "sources", [])), options=options.to_dict(),
        extra={**extra, "fidelity": record, "training": training_record(calib),
               "budget": budget_record(method, options, len(calib.fit), teacher.spec, trains=trains),
               "selection_split": selection_split},
    )


def distill_main(student: nn.Module, *, teacher: Any, calib: Any, options: Any, objective: Any, description: str,
                 steps: int | None = None) -> Any:
    """The method's main distillation (checkpointed and resumable like TWT's); returns the
    loop's result, whose ``completed`` is False when ``--stop-after`` ended it early."""
    from pathtwt.compress.distill import distill
    from pathtwt.compress.pipeline import distill_options

    dopts = distill_options(options)
    if steps is not None:
        dopts = dataclasses.replace(dopts, steps=int(steps), epochs=None)
    from pathtwt.compress.pipeline import training_tiles

    return distill(student, teacher.model, training_tiles(calib), transform=teacher.transform, objective=objective, options=dopts,
                   description=description)


def n_training(calib: Any) -> int:
    """How many tiles the main distillation trains on (what epochs count)."""
    from pathtwt.compress.pipeline import training_tiles

    return len(training_tiles(calib))


def drop_checkpoint(options: Any) -> None:
    from pathtwt.compress.ranks import is_writer

    if not options.keep_checkpoint and is_writer():
        options.checkpoint_path().unlink(missing_ok=True)
