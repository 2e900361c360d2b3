"""Cross-validated MIL: `train-mil --fold F` trains on the other folds and selects on the
next one, the meanpool head, pooled out-of-fold predictions (every slide once; external
cohorts averaged over the fold heads), the bootstrap by group, and the report's pooled
table with the spread over folds and the hold-out stated."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from pathtwt.cli import main
from pathtwt.errors import ConfigError, PathtwtError
from pathtwt.mil import folds as cv
from pathtwt.mil.layout import parse_run_dir, run_dir

K = 3


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """30 planted grading bags (3 classes, 16-d) in K folds by patient (2 slides each) with
    a 20 % compression hold-out, and an external cohort of 6 bags."""
    from planted_cohorts import write_planted_cohort

    root = tmp_path_factory.mktemp("cv")
    main_cohort = write_planted_cohort(root / "main", task="grading", splits={"all": 40}, dim=16, n_classes=3,
                                       bag_size=(8, 12), strength=4.0, seed=0)
    write_planted_cohort(root / "ext", task="grading", splits={"test": 6}, dim=16, n_classes=3, bag_size=(8, 12),
                         strength=4.0, seed=7)
    raw = main_cohort.table.drop(columns="split").assign(patient=[f"p{i // 2}" for i in range(40)])
    raw["label"] = [int(i // 2 % 3) for i in range(40)]  # both slides of a patient share the label
    raw.to_csv(root / "raw.csv", index=False)
    assert main(["labels", "split", str(root / "raw.csv"), "--folds", str(K), "--group-column", "patient",
                 "--holdout", "0.2", "--out", str(root / "labels.csv")]) == 0
    return root


def train(root, head, fold, variant="uncompressed", results=None, seeds=("0",)):
    results = results or root / "results"
    out = run_dir("bb", variant, "grading", head, "{seed}", fold, results=str(results))
    args = ["train-mil", "--features", str(root / "main" / "features"), "--labels", str(root / "labels.csv"),
            "--protocol", "grading", "--classes", "3", "--aggregator", head, "--seed", *seeds, "--out", out,
            "--fold", str(fold), "--epochs", "2", "--hidden-dim", "16", "--accumulation", "4", "--no-progress",
            "--external", f"ext={root / 'ext' / 'features'}:{root / 'ext' / 'labels.csv'}"]
    assert main(args) == 0
    return out


def test_a_fold_run_tests_its_fold_selects_on_the_next_and_trains_on_the_rest(cohort):
    out = train(cohort, "meanpool", 1)
    run = out.replace("{seed}", "0")
    table = pd.read_csv(cohort / "labels.csv")
    preds = pd.read_csv(f"{run}/predictions.csv")
    in_fold = lambda f: set(table.slide_id[table.fold == f])  # noqa: E731
    assert set(preds.slide_id[preds.cohort == "test"]) == in_fold(1)
    assert set(preds.slide_id[preds.cohort == "val"]) == in_fold(2)
    held = set(table.slide_id[table.fold == cv.HOLDOUT])
    assert held and not held & set(preds.slide_id)  # the compression hold-out is never evaluated
    assert set(preds.fold) == {1} and preds.group[preds.cohort == "test"].notna().all()
    metrics = json.loads(open(f"{run}/metrics.json").read())
    assert metrics["fold"] == 1 and metrics["n_train_slides"] == len(in_fold(0))
    assert parse_run_dir(run, cohort / "results").fold == 1


def test_meanpool_chooses_c_on_validation_and_its_checkpoint_reproduces_the_predictions(cohort):
    from pathtwt.io.torch_files import load_torch_file
    from pathtwt.mil.data import prepare_data
    from pathtwt.mil.meanpool import C_GRID, bag_means, predict

    run = train(cohort, "meanpool", 0).replace("{seed}", "0")
    metrics = json.loads(open(f"{run}/metrics.json").read())
    vals = [h["val"]["qwk"] for h in metrics["history"]]
    assert [h["C"] for h in metrics["history"]] == list(C_GRID)
    assert metrics["selection"]["C"] == C_GRID[int(np.argmax(vals))]  # the first best C on validation
    assert metrics["cohorts"]["test"]["qwk"] > 0.5  # the planted grade is linear in the mean embedding
    state = load_torch_file(f"{run}/checkpoint.pt", remedy="rerun")
    assert state["aggregator"] == "meanpool" and state["config"]["aggregator"] == "meanpool" and state["fold"] == 0
    data = prepare_data(features_dir=cohort / "main" / "features", labels=cohort / "labels.csv", fold=0)
    test = data.cohort("test")
    saved = pd.read_csv(f"{run}/predictions.csv").query("cohort == 'test'").set_index("slide_id")
    probs = predict(state["model"], state["n_classes"], bag_means(test))
    assert np.allclose(probs, saved.loc[[b.slide_id for b in test.bags], ["prob_0", "prob_1", "prob_2"]].to_numpy(),
                       atol=1e-5)
    assert isinstance(state["model"]["coef"], torch.Tensor)  # loads with weights_only
    from pathtwt.explain.runs import load_head

    head = load_head(run)  # `pathtwt predict` reads it, and knows it cannot draw attention from it
    assert head.aggregator == "meanpool" and head.model is None


def test_a_fold_column_that_skips_a_fold_is_refused(cohort, tmp_path):
    from pathtwt.mil.data import prepare_data

    table = pd.read_csv(cohort / "labels.csv")
    table.loc[table.fold == 2, "fold"] = 3
    table.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ConfigError, match=r"bad.csv: fold column lacks fold\(s\) \[2\]"):
        prepare_data(features_dir=cohort / "main" / "features", labels=tmp_path / "bad.csv", fold=0)
    with pytest.raises(ConfigError, match="needs a `fold` column"):
        prepare_data(features_dir=cohort / "main" / "features", labels=cohort / "main" / "labels.csv", fold=0)


def test_pooled_out_of_fold_predictions_test_every_slide_once_and_average_external_heads(cohort):
    from pathtwt.mil.oof import pool_seed
    from pathtwt.mil.summary import read_predictions

    runs = {f: read_predictions(train(cohort, "meanpool", f, results=cohort / "pool").replace("{seed}", "0"))
            for f in range(K)}
    pooled = pool_seed(runs, where="x")
    table = pd.read_csv(cohort / "labels.csv")
    assert sorted(pooled["test"]["slide_id"]) == sorted(table.slide_id[table.fold >= 0])
    assert set(pooled) == {"test", "ext"}  # validation is not pooled
    ext = np.mean([runs[f]["ext"]["probs"] for f in range(K)], axis=0)
    assert np.allclose(pooled["ext"]["probs"], ext) and (pooled["ext"]["prediction"] == ext.argmax(1)).all()
    from pathtwt.mil.summary import summarize_runs

    summary = summarize_runs([run_dir("bb", "uncompressed", "grading", "meanpool", 0, f, str(cohort / "pool"))
                              for f in range(K)])  # the workflow's summarize_mil
    entry = summary["summary"]["test"]["qwk_x100"]
    assert summary["folds"] == list(range(K)) and entry["n_slides"] == len(pooled["test"]["slide_id"])
    assert entry["n_folds"] == K and entry["ci95"][0] <= entry["mean"] <= entry["ci95"][1]
    runs[1]["test"] = runs[0]["test"]  # two folds claiming the same slides
    with pytest.raises(PathtwtError, match="tested by more than one fold"):
        pool_seed(runs, where="x")


def test_the_bootstrap_resamples_whole_groups():
    from pathtwt.mil.metrics import bootstrap_interval, resample_units

    y = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    groups = np.array(["a", "a", "b", "b", "c", "c", "d", "d"])
    units = resample_units(y, groups)
    assert [[list(u) for u in s] for s in units] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    pred = np.array([0, 0, 1, 1, 1, 1, 0, 0])  # patients a and c right, b and d wrong
    lo, hi = bootstrap_interval(y, [pred], "accuracy", 2, groups=groups, n_boot=500)
    # by patient the accuracy of a resample is 0, 1/2 or 1 per class, so in steps of 1/4
    draws = {round(v * 4) / 4 for v in (lo, hi)}
    assert lo <= 0.5 <= hi and draws == {lo, hi}
    singletons = bootstrap_interval(y, [pred], "accuracy", 2, groups=np.arange(8).astype(str), n_boot=200)
    assert singletons == bootstrap_interval(y, [pred], "accuracy", 2, n_boot=200)  # one slide per group: by slide


def test_the_report_pools_out_of_fold_with_the_spread_over_folds_and_the_hold_out(cohort):
    from pathtwt.mil.metrics import slide_metrics
    from pathtwt.mil.oof import pool_seed
    from pathtwt.mil.summary import read_predictions
    from pathtwt.report.tables import task_sections

    results = cohort / "report"
    (results / "labels").mkdir(parents=True)
    pd.read_csv(cohort / "labels.csv").to_csv(results / "labels" / "main.csv", index=False)
    for variant in ("uncompressed", "twt-6"):
        for f in range(K):
            train(cohort, "meanpool", f, variant=variant, results=results)
    section = task_sections(results, {"grading": "qwk"}, {})[0]
    header, body, rows = section["header"], section["body"], section["rows"]
    assert "QWK out-of-fold [95% CI]" in header and "QWK out-of-fold per fold" in header and "QWK ext per fold" in header
    teacher = next(r for r in rows if r.variant == "uncompressed")
    n_cv = int((pd.read_csv(cohort / "labels.csv").fold >= 0).sum())
    assert teacher.values["test", "n_slides"][0] == n_cv and teacher.grouped
    pooled = pool_seed({f: read_predictions(run_dir("bb", "uncompressed", "grading", "meanpool", 0, f, str(results)))
                        for f in range(K)}, where="x")
    assert teacher.values["test", "qwk"][0] == pytest.approx(slide_metrics(pooled["test"]["label"], pooled["test"]["probs"], 3)["qwk"])
    per_fold = [json.loads(open(run_dir("bb", "uncompressed", "grading", "meanpool", 0, f, str(results)) + "/metrics.json").read())["cohorts"]["test"]["qwk"] for f in range(K)]
    assert teacher.folds["test", "qwk"] == pytest.approx((np.mean(per_fold), np.std(per_fold, ddof=1), K))
    twt = next(r for r in rows if r.variant == "twt-6")
    assert twt.delta["test"] == pytest.approx(0.0) and twt.delta_ci["test"] == (0.0, 0.0)  # same features, same head
    assert any(r.role == "chance" for r in rows)
    notes = " ".join(section["notes"])
    assert "pooled out-of-fold predictions of all slides" in notes and "whole groups" in notes
    assert f"main: {K} folds over {n_cv} slides" in notes and "compression-only hold-out" in notes
    assert "mean of the fold heads' class probabilities" in notes


def test_the_report_shows_out_of_fold_attention_captioned_so(cohort):
    from pathtwt.mil.summary import read_predictions
    from pathtwt.report.attention import attention_figures
    from pathtwt.report.tables import task_sections

    results = cohort / "attention-report"
    for f in range(K):
        train(cohort, "abmil", f, results=results)
    section = task_sections(results, {"grading": "qwk"}, {})[0]
    figs, notes = attention_figures(results, results / "report", "grading", section["rows"], 1)
    # each class's surest right slide over all folds' out-of-fold predictions
    right = []
    for f in range(K):
        p = read_predictions(run_dir("bb", "uncompressed", "grading", "abmil", 0, f, str(results)))["test"]
        right += [(-probs[y], s, y, f) for s, y, pred, probs in zip(p["slide_id"], p["label"], p["prediction"], p["probs"])
                  if pred == y]
    best = {y: (s, f) for _, s, y, f in sorted(right, reverse=True)}  # the surest wins, written last
    assert best and len(figs) == len(best) and bool(notes) == (len(best) < 3)  # a class with no right slide: a note
    for (src, caption), (y, (slide, fold)) in zip(figs, sorted(best.items())):
        assert src == f"figures/attention_grading_{slide}.png" and (results / "report" / src).is_file()
        assert caption.startswith(f"grading, class {y}: slide {slide}, tested out of fold (by the heads of fold {fold}, ")
