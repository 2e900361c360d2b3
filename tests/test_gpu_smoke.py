"""benchmarks/gpu_smoke in CPU mode: it prepares its carried data under 64 MiB, runs every
phase on its own (a phase that fails leaves the next to run) and rewrites its JSON after
each, so the run on a GPU machine is one command; its dry run checks, on any machine, the
carried files, that the GPU's data path is measured first and that a run fits the device
minutes with room for a rerun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "benchmarks" / "gpu_smoke"


def _smoke(args, data: Path, timeout=300):
    env = {**os.environ, "PATHTWT_SMOKE_DATA": str(data), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(SMOKE), *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env=env)


def test_prepare_carries_the_real_slides_under_the_limit(tmp_path, shared_slides):
    data = tmp_path / "data"
    # the slides alone: the wheels need PyPI (tests/test_smoke_wheels.py checks their part)
    res = _smoke(["--prepare", "--slides-only"], data)
    assert res.returncode == 0, res.stderr
    files = sorted(p.relative_to(data).as_posix() for p in data.rglob("*") if p.is_file())
    assert "slides/CMU-1-Small-Region.svs" in files
    bach = [f for f in files if f.startswith("bach/")]
    # two images of each of the four classes
    assert len(bach) == 8 and {Path(f).stem.rstrip("0123456789") for f in bach} == {"n", "b", "is", "iv"}
    assert sum((data / f).stat().st_size for f in files) < 64 * 2**20
    # the folder is ignored by git: it travels with the working tree, not the history
    assert "/.smoke_data/" in (REPO / ".gitignore").read_text().splitlines()


@pytest.mark.slow  # a minute or two on a busy 2-core machine: four Python processes start torch
def test_cpu_mode_every_phase_on_its_own(tmp_path, shared_slides):
    data, work = tmp_path / "data", tmp_path / "work"
    assert _smoke(["--prepare", "--slides-only"], data).returncode == 0
    # the demo fails (its folder cannot be made: a file stands there), whatever the
    # machine's speed; the real slides and the device check still run. The limits are
    # generous: what is checked is what the phases do, not what a time budget yields
    # (the device check measures its first row whatever its budget).
    work.mkdir()
    (work / "demo").write_text("not a folder")
    res = _smoke(["--device", "cpu", "--work", str(work), "--slides", "2", "--real-timeout", "600",
                  "--backbone", "h0-mini-tiny", "--batch-size", "8", "--device-check-budget", "3",
                  "--distill-budget", "3"], data,
                 timeout=1200)
    printed = res.stdout
    assert res.returncode == 1, printed + res.stderr  # one phase failed
    # what was installed first (nothing: this environment has every package), then each phase
    assert printed.splitlines()[0].startswith('gpu_smoke: packages: {"missing": []')
    assert printed.splitlines()[1] == "gpu_smoke: environment ..."
    result = json.loads((work / "gpu_smoke.json").read_text())
    phases = result["phases"]
    assert list(phases) == ["environment", "device_check", "distill_check", "real_slides", "demo"]
    env = phases["environment"]
    assert env["ok"] and env["device"] == "cpu" and "torch" in env and "timm" in env and "dev_shm_gib" in env
    assert env["gpu_decoders"] == "the model runs on cpu: no GPU decode"
    assert not phases["demo"]["ok"] and "demo" in phases["demo"]["error"]
    real = phases["real_slides"]
    assert real["ok"], real
    assert [s["slide"] for s in real["slides"]] == ["CMU-1-Small-Region.svs", "b005.jpeg"]
    assert all(f["device"] == "cpu" and f["tiles"] > 0 for f in real["features"].values())
    assert all(f["decode"] and f["precision"] and "natives_decoded_device" in f for f in real["features"].values())
    distill = phases["distill_check"]
    assert distill["ok"] and distill["steps_per_s"] > 0 and distill["host_waits_per_step"] is not None, distill
    assert distill["nccl_two_process"]["ran"] is False  # the CPU wiring leaves NCCL out
    check = phases["device_check"]
    assert check["ok"] and check["rows"] > 0 and check["mosaics"]["20x"]["copies"] == [1, 1]
    assert "gpu_smoke: done" in printed and "failed: demo" in printed
    assert not list(work.glob("*.tmp"))


def test_the_dry_run_checks_the_plan_on_any_machine(tmp_path):
    """The whole smoke run planned for the GPU machine, here: the carried wheels meet every
    requirement and carry the GPU decoder with its nvJPEG backend, the device check measures
    the GPU's data path first, and a run fits the device minutes twice after a start."""
    out = tmp_path / "plan.json"
    res = _smoke(["--dry-run", "--work", str(tmp_path / "work"), "--json", str(out)], tmp_path / "unprepared",
                 timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    plan = json.loads(out.read_text())
    assert plan["problems"] == []
    assert [p["phase"] for p in plan["phases"]] == ["environment", "device_check", "distill_check", "real_slides", "demo"]
    # the distillation phase's limit holds its budget, the NCCL attempt and the models' build
    assert next(p["limit_s"] for p in plan["phases"] if p["phase"] == "distill_check") == 75
    assert plan["run_s"] == plan["install_s"] + sum(p["limit_s"] for p in plan["phases"]) <= plan["run_limit_s"]
    assert plan["start_s"] + 2 * plan["run_s"] <= plan["device_s"] == 900
    assert plan["carried"]["wheel_mib"] <= 60 and plan["carried"]["shrunk"] == {"nvidia-nvimgcodec-cu13": 5}
    assert plan["carried"]["prepared"].startswith("not prepared")
    rows = plan["device_check_rows"]
    assert [r["kind"] for r in rows[:2]] == ["decode", "decode"]
    extract = [r for r in rows if r["kind"] == "extract"]
    assert [r["decode"] for r in extract] == ["gpu"] * 4 + ["cpu"] * 4  # the GPU rows first
    assert rows.index(extract[-1]) < next(i for i, r in enumerate(rows) if r["kind"] == "forward")
    # a budget that leaves no room for a rerun is one line, and the exit says so
    res = _smoke(["--dry-run", "--work", str(tmp_path / "work"), "--device-check-budget", "200", "--json", str(out)],
                 tmp_path / "unprepared", timeout=120)
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and "at most 360 s a run" in res.stderr


def test_the_dry_run_checks_a_prepared_folder(tmp_path):
    data = tmp_path / "data"
    (data / "wheels").mkdir(parents=True)
    (data / "wheels" / "stale-0.1-py3-none-any.whl").write_bytes(b"old")
    res = _smoke(["--dry-run", "--work", str(tmp_path / "work"), "--json", str(tmp_path / "p.json")], data,
                 timeout=120)
    problems = json.loads((tmp_path / "p.json").read_text())["problems"]
    assert res.returncode == 1
    assert "carried folder: stale-0.1-py3-none-any.whl is not in the lock" in problems
    assert any(p.startswith("carried folder: nvidia_nvimgcodec_cu13-") and "missing" in p for p in problems)
    assert any(p.startswith("carried folder: no slides") for p in problems)
