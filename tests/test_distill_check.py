"""benchmarks/distill_check.py (the GPU smoke run's distillation phase) in its CPU mode on a
tiny backbone: within a small time budget it trains, and reports its rate, the host waits
per step (on the CPU stand-in device), memory, where the target cache sat, and why the
GPU-only rows are not applicable."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import distill_check as check  # noqa: E402


def test_distill_check_runs_within_its_budget_and_reports(tmp_path, capsys):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert check.main(["--device", "cpu", "--budget-s", "2", "--backbone", "vit-s14-tiny", "--depth", "3",
                           "--precision", "fp32", "--json", str(tmp_path / "out.json")]) == 0
    finally:
        torch.set_num_threads(threads)
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["steps"] >= check.MIN_STEPS and out["steps_per_s"] > 0
    assert out["tiles_per_s"] == out["steps_per_s"] * out["batch_size"]
    assert out["host_waits_per_step"] <= 1 and out["host_waits"]["steps_counted"] == check.PROFILED_STEPS - 2
    assert out["peak_memory"]["process_peak_rss_bytes"] > 0
    assert out["gpu_wait_share"] == "n/a" and out["nccl_two_process"]["ran"] is False
    assert out["targets"]["device_bytes"] > 0 and out["targets"]["host_bytes"] == 0
    printed = capsys.readouterr().out
    assert "steps/s" in printed and "host waits per step" in printed and "two-process NCCL run" in printed


def test_kernel_time_is_counted_once_where_streams_overlap():
    assert check._union([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4.0


def test_the_idle_share_reads_the_steps_from_the_profile():
    """On the CPU the profiler records the step ends but no kernel: the share is n/a."""
    teacher, student, objective = check.build("vit-s14-tiny", 2, "cpu")
    args = check.argparse.Namespace(batch_size=2, precision="fp32", augment=False)
    tiles = check.random_tiles(6, teacher.spec.input_size)
    share, note = check.gpu_wait_share(lambda: check.distill_run(teacher, student, objective, tiles, "cpu", args, 4))
    assert share == "n/a" and note.startswith("the profiler saw 4 step ends and 0 kernels")


HANGS = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf, as a rank inside a CUDA wait is
time.sleep(600)
"""


def test_a_two_rank_run_past_its_timeout_leaves_no_process(tmp_path):
    """torchrun starts its ranks in sessions of their own: ending torchrun alone would leave
    them holding the GPU. The run is ended, every process of it, within the timeout and the
    grace after SIGTERM."""
    import os
    import time

    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    code, _ = check.run_ranks([str(torchrun), "--standalone", "--nproc-per-node=2", str(script)], env, timeout_s=8)
    assert code is None and time.monotonic() - started < 8 + check.TERM_GRACE_S + 10
    left = [p for p in Path("/proc").glob("[0-9]*/cmdline") if str(script).encode() in _read(p)]
    assert left == []


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_two_ranks_on_one_gpu_are_reported_by_the_duplicate_gpu_line():
    text = ("[rank1]: Traceback (most recent call last):\n[rank1]: torch.distributed.DistBackendError: NCCL error in: "
            "ProcessGroupNCCL.cpp:3356, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.27.5\n"
            "[rank1]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n[rank1]: Last error:\n"
            "[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000\n")
    assert check.cause_line(text) == "[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000"
