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
from pathtwt.explain.grid import attention_grid

# (variant, head) -> internal-test QWK per seed, external QWK per seed
QWK = {
    ("uncompressed", "abmil"): ([0.80, 0.82, 0.84], [0.70, 0.72, 0.74]),
    ("twt-6", "abmil"): ([0.79, 0.80, 0.81], [0.71, 0.71, 0.71]),
    ("uncompressed", "transmil"): ([0.60, 0.70, 0.80], [0.50, 0.60, 0.70]),
    ("twt-6", "transmil"): ([0.65, 0.65, 0.65], [0.55, 0.55, 0.55]),
}


N_CLASSES = 6
# true grades of the fabricated cohorts' slides
LABELS = {"val": [0, 1, 2], "test": [0, 0, 1, 2, 3, 3, 4, 5], "grading-external": [1, 1, 2, 3, 4, 5]}
# (variant, head, seed) whose head predicts grade 2 for every external slide
SINGLE_CLASS = {("twt-6", "transmil", 0), ("twt-6", "transmil", 1)}


def _metrics(test: float, ext: float) -> dict:
    cohorts = {
        "val": {"qwk": 0.0, "accuracy": 0.0, "n_slides": 3},
        "test": {"qwk": test, "accuracy": test / 2, "balanced_accuracy": test / 3, "auc_macro": 0.9, "n_slides": 8},
        "grading-external": {"qwk": ext, "accuracy": ext / 2, "balanced_accuracy": ext / 3, "auc_macro": None,
                             "n_slides": 6},
    }
    return {"format": "pathtwt-mil-metrics/1", "n_classes": N_CLASSES, "cohorts": cohorts}


def _prediction(cohort: str, i: int, y: int, variant: str, head: str, seed: int) -> int:
    """A run's prediction of slide i: right on most slides, off by a grade on a seed-dependent few."""
    if cohort == "grading-external" and (variant, head, seed) in SINGLE_CLASS:
        return 2
    return y if (i + seed) % 3 else min(y + 1, N_CLASSES - 1)


def _predictions(variant: str, head: str, seed: int) -> str:
    """predictions.csv of a run."""
    lines = ["slide_id,cohort,label,prediction," + ",".join(f"prob_{c}" for c in range(N_CLASSES))]
    for cohort, labels in LABELS.items():
        for i, y in enumerate(labels):
            pred = _prediction(cohort, i, y, variant, head, seed)
            # the head is surer of later slides: the attention figures pick the surest right one
            top = 0.5 + 0.05 * i
            probs = [top if c == pred else (1 - top) / (N_CLASSES - 1) for c in range(N_CLASSES)]
            lines.append(f"{cohort}_s{i},{cohort},{y},{pred}," + ",".join(map(str, probs)))
    return "\n".join(lines) + "\n"


def _features(path: Path, precision: str, n_tiles: int, rate: float | None, device: str = "cpu") -> None:
    with h5py.File(_mk(path), "w") as h5:
        h5.create_dataset("features", data=np.zeros((n_tiles, 4), np.float32))
        h5.attrs["precision"], h5.attrs["n_tiles"] = precision, n_tiles
        if rate is not None:  # as `pathtwt extract` records its timing and conditions
            h5.attrs["extract_seconds"], h5.attrs["torch_threads"] = n_tiles / rate, 1
            h5.attrs["device"], h5.attrs["gpu_name"] = device, ""


def _fabricate(results: Path, random_init: bool = True) -> None:
    runs = dict(QWK)
    if random_init:
        runs.update({("random-init", "abmil"): ([0.3, 0.3, 0.3], [0.2, 0.2, 0.2]),
                     ("random-init", "transmil"): ([0.25, 0.25, 0.25], [0.1, 0.1, 0.1])})
    for (variant, head), (tests, exts) in runs.items():
        for seed, (t, e) in enumerate(zip(tests, exts)):
            run = results / "mil" / "vit-s14-tiny" / variant / "grading" / head / f"seed{seed}"
            write_json_atomic(run / "metrics.json", _metrics(t, e))
            (run / "predictions.csv").write_text(_predictions(variant, head, seed))
            _attention(run / "attention" / "test.h5",
                       [(f"test_s{i}", y, _prediction("test", i, y, variant, head, seed)) for i, y in enumerate(LABELS["test"])],
                       uniform=(variant, head) == ("twt-6", "transmil"))
    write_json_atomic(
        results / "models" / "vit-s14-tiny" / "twt-6" / "model.json",
        {"method": "twt", "timm_kwargs": {"depth": 6}, "params": 1_234_567, "macs_per_tile": 2_500_000_000,
         "teacher_weights_sha256": None, "provenance": {"teacher": "vit-s14-tiny", "teacher_source": "random init",
                                                        "options": {"distill": {"precision": "bf16"}}}},
    )
    # twt-6: one job (cohort) of two slides, 30 tiles in 3 s and 10 tiles in 0.2 s (12.5 tiles/s), and one of
    # 10 tiles at 47.5/s: the median of the jobs is 30 tiles/s
    _features(results / "features" / "vit-s14-tiny" / "twt-6" / "grading" / "s1.h5", "bf16-autocast", 30, 10.0)
    _features(results / "features" / "vit-s14-tiny" / "twt-6" / "grading" / "s2.h5", "bf16-autocast", 10, 50.0)
    _features(results / "features" / "vit-s14-tiny" / "twt-6" / "grading-external" / "s3.h5", "bf16-autocast", 10, 47.5)
    _features(results / "features" / "vit-s14-tiny" / "uncompressed" / "grading" / "s1.h5", "fp32", 30, None)
    # An unfinished run (no metrics.json yet) and a temporary file must both be ignored.
    (results / "mil" / "vit-s14-tiny" / "twt-6" / "grading" / "abmil" / "seed9").mkdir(parents=True)
    _png(results / "discovery" / "vit-s14-tiny" / "similarity.png")
    write_json_atomic(results / "discovery" / "vit-s14-tiny" / "similarity.json",
                      {"figure": "similarity.png", "caption": "SIDE-CAPTION of the similarity"})
    _png(results / "thumbnails" / "grading" / "test_s5.png")
    with h5py.File(_mk(results / "tiles" / "grading" / "test_s5.h5"), "w") as h5:
        h5.attrs["level0_width"], h5.attrs["level0_height"] = 448, 448
    _png(results / "thumbnails" / "grading" / ".slide_b.png.tmp-x.png")


def _attention(path: Path, slides: list[tuple[str, int, int]], uniform: bool = False) -> None:
    """An attention file as `pathtwt train-mil` writes it: three tiles per slide, one of
    them holding most of the attention (all alike with ``uniform``)."""
    with h5py.File(_mk(path), "w") as h5:
        for slide, label, pred in slides:
            g = h5.create_group(slide)
            g.create_dataset("attention", data=np.array([0.34, 0.33, 0.33] if uniform else [0.1, 0.8, 0.1], np.float32))
            g.create_dataset("coords", data=np.array([[0, 0], [112, 0], [112, 112]], np.int64))
            g.attrs["label"], g.attrs["prediction"] = label, pred


def _mk(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _png(path: Path) -> None:
    from PIL import Image

    Image.new("RGB", (8, 8), (200, 100, 150)).save(_mk(path))


def _std(values: list[float]) -> float:
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    results, out = tmp / "results", tmp / "report"
    _fabricate(results)
    assert main(["report", "--results", str(results), "--out", str(out), "--metric", "grading=qwk"]) == 0
    return results, out


def _records(out: Path) -> dict:
    return {(r["variant"], r["head"]): r for r in csv.DictReader(open(out / "grading.csv"))}


def test_report_tables_hold_mean_std_delta_and_cost(report):
    results, out = report
    rows = _records(out)
    assert set(rows) == set(QWK) | {("random-init", "abmil"), ("random-init", "transmil"), ("chance", "-")}
    for key, (tests, exts) in QWK.items():
        r = rows[key]
        assert float(r["test_qwk_mean"]) == pytest.approx(np.mean(tests))
        assert float(r["test_qwk_std"]) == pytest.approx(_std(tests))
        assert float(r["grading-external_qwk_mean"]) == pytest.approx(np.mean(exts))
        assert float(r["test_balanced_accuracy_mean"]) == pytest.approx(np.mean(tests) / 3)
        assert r["n_seeds"] == "3"  # the unfinished seed9 is not counted
        assert r["test_n_slides"] == "8.0" and r["grading-external_n_slides"] == "6.0"
        base_tests = QWK[("uncompressed", key[1])][0]
        assert float(r["test_qwk_delta"]) == pytest.approx(np.mean(tests) - np.mean(base_tests))
        lo, hi = float(r["test_qwk_delta_ci95_low"]), float(r["test_qwk_delta_ci95_high"])
        if key[0] == "uncompressed":
            assert np.isnan(lo) and np.isnan(hi)  # no difference of the teacher with itself
        else:  # paired over the same slides, from the runs' predictions.csv
            assert lo <= hi and lo < 0.5 and hi > -0.5
    assert "val_qwk_mean" not in rows[("twt-6", "abmil")]  # validation is not a reported cohort
    assert rows[("twt-6", "abmil")]["params"] == "1234567"
    # the uncompressed teacher and the random-init backbone are counted on the architecture
    from pathtwt.models.flops import describe_cost, meta_model

    teacher = describe_cost(meta_model("vit-s14-tiny"))
    for variant in ("uncompressed", "random-init"):
        assert int(rows[(variant, "abmil")]["params"]) == teacher["params"]
        assert int(rows[(variant, "abmil")]["macs_per_tile"]) == teacher["macs_per_tile"]
    assert float(rows[("random-init", "abmil")]["test_qwk_delta"]) == pytest.approx(0.3 - 0.82)

    md = (out / "grading.md").read_text()
    assert "0.820 ± 0.020 [" in md  # uncompressed ABMIL internal test, with its interval
    assert "-0.020 [" in md  # twt-6 ABMIL delta on the internal test, with its paired interval
    assert "2.50" in md  # GMACs of twt-6

    page = (out / "index.html").read_text()
    assert "RANDOM weights" in page  # the teacher had no pretrained weights: said plainly
    assert "attention matmuls" in page and "QK^T" in page
    assert "SIDE-CAPTION of the similarity" in page
    assert (out / "figures" / "similarity_vit-s14-tiny.png").is_file()
    assert (out / "figures" / "thumb_grading_test_s5.png").is_file()
    assert not list((out / "figures").glob("*slide_b*"))


def _body(out: Path, name: str = "grading") -> tuple[list[str], list[list[str]]]:
    from pathtwt.report.markdown import parse_tables

    tables = parse_tables((out / "tables.md").read_text())
    return next(v for k, v in tables.items() if k.startswith(name))


def test_rows_are_ordered_with_reference_rows_and_chance_last(report):
    header, body = _body(report[1])
    keys = [(cells[1], cells[2]) for cells in body]
    assert keys == [
        ("uncompressed (teacher)", "abmil"), ("twt-6", "abmil"), ("random-init (floor)", "abmil"),
        ("uncompressed (teacher)", "transmil"), ("twt-6", "transmil"), ("random-init (floor)", "transmil"),
        ("chance (reference)", "-"),
    ]
    chance = dict(zip(header, body[-1]))
    # QWK 0, balanced accuracy 1 / (classes present), AUC 0.5
    assert chance["QWK internal test [95% CI]"] == "0.000"
    assert chance["BAcc internal test"] == f"{1 / 6:.3f}" and chance["BAcc grading-external"] == f"{1 / 5:.3f}"
    assert chance["AUC internal test"] == "0.500"
    assert chance["Slides internal test"] == "8" and chance["Slides grading-external"] == "6"
    page = (report[1] / "index.html").read_text()
    assert page.count("<tr class='reference'>") >= 5  # teacher, floor (x2 heads) and chance


def test_chance_accuracy_is_the_majority_class_share():
    from pathtwt.mil.metrics import chance_metrics

    c = chance_metrics([0, 0, 0, 1], 2)
    assert c["accuracy"] == 0.75 and c["balanced_accuracy"] == 0.5 and c["qwk"] == 0.0 and c["auc_macro"] == 0.5


def test_single_class_runs_are_flagged(report):
    header, body = _body(report[1])
    cells = {(c[1], c[2]): dict(zip(header, c)) for c in body}
    assert "⚠2/2" not in cells[("twt-6", "abmil")]["QWK grading-external [95% CI]"]
    # both seeds of twt-6 TransMIL predicted grade 2 for every external slide (3 seeds: 2 of 3)
    assert "⚠2/3" in cells[("twt-6", "transmil")]["QWK grading-external [95% CI]"]
    assert "⚠" not in cells[("twt-6", "transmil")]["QWK internal test [95% CI]"]
    md = (report[1] / "tables.md").read_text()
    assert "vit-s14-tiny/twt-6/transmil on grading-external (2 of 3 seeds)" in md
    assert "<td class='flag'>" in (report[1] / "index.html").read_text()


def test_interval_is_the_bootstrap_of_the_seed_mean_from_predictions(report):
    from pathtwt.mil.metrics import bootstrap_interval
    from pathtwt.mil.summary import read_predictions

    results, out = report
    rows = _records(out)
    preds = [read_predictions(results / "mil" / "vit-s14-tiny" / "twt-6" / "grading" / "abmil" / f"seed{s}")["test"]
             for s in range(3)]
    order = np.argsort(preds[0]["slide_id"])
    lo, hi = bootstrap_interval(preds[0]["label"][order], [p["prediction"][order] for p in preds], "qwk", N_CLASSES)
    assert float(rows[("twt-6", "abmil")]["test_qwk_ci95_low"]) == pytest.approx(lo)
    assert float(rows[("twt-6", "abmil")]["test_qwk_ci95_high"]) == pytest.approx(hi)
    assert lo < hi <= 1.0


def test_precision_and_throughput_columns(report):
    header, body = _body(report[1])
    cells = {(c[1], c[2]): dict(zip(header, c)) for c in body}
    twt = cells[("twt-6", "abmil")]
    assert twt["Extracted"] == "bf16-autocast" and twt["Distilled"] == "bf16"
    assert twt["tiles/s"] == "30.0"  # the median of the two jobs, 12.5 and 47.5 tiles/s
    teacher = cells[("uncompressed (teacher)", "abmil")]
    assert teacher["Extracted"] == "fp32" and teacher["Distilled"] == "-" and teacher["tiles/s"] == "-"
    # the measurement states its conditions under the table, and the CSV has the spread
    md = (report[1] / "grading.md").read_text()
    assert "median over a variant's extraction jobs (one per cohort; 2 per variant)" in md
    assert "on cpu with 1 CPU thread per job" in md and "not comparable" not in md
    record = _records(report[1])[("twt-6", "abmil")]
    assert float(record["tiles_per_second_min"]) == 12.5 and float(record["tiles_per_second_max"]) == 47.5
    assert record["tiles_per_second_jobs"] == "2" and record["extraction_devices"] == "cpu"


def test_throughput_of_one_job_or_of_other_devices_is_said_to_be_not_comparable(tmp_path):
    results, out = tmp_path / "results", tmp_path / "report"
    _fabricate(results)
    (results / "features" / "vit-s14-tiny" / "twt-6" / "grading-external" / "s3.h5").unlink()
    assert main(["report", "--results", str(results), "--out", str(out), "--metric", "grading=qwk"]) == 0
    header, body = _body(out)
    twt = next(dict(zip(header, c)) for c in body if c[1] == "twt-6")
    assert twt["tiles/s"] == "12.5 (not comparable)"  # one job: a single timing ranks nothing
    assert "Marked not comparable: a variant was timed in a single extraction job" in (out / "grading.md").read_text()

    # two jobs each, but the teacher's on a GPU: the variants' rates do not compare
    _features(results / "features" / "vit-s14-tiny" / "twt-6" / "grading-external" / "s3.h5", "bf16-autocast", 10, 47.5)
    for cohort in ("grading", "grading-external"):
        _features(results / "features" / "vit-s14-tiny" / "uncompressed" / cohort / "s1.h5", "fp32", 30, 900.0,
                  device="cuda:0")
    assert main(["report", "--results", str(results), "--out", str(out), "--metric", "grading=qwk"]) == 0
    header, body = _body(out)
    rates = {c[1]: dict(zip(header, c))["tiles/s"] for c in body}
    assert rates["twt-6"] == "30.0 (not comparable)" and rates["uncompressed (teacher)"] == "900.0 (not comparable)"
    assert "extracted on different devices or CPU threads" in (out / "grading.md").read_text()


def _figure_captions(page: str) -> dict[str, str]:
    """figure file -> caption text (tags dropped) of the page's MIL attention figures."""
    import html
    import re

    found = re.findall(r'<img src="figures/(attention_[^"]+)"[^>]*><figcaption>(.*?)</figcaption>', page)
    return {name: html.unescape(re.sub(r"<[^>]+>", "", caption)) for name, caption in found}


def test_attention_shows_the_surest_right_slide_of_each_class(report):
    results, out = report
    captions = _figure_captions((out / "index.html").read_text())
    # the teacher's ABMIL, seed 0, is right on test slides 1, 2, 4, 5 and 7 (classes 0, 1, 3, 3, 5), and
    # surer of slide 5 than of slide 4
    assert sorted(captions) == [f"attention_grading_test_s{i}.png" for i in (1, 2, 5, 7)]
    assert sorted(p.name for p in (out / "figures").glob("attention_*.png")) == sorted(captions)
    caption = captions["attention_grading_test_s5.png"]
    assert caption.startswith("grading, class 3: slide test_s5, tested on the test split")
    assert "the teacher's ABMIL head (seed 0) classified correctly with the highest probability (0.75)" in caption
    assert "over the slide's tiling thumbnail." in caption
    # twt-6 TransMIL's maps are flat: said in the caption
    assert "near-uniform" in caption
    page = (out / "index.html").read_text()
    assert "classified no slide of class 2, 4 of the test split correctly" in page


def test_a_binary_task_shows_a_positive_slide(tmp_path):
    from pathtwt.report.tables import write_report

    results = tmp_path / "results"
    labels = [0, 1, 0, 1, 1, 0]
    run = results / "mil" / "vit-s14-tiny" / "uncompressed" / "metastasis" / "abmil" / "seed0"
    write_json_atomic(run / "metrics.json", {"n_classes": 2, "cohorts": {"test": {"accuracy": 1.0, "n_slides": 6}}})
    surest = [0.6, 0.7, 0.9, 0.95, 0.8, 0.55]  # the head's probability of the (right) class of each slide
    rows = [f"m{i},test,{y},{y},{1 - p if y else p},{p if y else 1 - p}" for i, (y, p) in enumerate(zip(labels, surest))]
    (run / "predictions.csv").write_text("slide_id,cohort,label,prediction,prob_0,prob_1\n" + "\n".join(rows) + "\n")
    _attention(run / "attention" / "test.h5", [(f"m{i}", y, y) for i, y in enumerate(labels)])
    page = write_report(results, tmp_path / "report", metrics={"metastasis": "accuracy"}, attention_slides=1).read_text()
    captions = _figure_captions(page)
    assert sorted(captions) == ["attention_metastasis_m2.png", "attention_metastasis_m3.png"]
    assert captions["attention_metastasis_m3.png"].startswith("metastasis, class 1: slide m3, tested on the test split")


def test_a_near_uniform_map_keeps_the_tissue_visible():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pathtwt.report.attention import draw_panel, near_uniform

    tissue = np.zeros((40, 40, 3), np.uint8)
    tissue[..., 1] = 160  # a green thumbnail of a 448-px slide, four tiles of 224 px
    coords = np.array([[0, 0], [224, 0], [0, 224], [224, 224]])
    centre = {}
    for name, scores in (("flat", [0.26, 0.25, 0.25, 0.24]), ("peaked", [0.91, 0.03, 0.03, 0.03])):
        fig, ax = plt.subplots(figsize=(2, 2), dpi=50)
        ax.set_axis_off()
        fig.subplots_adjust(0, 0, 1, 1)
        _, flat = draw_panel(ax, np.array(scores), coords, (tissue, 40 / 448, 40 / 448))
        fig.canvas.draw()
        pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)
        plt.close(fig)
        h, w = pixels.shape[:2]
        centre[name] = (flat, pixels[h // 4, w // 4])  # the first tile
    assert near_uniform([0.26, 0.25, 0.25, 0.24]) and not near_uniform([0.91, 0.03, 0.03, 0.03])
    flat, rgb = centre["flat"]
    assert flat and rgb[1] - rgb[0] > 80 and rgb[1] - rgb[2] > 80  # still the green tissue, lightly tinted
    flat, rgb = centre["peaked"]
    assert not flat and rgb[0] > 150  # the most attended tile in the colour map's top colour


def test_notes_are_rendered_from_markdown_not_pasted(report):
    page = (report[1] / "index.html").read_text()
    text = page.split("<style>")[0] + page.split("</style>")[1]
    assert "<code>torch_threads</code>" in text and "<code>precision</code>" in text
    assert "`" not in text  # no Markdown code span is shown with its backticks


def test_no_random_init_variant_is_said_under_the_table(tmp_path):
    results, out = tmp_path / "results", tmp_path / "report"
    _fabricate(results, random_init=False)
    assert main(["report", "--results", str(results), "--out", str(out), "--metric", "grading=qwk"]) == 0
    assert "No random-init backbone row" in (out / "grading.md").read_text()


def test_a_random_init_row_needs_no_note(report):
    assert "No random-init backbone row" not in (report[1] / "grading.md").read_text()


def test_markdown_prints_the_readme_tables_with_commit_and_machine(report, capsys):
    from pathtwt.report.markdown import BEGIN, END

    results, out = report
    assert main(["report", "--results", str(results), "--out", str(out), "--metric", "grading=qwk", "--markdown"]) == 0
    text = capsys.readouterr().out
    assert text == (out / "tables.md").read_text()
    assert text.startswith(BEGIN) and text.rstrip().endswith(END)
    assert "at commit " in text and "CPU cores" in text
    assert "#### grading (QWK)" in text


def test_layout_from_a_config_matches_what_the_command_writes(report):
    from pathtwt.report.tables import readme_layout

    config = {"variants": {"uncompressed": {"method": "none"}, "twt-6": {"method": "twt", "depth": 6},
                           "random-init": {"method": "random-init"}},
              "mil": {"heads": ["transmil", "abmil"]}, "backbones": {"vit-s14-tiny": {}},
              "tasks": {"grading": {"metric": "qwk", "external": ["grading-external"]}}}
    header, keys = readme_layout(config)["grading"]
    got_header, body = _body(report[1])
    assert header == got_header
    assert keys == [(c[1], c[2]) for c in body]


def test_report_without_runs_is_a_one_line_error(tmp_path, capsys):
    assert main(["report", "--results", str(tmp_path), "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err.strip()
    assert "no finished MIL runs" in err and len(err.splitlines()) == 1


def test_attention_grid_places_scores_on_the_tile_grid():
    grid = attention_grid(np.array([[100, 50], [356, 50], [356, 306]]), np.array([1.0, 2.0, 3.0]))
    assert grid.shape == (2, 2)
    assert grid[0, 0] == 1.0 and grid[0, 1] == 2.0 and grid[1, 1] == 3.0
    assert math.isnan(grid[1, 0])


def test_report_table_in_markdown_names_missing_cohort_values(report):
    results, out = report
    data = [r for r in csv.DictReader(open(out / "grading.csv")) if r["role"] != "chance"]
    # AUC is None (undefined) in every external metrics entry: mean is NaN, shown as n/a
    assert all(math.isnan(float(r["grading-external_auc_macro_mean"])) for r in data)
    header, body = _body(out)
    assert all(dict(zip(header, cells))["AUC grading-external"] == "n/a" for cells in body[:-1])


def test_headline_metrics_can_come_from_the_workflow_config(report, tmp_path, capsys):
    results, _ = report
    out = tmp_path / "r"
    root = Path(__file__).resolve().parents[1]
    assert main(["report", "--results", str(results), "--out", str(out), "--config", str(root / "config" / "config.yaml"),
                 "--markdown"]) == 0
    text = capsys.readouterr().out
    assert "#### grading (QWK)" in text and "#### metastasis (Acc)" in text  # the demo config's tasks and metrics
    assert "No finished runs yet." in (out / "metastasis.md").read_text()


def test_distilled_precision_is_what_the_loop_trained_in(tmp_path):
    from pathtwt.report.extraction import distill_precision

    folder = tmp_path / "models" / "b" / "v"
    folder.mkdir(parents=True)
    asked = {"provenance": {"options": {"distill": {"precision": "bf16"}}}}
    (folder / "model.json").write_text(json.dumps(asked))
    assert distill_precision(tmp_path, "b", "v") == "bf16"  # older model.json: the precision asked for
    fell_back = {**asked, "distillation": {"precision": "fp32", "bf16_check": {"precision": "fp32"}}}
    (folder / "model.json").write_text(json.dumps(fell_back))
    assert distill_precision(tmp_path, "b", "v") == "fp32"
    (folder / "model.json").write_text(json.dumps({**asked, "distillation": {"precision": None}}))
    assert distill_precision(tmp_path, "b", "v") == "-"  # a method that did not train


def test_html_mil_cells_put_the_interval_under_the_mean_and_markdown_keeps_one_line(report):
    header, body = _body(report[1])
    cell = dict(zip(header, body[0]))["QWK internal test [95% CI]"]
    mean, _, interval = cell.partition(" [")
    assert interval and "<br>" not in cell  # Markdown: one line
    page = (report[1] / "index.html").read_text()
    assert f"{mean}<br>[{interval}" in page and f"{mean} [{interval}" not in page


MAX_TABLE_COLUMNS = 9  # 3 row-name columns and 6 more fit a 1280-px window (checked in headless Chromium)


def _html_tables(page: str) -> list[list[str]]:
    """The header cells of each <table> of the page."""
    from html.parser import HTMLParser

    class Tables(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tables, self._in_th = [], False

        def handle_starttag(self, tag, attrs):
            if tag == "table":
                self.tables.append([])
            self._in_th = tag == "th" or (self._in_th and tag != "td")

        def handle_endtag(self, tag):
            if tag == "th":
                self._in_th = False

        def handle_data(self, data):
            if self._in_th and self.tables:
                self.tables[-1].append(data)

    parser = Tables()
    parser.feed(page)
    return parser.tables


def test_report_tables_fit_a_1280_px_window_with_cohorts_in_their_own_tables(report):
    page = (report[1] / "index.html").read_text()
    tables = _html_tables(page)
    mil = [t for t in tables if "Head" in t]
    assert mil and all(len(t) <= MAX_TABLE_COLUMNS for t in mil), [len(t) for t in mil]
    # backbone tables: the per-layer R² columns (narrow numbers) are a table of their own
    per_layer = [t for t in tables if "R² L1" in t]
    assert len(per_layer) == 1 and "CKA" not in per_layer[0] and len(per_layer[0]) <= 2 + 12
    assert all(len(t) <= MAX_TABLE_COLUMNS + 2 for t in tables if t not in mil and t not in per_layer)
    internal = [t for t in tables if "QWK internal test [95% CI]" in t]
    external = [t for t in tables if "QWK grading-external [95% CI]" in t]
    assert len(internal) == len(external) == 1 and internal[0] is not external[0]
    assert "ΔQWK grading-external [95% CI]" in external[0] and "tiles/s" not in external[0]
    assert any("tiles/s" in t and "Params (M)" in t for t in tables)  # cost columns kept, in their own table
    style = page.split("<style>")[1].split("</style>")[0]
    assert "max-width:1500px" not in style and "body{" in style and "max-width" not in style.split("body{")[1].split("}")[0]


def test_the_report_shows_only_what_its_study_names(report, tmp_path):
    """A results folder can hold runs its config has since dropped (a variant, a head, a
    task): the workflow names its own, and the report leaves the rest out."""
    results, _ = report
    stale = results / "mil" / "vit-s14-tiny" / "twt-6" / "old-task" / "abmil" / "seed0"
    write_json_atomic(stale / "metrics.json", _metrics(0.5, 0.5))
    out = tmp_path / "r"
    try:
        assert main(["report", "--results", str(results), "--out", str(out), "--metric", "grading=qwk",
                     "--tasks", "grading", "--variants", "uncompressed", "twt-6", "--heads", "abmil"]) == 0
    finally:
        import shutil

        shutil.rmtree(stale.parent.parent.parent)
    assert set(_records(out)) == {("uncompressed", "abmil"), ("twt-6", "abmil"), ("chance", "-")}
    assert not (out / "old-task.csv").exists()
    page = (out / "index.html").read_text()
    assert "old-task" not in page and "random-init (floor)" not in page and "transmil" not in page
    captions = _figure_captions(page)
    assert captions and all("transmil" not in c for c in captions.values())
