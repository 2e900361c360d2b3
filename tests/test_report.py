"""`pathtwt report` on small fabricated results folders: the numbers in the tables are
the means, standard deviations and deltas of the metrics files, and the page shows the
figures that exist."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest

from pathtwt.cli import main
from pathtwt.io.atomic import write_json_atomic
from pathtwt.report.html import attention_grid

# (variant, head) -> internal-test QWK per seed, external QWK per seed
QWK = {
    ("uncompressed", "abmil"): ([0.80, 0.82, 0.84], [0.70, 0.72, 0.74]),
    ("twt-6", "abmil"): ([0.79, 0.80, 0.81], [0.71, 0.71, 0.71]),
    ("uncompressed", "transmil"): ([0.60, 0.70, 0.80], [0.50, 0.60, 0.70]),
    ("twt-6", "transmil"): ([0.65, 0.65, 0.65], [0.55, 0.55, 0.55]),
}


def _metrics(test: float, ext: float) -> dict:
    cohorts = {
        "val": {"qwk": 0.0, "accuracy": 0.0},
        "test": {"qwk": test, "accuracy": test / 2},
        "grading-external": {"qwk": ext, "accuracy": None},
    }
    return {"format": "pathtwt-mil-metrics/1", "cohorts": cohorts}


def _fabricate(results: Path) -> None:
    for (variant, head), (tests, exts) in QWK.items():
        for seed, (t, e) in enumerate(zip(tests, exts)):
            run = results / "mil" / "vit-s14-tiny" / variant / "grading" / head / f"seed{seed}"
            write_json_atomic(run / "metrics.json", _metrics(t, e))
            if variant == "uncompressed" and head == "abmil" and seed == 0:
                with h5py.File(_mk(run / "attention" / "test.h5"), "w") as h5:
                    g = h5.create_group("slide_a")
                    g.create_dataset("attention", data=np.array([0.1, 0.5, 0.4], np.float32))
                    g.create_dataset("coords", data=np.array([[0, 0], [112, 0], [112, 112]], np.int64))
                    g.attrs["label"], g.attrs["prediction"] = 3, 2
    write_json_atomic(
        results / "models" / "vit-s14-tiny" / "twt-6" / "model.json",
        {"method": "twt", "depth": 6, "params": 1_234_567, "macs_per_tile": 2_500_000_000,
         "teacher_weights_sha256": None, "provenance": {"teacher": "vit-s14-tiny", "teacher_source": "random init"}},
    )
    # An unfinished run (no metrics.json yet) and a temporary file must both be ignored.
    (results / "mil" / "vit-s14-tiny" / "twt-6" / "grading" / "abmil" / "seed9").mkdir(parents=True)
    _png(results / "discovery" / "vit-s14-tiny" / "similarity.png")
    write_json_atomic(results / "discovery" / "vit-s14-tiny" / "similarity.json",
                      {"figure": "similarity.png", "caption": "SIDE-CAPTION of the similarity"})
    _png(results / "thumbnails" / "grading" / "slide_a.png")
    _png(results / "thumbnails" / "grading" / ".slide_b.png.tmp-x.png")


def _mk(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _png(path: Path) -> None:
    from PIL import Image

    Image.new("RGB", (8, 8), (200, 100, 150)).save(_mk(path))


def _std(values: list[float]) -> float:
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def test_report_tables_hold_mean_std_delta_and_cost(tmp_path):
    results, out = tmp_path / "results", tmp_path / "report"
    _fabricate(results)
    assert main(["report", "--results", str(results), "--out", str(out), "--metric", "grading=qwk"]) == 0

    rows = {(r["variant"], r["head"]): r for r in csv.DictReader(open(out / "grading.csv"))}
    assert set(rows) == set(QWK)
    for key, (tests, exts) in QWK.items():
        r = rows[key]
        assert float(r["test_qwk_mean"]) == pytest.approx(np.mean(tests))
        assert float(r["test_qwk_std"]) == pytest.approx(_std(tests))
        assert float(r["grading-external_qwk_mean"]) == pytest.approx(np.mean(exts))
        assert r["n_seeds"] == "3"  # the unfinished seed9 is not counted
        base_tests = QWK[("uncompressed", key[1])][0]
        assert float(r["test_qwk_delta"]) == pytest.approx(np.mean(tests) - np.mean(base_tests))
    assert "val_qwk_mean" not in rows[("twt-6", "abmil")]  # validation is not a reported cohort
    assert rows[("twt-6", "abmil")]["params"] == "1234567"
    # the uncompressed teacher is counted on its architecture by the project's counter
    from pathtwt.models.flops import describe_cost, meta_model

    teacher = describe_cost(meta_model("vit-s14-tiny"))
    assert int(rows[("uncompressed", "abmil")]["params"]) == teacher["params"]
    assert int(rows[("uncompressed", "abmil")]["macs_per_tile"]) == teacher["macs_per_tile"]

    md = (out / "grading.md").read_text()
    assert "0.820 ± 0.020" in md  # uncompressed ABMIL internal test
    assert "-0.020" in md  # twt-6 ABMIL delta on the internal test
    assert "2.50" in md  # GMACs of twt-6
    assert md.index("uncompressed") < md.index("twt-6")

    page = (out / "index.html").read_text()
    assert "RANDOM weights" in page  # the teacher had no pretrained weights: said plainly
    assert "attention matmuls" in page and "QK^T" in page
    assert "SIDE-CAPTION of the similarity" in page
    assert (out / "figures" / "similarity_vit-s14-tiny.png").is_file()
    assert (out / "figures" / "thumb_grading_slide_a.png").is_file()
    assert not list((out / "figures").glob("*slide_b*"))
    assert (out / "figures" / "attention_grading_slide_a.png").is_file()


def test_report_without_runs_is_a_one_line_error(tmp_path, capsys):
    assert main(["report", "--results", str(tmp_path), "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err.strip()
    assert "no finished MIL runs" in err and len(err.splitlines()) == 1


def test_attention_grid_places_scores_on_the_tile_grid():
    grid = attention_grid(np.array([[100, 50], [356, 50], [356, 306]]), np.array([1.0, 2.0, 3.0]))
    assert grid.shape == (2, 2)
    assert grid[0, 0] == 1.0 and grid[0, 1] == 2.0 and grid[1, 1] == 3.0
    assert math.isnan(grid[1, 0])


def test_report_table_in_markdown_names_missing_cohort_values(tmp_path):
    results = tmp_path / "results"
    _fabricate(results)
    main(["report", "--results", str(results), "--out", str(tmp_path / "r"), "--metric", "grading=qwk"])
    data = json.loads(json.dumps(list(csv.DictReader(open(tmp_path / "r" / "grading.csv")))))
    # accuracy is None in every external metrics entry: mean is NaN, shown as n/a
    assert all(math.isnan(float(r["grading-external_accuracy_mean"])) for r in data)
    assert "n/a" in (tmp_path / "r" / "grading.md").read_text()
