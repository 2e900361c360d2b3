"""pathtwt bench and the measurement primitives under it: the rows it writes as it measures,
what bounds a row and a student's speed-up against its MAC ratio, its one-line errors
(an unknown backbone or variant, a GPU asked on a CPU machine, an unreadable slide), an
interrupted run's rows, and benchmarks/bench_agreement.py in its smallest mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pathtwt.bench import results, timing, variants
from pathtwt.cli import main
from pathtwt.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
# the tiny ViT (width 64, 12 blocks, 56 px): seconds a measurement
TINY = ["--backbone", "vit-s14-tiny", "--batch-sizes", "4", "--device", "cpu"]


def test_steady_state_cancels_the_fixed_cost(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])

    def job(copies: int) -> str:  # 5 s to start, 2 s a copy
        clock[0] += 5.0 + 2.0 * copies
        return f"{copies} copies"

    steady = timing.steady_state(job, 1, 3)
    assert steady.unit_s == 2.0 and steady.fixed_s == 5.0 and steady.large_result == "3 copies"
    assert steady.rate(100) == 50.0
    with pytest.raises(ValueError):
        timing.steady_state(job, 3, 3)


def test_seconds_per_call_fills_its_window(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    calls = []

    def fn():
        calls.append(1)
        clock[0] += 0.25

    assert timing.seconds_per_call(fn, 1.0, warmup=1, rounds=2) == 0.25
    assert len(calls) == 1 + 1 + 2 * 4  # warm-up, the estimate, two rounds filling 1 s


def test_a_results_file_holds_whole_rows_only(tmp_path):
    out = results.ResultsFile(tmp_path / "r.json", {"device": "cpu"}, text_path=tmp_path / "r.md",
                              render=lambda rows, facts: f"{len(rows)} rows on {facts['device']}\n")
    out.add({"kind": "model", "tiles_per_s": 1.5})
    out.update(seconds=2.0)
    assert json.loads((tmp_path / "r.json").read_text()) == {"device": "cpu", "seconds": 2.0,
                                                             "rows": [{"kind": "model", "tiles_per_s": 1.5}]}
    assert (tmp_path / "r.md").read_text() == "1 rows on cpu\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.md"]  # no temporary left


def test_variants_by_name_and_from_a_config(tmp_path):
    assert variants.parse_variant("uncompressed", 12) == variants.Variant("uncompressed", None)
    assert variants.parse_variant("twt-6", 12).depth == 6 and variants.parse_variant("raptor-4", 12).depth is None
    assert variants.parse_variant("twt-12", 12).is_teacher
    with pytest.raises(ConfigError, match=r"^unknown variant 'twt6'; variants: uncompressed, or METHOD-K with METHOD "
                                          r"one of twt, .* and K from 1 to 12$"):
        variants.parse_variant("twt6", 12)
    config = tmp_path / "study.yaml"
    config.write_text("backbones:\n  h0-mini: {variants: [uncompressed, twt-5]}\n"
                      "variants:\n  uncompressed: {method: none}\n  twt-5: {method: twt, depth: 5}\n"
                      "  nose: {method: nose}\n")
    backbones, named = variants.from_config(config)
    assert backbones == {"h0-mini": ["uncompressed", "twt-5"]} and variants.parse_variant("twt-5", 12, named).depth == 5
    with pytest.raises(ConfigError, match="its cost is not a plain ViT's"):
        variants.parse_variant("nose", 12, named)


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


def test_unknown_names_are_one_line_with_the_names_that_exist(capsys, tmp_path):
    err = _one_line_error(capsys, ["bench", "--backbone", "h0-maxi", "--out", str(tmp_path / "b"), "--device", "cpu"])
    assert "unknown backbone 'h0-maxi'; backbones:" in err and "h0-mini" in err and "vit-s14-imgfocus" in err
    err = _one_line_error(capsys, ["bench", *TINY, "--variants", "twt-99", "--out", str(tmp_path / "b")])
    assert "depth 99 is not within 1 and the teacher's 12" in err
    err = _one_line_error(capsys, ["bench", *TINY, "--variants", "pruned", "--out", str(tmp_path / "b")])
    assert "unknown variant 'pruned'; variants: uncompressed, or METHOD-K" in err
    assert not (tmp_path / "b.json").exists()


def test_cuda_on_a_cpu_machine_is_one_line(capsys, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = _one_line_error(capsys, ["bench", "--device", "cuda", "--out", str(tmp_path / "b")])
    assert "--device cuda: no CUDA device is visible" in err


def test_an_unreadable_slide_is_one_line_and_the_model_rows_still_run(capsys, tmp_path):
    slide = tmp_path / "broken.svs"
    slide.write_bytes(b"II*\x00" + b"\x00" * 64)
    assert main(["bench", *TINY, "--variants", "uncompressed", "--slide", str(slide), "--out", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "cannot read the slide" in line][0].startswith(
        f"pathtwt bench: {slide}: cannot read the slide (")
    data = json.loads((tmp_path / "b.json").read_text())
    assert [r["kind"] for r in data["rows"]] == ["model"] and data["rows"][0]["tiles_per_s"] > 0
    assert "cannot read the slide" in data["slide"] and (tmp_path / "b.png").stat().st_size > 0


def test_an_interrupted_bench_leaves_the_rows_so_far(capsys, tmp_path, monkeypatch):
    from pathtwt.bench import throughput

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(throughput, "extraction_rate", stop)
    code = main(["bench", *TINY, "--variants", "uncompressed,twt-6", "--mosaics", "20x=1x1",
                 "--out", str(tmp_path / "b")])
    assert code == 130
    data = json.loads((tmp_path / "b.json").read_text())
    assert [r["kind"] for r in data["rows"]] == ["model", "model", "decode", "decode"]
    assert all(set(r) == set(data["rows"][0]) for r in data["rows"])  # whole rows only
    assert "| model | vit-s14-tiny | twt-6 |" in (tmp_path / "b.md").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.slow  # about a minute on a busy 2-core machine: nine extraction jobs
def test_a_small_bench_end_to_end(capsys, tmp_path, shared_slides):
    out = tmp_path / "b"
    assert main(["bench", *TINY, "--variants", "twt-6", "--mosaics", "20x=1x1",
                 "--slide", str(shared_slides / "CMU-1-Small-Region.svs"), "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    kinds = [(r["kind"], r["variant"]) for r in data["rows"]]
    # the teacher is measured for its student's speed-up, though only the student was named
    assert kinds[:2] == [("model", "uncompressed"), ("model", "twt-6")]
    assert ("readers", "readers alone") in kinds
    e2e = {r["variant"]: r for r in data["rows"] if r["kind"] == "end-to-end"}
    assert set(e2e) == {"uncompressed", "twt-6"} and all(r["tiles_per_s"] > 0 for r in e2e.values())
    student = e2e["twt-6"]
    assert student["mac_ratio"] > 1.5 and student["speedup"] > 0 and isinstance(student["reaches_goal"], bool)
    assert student["bound"] in ("reading", "model") and f"bound by {student['bound']}" in student["note"]
    assert [c["name"] for c in data["machine"]][:2] == ["python", "torch"]
    table = out.with_suffix(".md").read_text()
    assert "| end-to-end | vit-s14-tiny | twt-6 | 20x |" in table and "Machine (pathtwt doctor):" in table
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_bench_agreement_in_its_smallest_mode(tmp_path):
    out = tmp_path / "agreement.json"
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_agreement.py"), "--quick", "--json",
                          str(out)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(out.read_text())
    assert set(data) == {"backbone", "batch", "precision", "device", "bench_tiles_per_s", "timm_tiles_per_s", "ratio",
                         "within_10_percent", "rounds", "seconds"}
    assert data["bench_tiles_per_s"] > 0 and data["timm_tiles_per_s"] > 0
    assert data["ratio"] == pytest.approx(data["bench_tiles_per_s"] / data["timm_tiles_per_s"], rel=1e-2)
    assert f"ratio {data['ratio']}" in res.stdout
