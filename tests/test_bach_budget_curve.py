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


def test_the_hold_out_design_draws_only_compression_images_and_stops_when_flat():
    """--holdout: the curve's training and validation images are the study's compression
    hold-out (the images no fold reports on), and --every stops a run whose validation R^2
    gained less than --min-gain over --window steps."""
    import argparse
    import importlib.util

    import numpy as np
    import pandas as pd

    labels = _need(SHARED / "data" / "bach" / "labels.csv")
    spec = importlib.util.spec_from_file_location("bach_budget_curve", REPO / "benchmarks" / "bach_budget_curve.py")
    curve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(curve)
    from pathtwt.mil.folds import HOLDOUT, assign_folds

    parts = curve.split_images(0, holdout=0.2, folds=5)
    table = pd.read_csv(labels, dtype={"slide_id": str})
    held = set(table.slide_id[assign_folds(list(table.slide_id), table.label.to_numpy(), 5, 0, None, 0.2) == HOLDOUT])
    used = {sid for name in ("train", "val") for sid, _ in parts[name]}
    assert used == held and not parts["test"]
    assert len(parts["val"]) == 12 and len(parts["train"]) == 28  # a quarter of each class's 10, rounded up
    assert np.bincount([y for _, y in parts["val"]]).tolist() == [3, 3, 3, 3]
    args = argparse.Namespace(window=200, min_gain=0.01)
    rising = [{"step": s, "val_r2": v} for s, v in ((100, 0.05), (200, 0.25), (300, 0.30))]
    assert not curve.flat(rising, args)  # +0.25 over the last 200 steps
    assert curve.flat(rising + [{"step": 400, "val_r2": 0.255}], args)  # +0.005 since step 200
