"""benchmarks/bach_budget_curve.py runs on the current compression API: a tiny budget of
each method on the real BACH images and ViT-S writes rows a reader can trust (the teacher
at R^2 1, the constant at 0, each student finite, probe accuracies in [0, 1])."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

from conftest import SHARED, _need

REPO = Path(__file__).resolve().parents[1]


def test_the_budget_curve_runs_each_method_and_writes_its_reference_rows(tmp_path):
    _need(SHARED / "data" / "bach" / "labels.csv")
    _need(SHARED / "weights" / "vit_s14_imgfocus.safetensors")
    out = tmp_path / "curve"
    cmd = [sys.executable, str(REPO / "benchmarks" / "bach_budget_curve.py"), "--out", str(out), "--tag", "tiny",
           "--probe-tiles", "1", "--batch-size", "4", "--references", "--threads", "2",
           "--runs", "twt:variance:8:2:1", "truncation:variance:8:1"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATHTWT_SHARED": str(SHARED)}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {(r["run"], r.get("step", "")): r for r in csv.DictReader(open(out / "tiny.csv"))}
    assert float(rows["teacher", ""]["test_r2"]) == 1.0 and float(rows["constant", ""]["test_r2"]) == 0.0
    # twt scored at its checkpoint (step 1) and at the end (step 2); truncation at the end
    assert {k for k in rows if k[0].startswith(("twt", "truncation"))} == {
        ("twt:variance:8:2:1", "1"), ("twt:variance:8:2:1", "2"), ("truncation:variance:8:1", "1")}
    for (run, _), r in rows.items():
        assert math.isfinite(float(r["val_r2"])) and 0.0 <= float(r["test_bacc"]) <= 1.0, run
    assert float(rows["random-init", ""]["test_r2"]) < 0.0  # random weights are worse than the constant
