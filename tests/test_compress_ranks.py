"""An srun rank of a multi-GPU compress knows its rank before it chooses a device: on a
node showing it both GPUs, SLURM's task 1 takes cuda:1, the GPU of its rank, and claims
no free GPU first (which would leave a context on another rank's GPU and a wrong
``device:`` line). Mocked torch.cuda and torch.distributed, as tests/test_gpu_wiring.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from pathtwt import devices
from pathtwt.cli.compress import process_device
from pathtwt.compress import ranks


@pytest.fixture
def srun_rank_1(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
                 "PATHTWT_GPU_CLAIMS"):
        monkeypatch.delenv(name, raising=False)
    # plain srun, one task per GPU of a 2-GPU node: SLURM's variables and rank 0's address only
    for name, value in {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    joined = []
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: joined.append({"backend": backend, **kw}))
    yield joined
    monkeypatch.setattr(ranks, "_device", "cpu")


def test_an_srun_rank_takes_its_own_gpu_and_claims_none(monkeypatch, srun_rank_1, capsys):
    current = []
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setattr(devices, "claim_gpus", lambda *a, **k: pytest.fail("an srun rank claimed a GPU"))
    assert process_device("cuda", 2.5) == "cuda:1"
    assert current == [1]
    assert "claimed" not in capsys.readouterr().err
    # the group waits --rank-timeout for a collective, not torch's 30 minutes
    assert len(srun_rank_1) == 1 and srun_rank_1[0]["timeout"] == timedelta(minutes=2.5)
