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
sys.path.insert(0, str(REPO / "benchmarks"))
import smoke_wheels  # noqa: E402


def _smoke(args, data: Path, timeout=300):
    env = {**os.environ, "PATHTWT_SMOKE_DATA": str(data), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(SMOKE), *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env=env)


def _module():
    """benchmarks/gpu_smoke as a module, with its carried folder at ``data``."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("gpu_smoke", str(SMOKE))
    spec = importlib.util.spec_from_loader("gpu_smoke", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_prepare_carries_the_real_slides_under_the_limit(tmp_path, shared_slides):
    data = tmp_path / "data"
    # the slides alone: the wheels need PyPI (tests/test_smoke_wheels.py checks their part)
    res = _smoke(["--prepare", "--slides-only"], data)
    assert res.returncode == 0, res.stderr
    files = sorted(p.relative_to(data).as_posix() for p in data.rglob("*") if p.is_file())
    assert "slides/CMU-1-Small-Region.svs" in files
    bach = [f for f in files if f.startswith("bach/")]
    # one image of two classes: normal and invasive
    assert len(bach) == 2 and {Path(f).stem.rstrip("0123456789") for f in bach} == {"n", "iv"}
    g = _module()
    slides = sum((data / f).stat().st_size for f in files)
    wheels = sum(w.size for w in smoke_wheels.load_lock())
    assert slides + wheels <= g.CARRIED_LIMIT_BYTES == 56 * 2**20  # the folder once the wheels are fetched
    # the folder is ignored by git: it travels with the working tree, not the history
    assert "/.smoke_data/" in (REPO / ".gitignore").read_text().splitlines()


@pytest.mark.slow  # a few minutes on a busy 2-core machine: each phase starts torch in its own process
def test_cpu_mode_every_phase_on_its_own(tmp_path, shared_slides):
    data, work = tmp_path / "data", tmp_path / "work"
    assert _smoke(["--prepare", "--slides-only"], data).returncode == 0
    # the distillation check cannot start (its JSON's path is a folder), whatever the machine's
    # speed; the other phases still run. The limits are generous: what is checked is what the
    # phases do, not what a time budget yields on a busy machine
    work.mkdir()
    (work / "distill_check.json").mkdir()
    res = _smoke(["--device", "cpu", "--work", str(work), "--slides", "2", "--real-timeout", "600",
                  "--backbone", "h0-mini-tiny", "--batch-size", "8", "--bench-limit", "600", "--environment-limit",
                  "120", "--distill-budget", "3"], data, timeout=1800)
    printed = res.stdout
    assert res.returncode == 1, printed + res.stderr  # one phase failed
    # what was installed first (nothing: this environment has every package), then each phase
    assert printed.splitlines()[0].startswith('gpu_smoke: packages: {"missing": []')
    assert printed.splitlines()[1] == "gpu_smoke: environment ..."
    result = json.loads((work / "gpu_smoke.json").read_text())
    phases = result["phases"]
    assert list(phases) == ["environment", "bench", "distill_check", "real_slides"]
    env = phases["environment"]
    assert env["ok"] and env["checks"][0].startswith("OK python") and any("OK gpu: no GPU" in c for c in env["checks"])
    bench = phases["bench"]
    assert bench["ok"] and bench["mosaics"]["20x"]["copies"] == [1, 1]
    e2e = [r for r in bench["table"] if r["kind"] == "end-to-end"]
    assert {r["variant"] for r in e2e} == {"uncompressed", "twt-6"} and all(r["bound"] for r in e2e)
    assert not phases["distill_check"]["ok"]
    real = phases["real_slides"]
    assert real["ok"], real
    assert [s["slide"] for s in real["slides"]][0] == "CMU-1-Small-Region.svs"
    assert all(f["device"] == "cpu" and f["tiles"] > 0 for f in real["features"].values())
    assert all(f["decode"] and f["precision"] and "natives_decoded_device" in f for f in real["features"].values())
    assert "gpu_smoke: done" in printed and "failed: distill_check" in printed
    assert not list(work.glob("*.tmp"))


def _dry_run(tmp_path, data: Path, *extra: str):
    out = tmp_path / "plan.json"
    res = _smoke(["--dry-run", "--work", str(tmp_path / "work"), "--json", str(out), *extra], data, timeout=120)
    return res, json.loads(out.read_text())


def test_the_dry_run_fails_unprepared_and_the_budget_leaves_a_tenth_free(tmp_path):
    """Unprepared: exit 1 naming the absent folder. The plan: a run's limits, the install
    included, within 300 s, so a start and two runs leave 10 % of the 900 device seconds."""
    res, plan = _dry_run(tmp_path, tmp_path / "unprepared")
    assert res.returncode == 1
    assert plan["problems"] == [f"carried folder: {tmp_path / 'unprepared'} is absent; run benchmarks/gpu_smoke "
                                "--prepare where ../shared and PyPI are, and carry .smoke_data"]
    assert res.stderr.strip() == f"gpu_smoke --dry-run: {plan['problems'][0]}"
    assert [p["phase"] for p in plan["phases"]] == ["environment", "bench", "distill_check", "real_slides"]
    # the distillation phase's limit holds its budget, the NCCL attempt and the models' build
    assert next(p["limit_s"] for p in plan["phases"] if p["phase"] == "distill_check") == 75
    assert plan["run_s"] == plan["install_s"] + sum(p["limit_s"] for p in plan["phases"]) <= plan["run_limit_s"] == 300
    assert plan["start_s"] + 2 * plan["run_s"] <= 0.9 * plan["device_s"] and plan["device_s"] == 900
    assert plan["carried"]["wheel_mib"] <= 52 and plan["carried"]["shrunk"] == {"nvidia-nvimgcodec-cu13": 5}
    # a limit that leaves no tenth free is one more line, and the exit says so
    res, plan = _dry_run(tmp_path, tmp_path / "unprepared", "--bench-limit", "200")
    assert res.returncode == 1 and any(p.startswith("time: a run may take 398 s") for p in plan["problems"])


def test_real_slides_is_budgeted_from_its_measured_steps():
    g = _module()
    steps = g.REAL_STEP_S["tile_svs"] + len(g.BACH_CLASSES) * g.REAL_STEP_S["tile_jpeg"] + g.REAL_STEP_S["extract"]
    assert next(p for p in g.PHASES if p.name == "real_slides").limit_s == round(steps * g.REAL_MARGIN, 1)
    assert g.REAL_MARGIN >= 1.25


def _prepared_folder(tmp_path, g, smoke_wheels) -> Path:
    """A carried folder as --prepare leaves it: the slides, and a file per locked wheel."""
    data = tmp_path / "data"
    assert _smoke(["--prepare", "--slides-only"], data).returncode == 0
    (data / "wheels").mkdir()
    for w in smoke_wheels.load_lock():
        (data / "wheels" / w.file).write_bytes(b"wheel")
    return data


def test_the_dry_run_passes_prepared_and_names_what_is_missing_or_differs(tmp_path, shared_slides, monkeypatch):
    g = _module()
    data = _prepared_folder(tmp_path, g, smoke_wheels)
    # the wheels here are stand-ins: each is what the lock says unless named otherwise
    differs = {}
    monkeypatch.setattr(smoke_wheels, "carried_differs", lambda path, w: differs.get(w.file, ""))
    monkeypatch.setattr(g, "DATA", data)
    args = g.argparse.Namespace(device="cuda", skip_set=set(), **{p.option.lstrip("-").replace("-", "_"): p.limit_s
                                                                  for p in g.PHASES if p.option})
    plan = g.dry_run(args, tmp_path / "work")
    assert plan["problems"] == [] and plan["carried"]["prepared"]["wheels"] == 15
    assert plan["carried"]["prepared"]["slides"][0] == "CMU-1-Small-Region.svs"
    # incomplete: the SVS gone, a BACH class gone, a wheel gone; a wheel unlike the lock; one the lock lacks
    (data / "slides" / "CMU-1-Small-Region.svs").unlink()
    next((data / "bach").glob("iv*.jpeg")).unlink()
    lock = smoke_wheels.load_lock()
    (data / "wheels" / lock[0].file).unlink()
    differs[lock[1].file] = "has another sha256 than the lock's"
    (data / "wheels" / "stale-0.1-py3-none-any.whl").write_bytes(b"old")
    problems = g.dry_run(args, tmp_path / "work")["problems"]
    assert any("slides/CMU-1-Small-Region.svs is missing" in p for p in problems)
    assert any("no BACH image ivNNN.jpeg" in p for p in problems)
    assert any(p.startswith(f"carried folder: {lock[0].file} missing") for p in problems)
    assert any(p.startswith(f"carried folder: {lock[1].file} has another sha256") for p in problems)
    assert "carried folder: stale-0.1-py3-none-any.whl is not in the lock" in problems
