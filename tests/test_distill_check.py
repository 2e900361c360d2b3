"""benchmarks/distill_check.py (the GPU smoke run's distillation phase) in its CPU mode on a
tiny backbone: within a small time budget it trains, and reports its rate, the host waits
per step (on the CPU stand-in device), memory, where the target cache sat, and why the
GPU-only rows are not applicable."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("distill_check", REPO / "benchmarks" / "distill_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_distill_check_runs_within_its_budget_and_reports(tmp_path, capsys):
    check = _module()
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
    check = _module()
    assert check._union([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4.0
