"""benchmarks/device_check.py in its CPU mode (tiny models): the table it prints and its
JSON hold every measurement, with finite positive numbers, so the GPU run is ready."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest
from conftest import SHARED_SLIDES

REPO = Path(__file__).resolve().parents[1]
# the real slide the benchmark reads, where conftest looks for ../shared
SHARED_SLIDE = SHARED_SLIDES / "CMU-1-Small-Region.svs"


def _load():
    spec = importlib.util.spec_from_file_location("device_check", REPO / "benchmarks" / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_known_gpu_peaks():
    dc = _load()
    assert dc.known_peak("NVIDIA H100 80GB HBM3") == ("H100 SXM", 989.4)
    assert dc.known_peak("NVIDIA H100 PCIe")[0] == "H100 PCIe"
    assert dc.known_peak("NVIDIA H200")[0] == "H200 SXM"
    assert dc.known_peak("NVIDIA A100-SXM4-80GB")[1] == 312.0
    assert dc.known_peak("AMD Instinct MI250X")[0] == "MI250X (one GCD)"
    assert dc.known_peak("AMD Instinct MI300X")[1] == 1307.4
    assert dc.known_peak("NVIDIA GeForce RTX 4090") == ("unknown", None)
    assert dc.known_peak("cpu") == ("unknown", None)


def test_cpu_mode_table(tmp_path, capsys):
    dc = _load()
    out = tmp_path / "check.json"
    # the CPU mode, one batch size and no compile to keep it short on the 2-core CI machine
    # (the compiled row is checked below); a budget no slow machine reaches, so every row is there
    assert dc.main(["--cpu", "--threads", "1", "--batch-sizes", "8", "--no-compile", "--mosaics", "20x=1x1,40x=1x1",
                    "--budget-s", "600", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.startswith("kind"))
    for column in ("tiles_per_s", "steps_per_s", "frac_gpu_peak", "frac_mm_peak", "peak_mem_gib"):
        assert column in header
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert data["machine"]["gpu_peak_label"] == "unknown"
    assert not [r for r in rows if r["note"].startswith(("error", "skipped: time"))], [r["note"] for r in rows]

    mm = {r["precision"]: r for r in rows if r["kind"] == "mm"}
    assert set(mm) == {"fp32", "bf16"} and all(_positive(r["tflops"]) for r in mm.values())

    forward = [r for r in rows if r["kind"] == "forward"]
    assert {(r["model"], r["precision"]) for r in forward} == {
        (m, p) for m in ("teacher-12", "twt-6", "twt-4") for p in ("fp32", "bf16")
    }
    for r in forward:
        assert r["batch"] == 8 and not r["compiled"]
        for key in ("tiles_per_s", "tflops", "frac_mm_peak", "peak_mem_gib"):
            assert _positive(r[key]), (key, r)
        assert r["frac_gpu_peak"] == "unknown"  # no GPU: no listed peak
        # the achieved rate is what the counted FLOPs say it is
        assert r["frac_mm_peak"] == pytest.approx(r["tflops"] / mm["bf16"]["tflops"])
    fwd = {(r["model"], r["precision"]): r["tiles_per_s"] for r in forward}
    # a 4-layer student has a third of the teacher's blocks: it cannot be slower than the teacher
    assert fwd[("twt-4", "fp32")] > fwd[("teacher-12", "fp32")]

    distill = [r for r in rows if r["kind"] == "distill"]
    assert len(distill) == 2
    for r in distill:
        assert _positive(r["steps_per_s"]) and _positive(r["tflops"])
        assert r["tiles_per_s"] == pytest.approx(r["steps_per_s"] * r["batch"])
        assert r["precision"] in ("bf16-autocast", "fp32")  # what the run trained in

    extract = [r for r in rows if r["kind"] == "extract"]
    if not SHARED_SLIDE.exists():
        assert len(extract) == 1 and extract[0]["note"].startswith("skipped")
        return
    decoders = [r for r in rows if r["kind"] == "decode"]
    # the device path's decoder here (the host stand-in), then libjpeg-turbo on one core
    assert [r["model"] for r in decoders] == ["host", "libjpeg-turbo, one core"]
    assert all(_positive(r["tiles_per_s"]) for r in decoders)
    assert decoders[0]["extra"]["refused"] == 0 and decoders[0]["extra"]["upsampling"] == "fancy"
    # the teacher and its TWT-6 student end to end on both mosaics, one reader: every row
    # of the device path (the host decoder standing in for the GPU's) before the CPU path's
    assert [(r["model"], r["extra"]["mosaic"], r["extra"]["decode"], r["workers"]) for r in extract] == [
        (m, k, d, 1) for d in ("host", "cpu") for m in ("teacher-12", "twt-6") for k in ("20x", "40x")]
    assert data["mosaics"]["20x"]["copies"] == [1, 1] and data["mosaics"]["20x"]["tiles"] > 0
    for r in extract:
        assert _positive(r["tiles_per_s"]) and _positive(r["tflops"]) and _positive(r["peak_mem_gib"]), r
        assert _positive(r["extra"]["readers_max_rss_gib"])
        # each row as a share of its own model-only rate, in the same precision
        assert r["extra"]["of_model_only"] == pytest.approx(r["tiles_per_s"] / r["extra"]["model_only_tiles_per_s"],
                                                            rel=1e-2, abs=1e-4)
        # the precision the features files record, and where their native tiles were decoded
        assert r["precision"] in ("bf16-autocast", "fp32")
        device, host = r["extra"]["natives_device"], r["extra"]["natives_host"]
        assert r["note"] == f"{r['extra']['mosaic']}, decode {r['extra']['decode']}, " \
                            f"{r['extra']['of_model_only']:.2f} of model-only; natives on device {device}, on host {host}"
        assert not r["extra"].get("fell_back")


def test_cpu_compiled_row(tmp_path):
    # the compiled rows' plumbing through torch.compile with the tracing-only backend (an
    # inductor build of even the tiny models takes minutes on the 2-core CI machine)
    dc = _load()
    out = tmp_path / "check.json"
    assert dc.main(["--cpu", "--threads", "1", "--batch-sizes", "8", "--compile-batch", "8", "--compile-backend",
                    "eager", "--skip", "mm,extract,distill", "--budget-s", "600", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    compiled = [r for r in rows if r["compiled"]]
    assert [(r["model"], r["precision"], r["batch"]) for r in compiled] == [("twt-4", "fp32", 8)], compiled
    assert _positive(compiled[0]["tiles_per_s"]) and compiled[0]["extra"]["compile_s"] >= 0
    assert compiled[0]["note"].startswith("compile ") and "(eager)" in compiled[0]["note"]


def test_cpu_mode_tiny_budget_travels(tmp_path, capsys, monkeypatch):
    """The run as a GPU machine receives it: no ../shared and no carried slide (the
    extraction rows say so), OpenSlide unusable (the tiles fall back), a budget of a
    second: the JSON and the versions first, the first measurement made and the budget
    stopping the rest. The run's clock is the test's (a second passes at each row), so a
    busy machine measures the same rows."""
    dc = _load()
    monkeypatch.setattr(dc, "SLIDE", tmp_path / "absent.svs")
    monkeypatch.setattr(dc.Run, "elapsed", lambda self: float(len(self.rows)))
    out = tmp_path / "check.json"
    assert dc.main(["--device", "cpu", "--cpu", "--threads", "1", "--batch-sizes", "8", "--no-compile",
                    "--budget-s", "1", "--hard-limit-s", "120", "--json", str(out)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    for word in ("torch ", "timm ", "CUDA ", "driver ", "/dev/shm ", "slide absent"):
        assert word in first, (word, first)
    data = json.loads(out.read_text())
    assert data["machine"]["dev_shm"] and data["machine"]["timm"]
    notes = [r["note"] for r in data["rows"]]
    assert any(n.startswith("skipped: time budget") for n in notes)  # the budget stopped new measurements
    measured = [r for r in data["rows"] if not r["note"].startswith("skipped")]
    assert measured and _positive(measured[0]["tflops"] or measured[0]["tiles_per_s"])  # the first always runs
    assert not any("Traceback" in n for n in notes)


def test_a_failing_phase_ends_only_itself(tmp_path, monkeypatch):
    dc = _load()

    def broken(run):
        raise ImportError("libopenslide.so.0: cannot open shared object file")

    monkeypatch.setattr(dc, "measure_extract", broken)
    out = tmp_path / "check.json"
    assert dc.main(["--device", "cpu", "--cpu", "--threads", "1", "--batch-sizes", "8", "--no-compile",
                    "--skip", "forward,distill", "--budget-s", "30", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["kind"] for r in rows] == ["mm", "mm", "extract"]
    assert rows[-1]["note"].startswith("phase error: ImportError: libopenslide")
    assert all(_positive(r["tflops"]) for r in rows[:2])


def test_hard_limit_stops_a_running_measurement(tmp_path, monkeypatch):
    import time

    dc = _load()

    def slow(run):
        time.sleep(30)

    monkeypatch.setattr(dc, "measure_mm", slow)
    out = tmp_path / "check.json"
    assert dc.main(["--device", "cpu", "--cpu", "--skip", "extract,distill,compile", "--batch-sizes", "8",
                    "--budget-s", "1", "--hard-limit-s", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["note"].startswith("phase error: OutOfTime: hard limit of")
    assert all(r["note"].startswith("skipped: time budget") for r in rows[1:])


def test_the_gpu_plan_measures_the_device_path_first(capsys):
    """--dry-run on any machine: the rows a GPU run measures, in order. The extraction
    phase comes first, and in it every GPU-decode row before any CPU-decode row."""
    dc = _load()
    assert dc.main(["--dry-run", "--device", "cuda", "--precisions", "bf16", "--batch-sizes", "256",
                    "--no-compile"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    kinds = [r["kind"] for r in rows]
    assert kinds[:2] == ["decode", "decode"] and kinds.index("mm") > max(i for i, k in enumerate(kinds) if k == "extract")
    paths = [r["device_path"] for r in rows if r["kind"] == "extract"]
    assert paths == sorted(paths, reverse=True) and paths[0] and not paths[-1]
    assert {r["decode"] for r in rows if r.get("device_path")} == {"gpu"}
    assert [r["kind"] for r in rows[-2:]] == ["distill", "distill"]
    # a CPU run keeps its order: matrix multiply and forward first
    assert dc.main(["--dry-run", "--cpu"]) == 0
    assert [r["kind"] for r in json.loads(capsys.readouterr().out)["rows"]][:2] == ["mm", "mm"]


def test_the_mosaics_are_shrunk_to_their_budget():
    from pathtwt.bench.mosaics import plan_mosaics

    wanted = {"20x": (5, 4), "40x": (7, 6)}
    assert plan_mosaics(wanted, 0.1, 100.0) == wanted  # 62 copies in 6.2 s
    small = plan_mosaics(wanted, 1.0, 30.0)
    assert sum(c * r for c, r in small.values()) <= 30 and all(c >= 1 and r >= 1 for c, r in small.values())
    assert plan_mosaics(wanted, 100.0, 1.0) == {"20x": (1, 1), "40x": (1, 1)}  # never below one copy


def _features(path, **attrs):
    import h5py

    with h5py.File(path, "w") as h5:
        h5.attrs.update(attrs)
    return path


def test_a_device_path_row_that_fell_back_is_marked_and_gives_no_rate(tmp_path):
    dc = _load()

    def row(decode):
        return dc.Row(kind="extract", model="twt-6", precision="bf16-autocast", batch=256,
                      extra={"decode": decode, "mosaic": "20x"})

    ok = [_features(tmp_path / f"a{i}.h5", natives_decoded_device=100, natives_decoded_host=0, decode_fallback="",
                    precision="bf16-autocast") for i in range(2)]
    record = dc.decode_record(ok)
    assert record == {"natives_device": 200, "natives_host": 0, "fallback": "", "precision": "bf16-autocast"}
    r = row("gpu")
    dc.record_row(r, 900.0, record, 1000.0)
    assert r.tiles_per_s == 900.0 and r.note == "20x, decode gpu, 0.90 of model-only; natives on device 200, on host 0"
    fell = ok[:1] + [_features(tmp_path / "b.h5", natives_decoded_device=3, natives_decoded_host=97, precision="fp32",
                               decode_fallback="the GPU decoder's pixels differ from libjpeg's by 40 grey levels")]
    r = row("gpu")
    dc.record_row(r, 900.0, dc.decode_record(fell), 1000.0)
    assert r.tiles_per_s is None and r.extra["fell_back"] and r.precision == "bf16-autocast, fp32"
    assert r.note.startswith("20x, decode gpu: FELL BACK (b: the GPU decoder's pixels differ") and "on host 97" in r.note
    # files that record nothing say so, and a CPU-decode row's host natives are its own
    silent = dc.decode_record([_features(tmp_path / "c.h5", precision="fp32")])
    assert silent == {"natives_device": "not recorded", "natives_host": "not recorded", "fallback": "not recorded",
                      "precision": "fp32"}
    r = row("cpu")
    dc.record_row(r, 500.0, silent, 1000.0)
    assert r.tiles_per_s == 500.0 and r.note.endswith("natives on device not recorded, on host not recorded")
