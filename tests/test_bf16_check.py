"""The distillation's bf16 guard (pathtwt.models.bf16_guard): bf16 is kept when the
first step's loss agrees with fp32, else fp32 with a log line; the student is unchanged."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from pathtwt.compress.bf16_step import check_bf16_first_step
from pathtwt.compress.distill import DeepSupervision
from pathtwt.compress.student import clone_layers, stitch_student
from pathtwt.models.registry import create_backbone


def _setup():
    teacher = create_backbone("vit-s14-tiny", pretrained=False, init_seed=1, precision="fp32")
    with torch.no_grad():
        for blk in teacher.model.blocks:  # random LayerScale 1e-5 would make every layer the identity
            blk.ls1.gamma.fill_(0.5)
            blk.ls2.gamma.fill_(0.5)
    ends = [3, 6, 9, 12]
    student = stitch_student(teacher.model, clone_layers(teacher.model, [2, 5, 8, 11]), spec=teacher.spec)
    # a student that is not the teacher's exact sub-network, so the loss is far from 0
    with torch.no_grad():
        for p in student.blocks.parameters():
            p.add_(0.05 * torch.randn_like(p))
    torch.manual_seed(0)
    return teacher, student.train(), DeepSupervision(ends), torch.randn(4, 3, 56, 56)


def test_bf16_kept_when_the_losses_agree(caplog):
    teacher, student, objective, x = _setup()
    before = {k: v.clone() for k, v in student.state_dict().items()}
    with caplog.at_level(logging.INFO, logger="pathtwt.compress.bf16_step"):
        result = check_bf16_first_step(student, teacher.model, x, objective)
    assert result.precision == "bf16" and result.loss_fp32 > 0
    assert 0 < result.relative_difference <= 0.02  # computed in bf16, yet close
    assert "bf16 autocast kept" in caplog.text
    assert student.training  # mode restored, parameters untouched
    assert all(torch.equal(before[k], v) for k, v in student.state_dict().items())


def test_falls_back_to_fp32_with_a_log_line(caplog):
    teacher, student, objective, x = _setup()
    with caplog.at_level(logging.WARNING, logger="pathtwt.compress.bf16_step"):
        result = check_bf16_first_step(student, teacher.model, x, objective, tolerance=0.0)
    assert result.precision == "fp32" and result.note.startswith("fell back to fp32")
    assert "falls back to fp32" in caplog.text and "relative difference" in caplog.text


def _tiles(n=6):
    return np.random.default_rng(0).integers(0, 256, size=(n, 56, 56, 3), dtype=np.uint8)


@pytest.mark.parametrize("tolerance, expected", [(0.02, "bf16"), (0.0, "fp32")])
def test_distill_asked_for_bf16_runs_the_check_and_trains_in_its_answer(tolerance, expected, caplog):
    from pathtwt.compress.distill import DistillOptions, distill

    teacher, student, objective, _ = _setup()
    options = DistillOptions(steps=2, batch_size=2, precision="bf16", augment=False, bf16_tolerance=tolerance,
                             checkpoint=None, progress=False)
    with caplog.at_level(logging.INFO, logger="pathtwt.compress.bf16_step"):
        run = distill(student, teacher.model, _tiles(), transform=teacher.transform, objective=objective, options=options)
    assert run.completed and run.precision == expected
    check = run.bf16_check
    assert check["precision"] == expected and check["tolerance"] == tolerance and check["tiles"] == 2
    assert check["loss_fp32"] > 0 and np.isfinite(check["loss_bf16"])
    assert ("falls back to fp32" in caplog.text) == (expected == "fp32")


def test_distill_in_fp32_skips_the_check():
    from pathtwt.compress.distill import DistillOptions, distill

    teacher, student, objective, _ = _setup()
    run = distill(student, teacher.model, _tiles(), transform=teacher.transform, objective=objective,
                  options=DistillOptions(steps=1, batch_size=2, precision="fp32", augment=False, progress=False))
    assert run.precision == "fp32" and run.bf16_check is None


def test_given_fp32_targets_only_the_students_side_differs():
    """With the loop's cached fp32 targets given, both losses use them: the fp32 loss is the
    one computed from the teacher's own fp32 pass, and the bf16 loss differs by the
    student's bf16 forward alone (a different value from the one with bf16 targets)."""
    from pathtwt.compress.targets import teacher_targets

    teacher, student, objective, x = _setup()
    own = check_bf16_first_step(student, teacher.model, x, objective)
    targets = teacher_targets(objective, teacher.model, x, "fp32")
    given = check_bf16_first_step(student, teacher.model, x, objective, targets=targets)
    assert given.loss_fp32 == pytest.approx(own.loss_fp32, rel=1e-6)
    assert given.loss_bf16 != own.loss_bf16 and given.precision == "bf16"
    wrong = [t + 1.0 for t in targets]  # the targets are the ones used, not recomputed
    assert check_bf16_first_step(student, teacher.model, x, objective, targets=wrong).loss_fp32 > 2 * own.loss_fp32


class _Watched(DeepSupervision):
    """TWT's loss, noting the dtype of a teacher weight at every teacher pass."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[torch.dtype] = []

    def targets(self, teacher, x):
        self.seen.append(teacher.blocks[0].attn.qkv.weight.dtype)
        return super().targets(teacher, x)


def _bf16_run_seeing_the_teacher(monkeypatch, cast_once: bool):
    """A short bf16 distillation with a teacher pass per step (augmentation on): the
    student trained, the teacher's weight dtype at each teacher pass, and whether the
    teacher came back unchanged."""
    import contextlib

    import pathtwt.compress.distill as D

    with monkeypatch.context() as patch:
        if not cast_once:  # autocast's own cast at every forward pass, as before
            patch.setattr(D, "weights_cast_once", lambda model: contextlib.nullcontext())
        torch.manual_seed(1)  # the student's perturbation (drawn in _setup) the same in both runs
        teacher, student, _, _ = _setup()
        before = {k: v.clone() for k, v in teacher.model.state_dict().items()}
        objective = _Watched([3, 6, 9, 12])
        options = D.DistillOptions(steps=3, batch_size=2, precision="bf16", bf16_tolerance=1.0, augment=True,
                                   loss_norm="none", progress=False)
        run = D.distill(student, teacher.model, _tiles(), transform=teacher.transform, objective=objective, options=options)
    assert run.precision == "bf16"
    restored = all(torch.equal(before[k], v) and v.dtype == before[k].dtype for k, v in teacher.model.state_dict().items())
    return student.state_dict(), objective.seen, restored


def test_the_teachers_weights_are_cast_to_bf16_once_per_run(monkeypatch):
    """Under bf16 autocast the teacher's targets come from bf16 copies of its linear
    weights made once per run, not cast by autocast at every forward pass; the student
    trained is the same bit for bit, and the teacher is fp32 again afterwards."""
    once, seen, restored = _bf16_run_seeing_the_teacher(monkeypatch, cast_once=True)
    per_step, seen_per_step, _ = _bf16_run_seeing_the_teacher(monkeypatch, cast_once=False)
    # the bf16 check's fp32 and bf16 passes compare against the fp32 teacher; then a pass a step
    assert seen == [torch.float32] * 2 + [torch.bfloat16] * 3 and seen_per_step == [torch.float32] * 5
    assert restored
    assert all(torch.equal(once[k], per_step[k]) for k in once)
