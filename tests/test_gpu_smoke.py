"""benchmarks/gpu_smoke in CPU mode: it prepares its carried data under 64 MiB, runs every
phase on its own (a phase that fails leaves the next to run) and rewrites its JSON after
each, so the run on a GPU machine is one command."""

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
                  "--backbone", "h0-mini-tiny", "--batch-size", "8", "--device-check-budget", "3"], data,
                 timeout=1200)
    printed = res.stdout
    assert res.returncode == 1, printed + res.stderr  # one phase failed
    # what was installed first (nothing: this environment has every package), then each phase
    assert printed.splitlines()[0].startswith('gpu_smoke: packages: {"missing": []')
    assert printed.splitlines()[1] == "gpu_smoke: environment ..."
    result = json.loads((work / "gpu_smoke.json").read_text())
    phases = result["phases"]
    assert list(phases) == ["environment", "demo", "real_slides", "device_check"]
    env = phases["environment"]
    assert env["ok"] and env["device"] == "cpu" and "torch" in env and "timm" in env and "dev_shm_gib" in env
    assert not phases["demo"]["ok"] and "demo" in phases["demo"]["error"]
    real = phases["real_slides"]
    assert real["ok"], real
    assert [s["slide"] for s in real["slides"]] == ["CMU-1-Small-Region.svs", "b005.jpeg"]
    assert all(f["device"] == "cpu" and f["tiles"] > 0 for f in real["features"].values())
    assert phases["device_check"]["ok"] and phases["device_check"]["rows"] > 0
    assert "gpu_smoke: done" in printed and "failed: demo" in printed
    assert not list(work.glob("*.tmp"))
