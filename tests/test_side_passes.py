"""The passes around distillation's steps run at a rank's micro-batch, and a GPU
out-of-memory error in one is one line naming the pass and the setting that sizes or skips
it (not torch's allocator report, nor a blind "lower --batch-size")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tiny_teacher import tiny_teacher
from pathtwt.compress import side_passes
from pathtwt.compress.distill import DeepSupervision, DistillOptions, distill
from pathtwt.compress.side_passes import DeviceMemoryError, rank_batch
from pathtwt.compress.student import clone_layers, stitch_student
from pathtwt.errors import PathtwtError

OOM = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.6 GiB of which 1.2 GiB is free"


def _fail_at(module: torch.nn.Module, call: int) -> None:
    """``module``'s ``call``-th forward pass (1 = the first) runs out of GPU memory."""
    calls = []

    def hook(mod, args):
        calls.append(len(args[0]))
        if len(calls) == call:
            raise torch.OutOfMemoryError(OOM)

    module.register_forward_pre_hook(hook)


@pytest.mark.parametrize("failing, options, named, skip", [
    ("teacher", {"loss_norm": "variance"}, "the loss normalisation", "--loss-norm none"),
    ("student", {"precision": "bf16", "bf16_tolerance": 1.0}, "the bf16 first-step check", "--precision fp32"),
    # the teacher's first pass is target_source's one-tile probe, the second the cache's
    ("teacher", {}, "the teacher-target cache", None),
], ids=["loss-normalisation", "bf16-check", "target-cache"])
def test_an_out_of_memory_side_pass_names_itself(failing, options, named, skip):
    teacher = tiny_teacher(5)
    student = stitch_student(teacher.model, clone_layers(teacher.model, [0, 5, 11]), spec=teacher.spec)
    calls = 2 if named == "the teacher-target cache" else 1
    _fail_at((teacher.model if failing == "teacher" else student).patch_embed, calls)
    tiles = np.random.default_rng(0).integers(0, 256, size=(6, 56, 56, 3), dtype=np.uint8)
    opts = DistillOptions(**{"steps": 1, "batch_size": 2, "progress": False, "augment": False, "loss_norm": "none",
                             **options})
    with pytest.raises(DeviceMemoryError) as info:
        distill(student, teacher.model, tiles, transform=teacher.transform, objective=DeepSupervision([1, 6, 12]),
                options=opts)
    line = str(info.value)
    assert isinstance(info.value, PathtwtError) and "\n" not in line
    assert line.startswith(f"{named} ran out of GPU memory at 2 tiles a forward pass") and "Tried to allocate 2.00 GiB" in line
    assert "--batch-size" in line and (skip is None or skip in line)


def test_side_passes_take_a_ranks_share_of_the_batch(monkeypatch):
    from pathtwt.compress import ranks
    from pathtwt.compress.pipeline import CompressOptions

    monkeypatch.setattr(ranks, "world_size", lambda: 4)
    assert rank_batch(64) == 16 and rank_batch(2) == 1
    options = CompressOptions.from_flat(out="x", batch_size=64)
    assert options.forward_batch == 16  # fidelity, discovery, the linear fit, scoring
    assert side_passes.BATCH_ADVICE.startswith("lower --batch-size")


def test_an_allocation_failure_re_raised_as_a_runtime_error_is_named_too():
    """An out-of-memory error that reaches a side pass as a plain RuntimeError (a library
    re-raising CUDA's) is named as torch's own is; any other error passes through."""
    with pytest.raises(DeviceMemoryError) as info:
        with side_passes.named_out_of_memory("the pass", 4, skip="--pass off"):
            raise RuntimeError(OOM)
    assert str(info.value).startswith("the pass ran out of GPU memory at 4 tiles a forward pass")
    assert "Tried to allocate 2.00 GiB" in str(info.value) and str(info.value).endswith(", or --pass off")
    with pytest.raises(RuntimeError, match="a bug"):
        with side_passes.named_out_of_memory("the pass", 4):
            raise RuntimeError("a bug")


def test_auditionings_fitting_steps_name_their_whole_batch(monkeypatch):
    """Auditioning fits its candidates at its whole fitting batch on every rank, not at a
    rank's share: an out-of-memory error there names that batch and what sets it."""
    from pathtwt.compress import ranks
    from pathtwt.compress.audition import AuditionOptions, _fit

    monkeypatch.setattr(ranks, "world_size", lambda: 4)
    layer = torch.nn.Linear(8, 8)
    _fail_at(layer, 1)
    states = torch.zeros(40, 3, 8)
    with pytest.raises(DeviceMemoryError) as info:
        _fit(layer, states, states, AuditionOptions(steps=2, batch_size=16))
    assert str(info.value).startswith("auditioning's fitting steps ran out of GPU memory at 16 tiles a forward pass, "
                                      "the smaller of --batch-size and 16 (CUDA out of memory. Tried to allocate")
    assert str(info.value).endswith("or --audition-steps 0 (candidates ranked unfitted)")
