"""Data-parallel ranks of ``pathtwt compress``. An srun rank of a multi-GPU compress knows
its rank before it chooses a device: on a node showing it both GPUs, SLURM's task 1 takes
cuda:1, the GPU of its rank, and claims no free GPU first (which would leave a context on
another rank's GPU and a wrong ``device:`` line); its group waits --rank-timeout for a
collective (mocked torch.cuda and torch.distributed, as tests/test_gpu_wiring.py). Two real
gloo ranks: rank 0 decides for both, and a value that must agree and does not is one line
on each. A failing rank's line, posted for the others, and the watcher that ends a rank
stuck where no error reaches it (a store in a dict); only rank 0 writes the subset search's
record."""

from __future__ import annotations

import json
import textwrap
import time
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
        # set, then removed: the test's end restores each as it was, also those the code under
        # test writes (launched_world_size fills in WORLD_SIZE, RANK, LOCAL_RANK from SLURM's)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
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
    # the group waits a little past --rank-timeout (the watchers name a stalled rank at
    # --rank-timeout, before NCCL's watchdog would), not torch's 30 minutes
    assert len(srun_rank_1) == 1 and srun_rank_1[0]["timeout"] == timedelta(minutes=2.5 + 1.25)
    assert ranks.group_timeout(0.1) == timedelta(minutes=1.1)


def _device_backends(backend: str) -> dict[str, str]:
    """The device type -> backend map torch makes of a backend string (as init_process_group does)."""
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    return BackendConfig(Backend(backend)).get_device_backend_map()


@pytest.mark.parametrize("requested, backends", [("cuda", {"cuda": "nccl"}), ("cpu", {"cpu": "gloo", "cuda": "gloo"})])
def test_gpu_ranks_join_plain_nccl_and_cpu_ranks_gloo(monkeypatch, srun_rank_1, requested, backends):
    """GPU ranks connect NCCL alone (no gloo half, which connects at init over the host
    name's address); CPU ranks use gloo."""
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    process_device(requested, 1.0)
    assert _device_backends(srun_rank_1[0]["backend"]) == backends


DECISIONS = textwrap.dedent("""
    import json, sys
    from pathtwt.compress import ranks
    from pathtwt.errors import PathtwtError

    ranks.init_from_env("cpu", 0.5)
    me = ranks.rank()
    out = {"plan": ranks.decide("the merge plan", {"blocks": [[1, 6 + me], [7 + me, 12]], "eps": None}),
           "layers": ranks.decide("NOSE's attention-free layers", ([0, 2 + me], "select", [])),
           "agreed": ranks.agree("the settings", {"lr": 3e-4}, "start them alike") is None}
    try:
        ranks.agree("the step distillation resumes from", 3 * me, "put the checkpoint where every rank reads it")
    except PathtwtError as exc:
        out["mismatch"] = str(exc)
    ranks.shutdown()
    print(json.dumps(out))
""")


def test_rank_0_decides_for_all_and_a_mismatch_is_one_line_on_every_rank(tmp_path):
    """Two real gloo ranks whose own choices differ: each gets rank 0's (the one that
    differed says so); a value that must agree and does not is the same one line on both,
    at once."""
    from rank_faults import two_gloo_ranks

    script = tmp_path / "decide.py"
    script.write_text(DECISIONS)
    runs = two_gloo_ranks(script)
    assert [code for code, _, _ in runs] == [0, 0], runs[0][2][-2000:] + runs[1][2][-2000:]
    results = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in runs]
    errors = [err for _, _, err in runs]
    for res in results:
        assert res["plan"] == {"blocks": [[1, 6], [7, 12]], "eps": None}
        assert res["layers"] == [[0, 2], "select", []] and res["agreed"]
        assert res["mismatch"] == ("the ranks disagree on the step distillation resumes from: rank(s) 1 differ from rank 0 "
                                   "(rank 0 0, rank 1 3); put the checkpoint where every rank reads it")
    assert "rank 1: the merge plan differs from rank 0's" in errors[1] and "differs" not in errors[0]


# the store in a dict and rank 1 of 2 with it (the fixture), as the watcher's tests use them
from test_rank_watch import DictStore as _Store, rank_1_of_2  # noqa: E402,F401


def test_a_failing_rank_posts_its_line_and_aborts_the_group(rank_1_of_2):
    from pathtwt.cli import error_line
    from pathtwt.compress.rank_failures import leave_after_error, read
    from pathtwt.errors import PathtwtError

    store, aborted = rank_1_of_2
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79 GiB")
    out = leave_after_error(oom, error_line("compress", oom))
    assert isinstance(out, PathtwtError) and aborted == [True]
    assert str(out).startswith("rank 1 of 2: the GPU ran out of memory (CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "lower --batch-size and raise --accumulate" in str(out)
    assert read(store).rank == 1 and read(store).line == str(out).removeprefix("rank 1 of 2: ")
    # a bug keeps its traceback (nothing replaces it), and the first notice stays
    assert leave_after_error(ValueError("x"), None) is None and read(store).rank == 1


def test_a_rank_whose_collective_broke_names_the_rank_that_failed(rank_1_of_2):
    from pathtwt.compress.rank_failures import Notice, leave_after_error, post, read

    store, aborted = rank_1_of_2
    broken = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer [10.0.0.2]:4242. "
                          "This is typically caused by a remote worker crashing.")
    out = leave_after_error(broken, None)  # no notice: the other rank was killed
    assert str(out).startswith("rank 1 of 2: lost contact with the other ranks (Connection closed by peer [10.0.0.2]:4242); ")
    assert read(store).rank == 1  # said for any rank still waiting
    store.data.clear()
    post(store, Notice(0, "failed", "/x/checkpoint.pt: cannot write it: no space left on the device"))
    assert str(leave_after_error(broken, None)) == ("rank 1 of 2: stopped because rank 0 failed: /x/checkpoint.pt: cannot "
                                                    "write it: no space left on the device")
    assert len(aborted) == 2
    store.data.clear()
    assert leave_after_error(KeyboardInterrupt(), None) is None  # a stop stays a stop


def test_the_watcher_ends_a_rank_stuck_while_another_failed(rank_1_of_2, monkeypatch):
    from pathtwt.compress import rank_failures

    store, _ = rank_1_of_2
    ended, lines = [], []
    monkeypatch.setattr(rank_failures, "GRACE_S", 0.2)
    monkeypatch.setattr(rank_failures, "POLL_S", 0.05)
    monkeypatch.setattr(rank_failures.os, "_exit", ended.append)
    monkeypatch.setattr(rank_failures.os, "write", lambda fd, data: lines.append((fd, data.decode())))
    watch = rank_failures.PeerWatch(store, 1, 2, "pathtwt compress: error: ")
    watch.start()
    rank_failures.post(store, rank_failures.Notice(1, "failed", "its own notice"))  # this rank's: not a reason
    time.sleep(0.5)
    assert not ended
    store.data.clear()
    rank_failures.post(store, rank_failures.Notice(0, "failed", "training tile 8: OSError: [Errno 5] Input/output error"))
    end = time.monotonic() + 5
    while not ended and time.monotonic() < end:
        time.sleep(0.02)
    watch.done.set()
    assert ended == [1] and lines == [(2, "pathtwt compress: error: rank 1 of 2: stopped because rank 0 failed: training "
                                          "tile 8: OSError: [Errno 5] Input/output error\n")]


def test_only_rank_0_writes_the_subset_search_record(tmp_path, monkeypatch):
    from pathtwt.compress.methods import subset
    from pathtwt.compress.methods.subset import run_search, search_settings
    from pathtwt.compress.pipeline import CompressOptions
    from tiny_teacher import tiny_calibration, tiny_teacher

    teacher, calib = tiny_teacher(2), tiny_calibration()
    # who writes the record is the point here, not how subsets score: a planted landscape
    monkeypatch.setattr(subset, "distillation_scorer", lambda *a, **k: lambda kept: -sum((i - 5) ** 2 for i in kept))
    options = CompressOptions.from_flat(out=tmp_path, depth=3, steps=2, batch_size=4, progress=False,
                                        extra={"search_budget": 13, "search_steps": 0})
    settings = search_settings(teacher, calib, options, 2)
    monkeypatch.setattr(ranks, "is_writer", lambda: False)
    record = run_search(teacher, calib, options, settings)
    assert len(record["local"]["best_layers"]) == 3 and not (tmp_path / "subset_search.json").exists()
    monkeypatch.setattr(ranks, "is_writer", lambda: True)
    assert run_search(teacher, calib, options, settings) == record  # the same search (scores memoised), now kept
    assert json.loads((tmp_path / "subset_search.json").read_text()) == record


def test_the_ranks_compare_the_calibration_tiles_pixels_not_only_their_count(monkeypatch):
    """A node that reads another calibration file with as many tiles differs from rank 0 in
    what the ranks compare before training; a single process compares nothing."""
    import argparse
    from types import SimpleNamespace

    import numpy as np

    from pathtwt.cli.compress import agree_on_inputs
    from pathtwt.compress.calibration import CalibrationSet

    compared = []
    monkeypatch.setattr(ranks, "agree", lambda name, value, remedy: compared.append(value))
    args, teacher = argparse.Namespace(method="twt", rank_timeout=1.0), SimpleNamespace(weights_sha256="w")
    rng = np.random.default_rng(0)
    sets = [CalibrationSet(*(rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8) for n in (6, 2, 2)), patch_size=8)
            for _ in range(2)]
    agree_on_inputs(args, teacher, sets[0])
    assert compared == []  # one process
    monkeypatch.setattr(ranks, "world_size", lambda: 2)
    for calib in sets:
        agree_on_inputs(args, teacher, calib)
    assert compared[0]["calibration_tiles"] == compared[1]["calibration_tiles"]
    assert compared[0] != compared[1]
