"""What a distillation step makes the host wait for, counted on the CPU with a GPU stand-in
(tests/device_standin.py: ``cpu:0`` plays the device): at most one wait per optimiser
step, the read of the logged loss, whatever the target source and however many
micro-batches the step accumulates."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from device_standin import DEVICE, DeviceStandIn
from tiny_teacher import tiny_teacher
from pathtwt.compress import augment
from pathtwt.compress.distill import DeepSupervision, DistillOptions, distill
from pathtwt.compress.student import clone_layers, stitch_student


@pytest.fixture(scope="module")
def tiles():
    return np.random.default_rng(0).integers(0, 256, size=(10, 56, 56, 3), dtype=np.uint8)


def _traffic(tiles, steps: int, **options):
    """The stand-in's record of a whole run of ``steps`` steps, set-up included."""
    teacher = tiny_teacher(5)  # fresh: its transform's constants are made on the stand-in
    student = stitch_student(teacher.model, clone_layers(teacher.model, [0, 5, 11]), spec=teacher.spec)
    for made_once in (augment._yiq_matrices, getattr(augment, "_luma", None)):  # per device, this stand-in's
        if hasattr(made_once, "cache_clear"):
            made_once.cache_clear()
    with DeviceStandIn() as standin:
        distill(student, teacher.model, tiles, transform=teacher.transform, objective=DeepSupervision([1, 6, 12]),
                options=DistillOptions(steps=steps, batch_size=4, progress=False, device=DEVICE, **options))
    return standin.traffic


def _per_step(short, long, steps: int) -> dict[str, dict[str, float]]:
    """What each further step added: the longer run's record less the shorter's, by kind and
    by the pathtwt line that asked for it."""
    out = {}
    for kind in ("blocking_h2d", "d2h", "data_dependent", "explicit", "async_h2d", "mixed"):
        diff = Counter(getattr(long, kind))
        diff.subtract(Counter(getattr(short, kind)))
        out[kind] = {where: n / steps for where, n in diff.items() if n}
    return out


@pytest.mark.parametrize("options", [{"augment": False}, {"augment": True, "accumulate": 2}],
                         ids=["cached-targets", "augmented-teacher-pass-accumulated"])
def test_a_step_waits_for_the_device_once(tiles, options):
    short, long = _traffic(tiles, 2, **options), _traffic(tiles, 4, **options)
    step = _per_step(short, long, 2)
    waits = {kind: step[kind] for kind in ("blocking_h2d", "d2h", "data_dependent", "explicit") if step[kind]}
    assert (long.syncs - short.syncs) / 2 <= 1, f"host waits per step: {waits}"
    # the one wait: the logged loss, read once
    assert len(step["d2h"]) == 1 and "distill.py" in next(iter(step["d2h"])) and "tolist" in next(iter(step["d2h"]))
    assert not step["mixed"], f"host tensors met device tensors (CUDA refuses): {step['mixed']}"
    # the micro-batch's tiles and target indices do cross, without waiting
    assert sum(step["async_h2d"].values()) >= 1


def test_the_stand_in_sees_what_a_gpu_would_wait_for():
    with DeviceStandIn() as standin:
        host = torch.ones(4)
        on_device = host.to(DEVICE)  # blocking copy
        host.to(DEVICE, non_blocking=True)  # not waited for
        torch.tensor([1.0, 2.0], device=DEVICE)  # a blocking copy too
        assert on_device.device == torch.device(DEVICE) and host.device == torch.device("cpu")
        total = (on_device * 2).sum()
        float(total)  # a read: waits
        on_device.tolist()  # waits
        torch.nonzero(on_device > 0)  # a value-dependent shape: waits
        torch.zeros(3, device=DEVICE) + 1  # made there: nothing crosses
    t = standin.traffic
    assert (len(t.blocking_h2d), len(t.async_h2d), len(t.d2h), len(t.data_dependent)) == (2, 1, 2, 1), t.summary()
