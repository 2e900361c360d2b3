"""What a distillation step makes the host wait for, counted on the CPU with a GPU stand-in
(benchmarks/host_waits.py: ``cpu:0`` plays the device): at most one wait per optimiser
step, the read of the logged loss, whatever the target source and however many
micro-batches the step accumulates."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tiny_teacher import tiny_teacher
from pathtwt.compress import augment
from pathtwt.compress.distill import DeepSupervision, DistillOptions, distill
from pathtwt.compress.student import clone_layers, stitch_student

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from host_waits import DEVICE, DeviceStandIn, StepMarks, per_step  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    """The stand-in runs many tiny ops, each an OpenMP region: one thread is faster, and
    the counts do not depend on it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiles():
    return np.random.default_rng(0).integers(0, 256, size=(10, 56, 56, 3), dtype=np.uint8)


@pytest.mark.parametrize("options", [{"augment": False}, {"augment": True, "accumulate": 2}],
                         ids=["cached-targets", "augmented-teacher-pass-accumulated"])
def test_a_step_waits_for_the_device_once(tiles, options):
    teacher = tiny_teacher(5)  # fresh: its transform's constants are made on this stand-in
    student = stitch_student(teacher.model, clone_layers(teacher.model, [0, 5, 11]), spec=teacher.spec)
    for made_once in (augment._yiq_matrices, getattr(augment, "_luma", None)):  # per device: this stand-in's
        if hasattr(made_once, "cache_clear"):
            made_once.cache_clear()
    with DeviceStandIn() as standin, StepMarks(standin.traffic) as steps:
        distill(student, teacher.model, tiles, transform=teacher.transform, objective=DeepSupervision([1, 6, 12]),
                options=DistillOptions(steps=5, batch_size=4, progress=False, device=DEVICE, **options))
    counted = per_step(standin.traffic, steps.marks)
    where = counted["where"]
    assert counted["steps_counted"] == 3
    assert counted["host_waits_per_step"] <= 1, f"host waits per step: {where}"
    # the one wait: the logged loss, read once
    assert list(where.get("d2h", {})) == [next(w for w in where["d2h"] if "distill.py" in w and "tolist" in w)]
    assert not where.get("mixed"), f"host tensors met device tensors (CUDA refuses): {where['mixed']}"
    # the micro-batch's tiles and target indices do cross, without waiting
    assert sum(where["async_h2d"].values()) >= 2


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
    counts = [len(t.of(kind)) for kind in ("blocking_h2d", "async_h2d", "d2h", "data_dependent")]
    assert counts == [2, 1, 2, 1] and t.waits() == 5, t.summary()


def test_target_tensors_that_do_not_fit_stay_on_the_host_and_cross_without_waiting(monkeypatch):
    """The cache's placement: the target tensors within the device budget move there, the
    others stay in host memory; a micro-batch's targets are the same either way, gathered
    on the device or into (pinned, on a GPU) staging memory, with no copy waited for."""
    from pathtwt.compress import targets

    host = [torch.randn(12, 5, 8) for _ in range(4)]
    nbytes = host[0].numel() * 4
    monkeypatch.setattr(targets, "device_budget", lambda device: 2 * nbytes + 1)  # room for two
    idx = torch.tensor([3, 0, 11, 3])
    with DeviceStandIn() as standin:
        cache = targets.TargetCache([t.clone() for t in host])
        cache.settle(DEVICE)
        settled = len(standin.traffic.events)
        got = cache.get(idx, DEVICE)
    assert cache.on_device == [True, True, False, False]
    assert cache.describe() == {"device_bytes": 2 * nbytes, "host_bytes": 2 * nbytes, "sharers": 1}
    assert all(torch.equal(g, t[idx]) for g, t in zip(got, host))
    assert all(standin.on_device(g) for g in got)
    assert standin.traffic.waits(settled) == 0 and len(standin.traffic.of("async_h2d", settled)) == 3
