"""MIL training end to end on planted-signal cohorts: both heads learn the tasks and
attend to the key instances; runs are deterministic per seed; an interrupted run
resumes to the identical result; the command line writes and summarises the outputs."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pandas as pd
import pytest
import torch

from pathtwt.cli import main
from pathtwt.errors import NumericsError
from pathtwt.io.h5 import read_features, write_features
from pathtwt.mil.data import prepare_data
from pathtwt.mil.heads import build_head
from pathtwt.mil.protocols import make_config
from pathtwt.mil.run import run_mil
from pathtwt.mil.train import torch_threads

PLANTED = {
    "metastasis": dict(task="metastasis", splits={"train": 80, "val": 20, "test": 40}, n_classes=2, dim=16, strength=6.0),
    "grading": dict(
        task="grading", splits={"train": 90, "val": 30, "test": 45}, n_classes=3, dim=16, strength=4.0, grade_share_step=0.3
    ),
}
# small heads and a higher learning rate than the paper's presets so the planted tasks
# are learnt in seconds; everything else is the protocol preset
HEADS = {
    "abmil": dict(epochs=5, lr=3e-3, hidden_dim=64),
    "transmil": dict(epochs=3, lr=1e-3, hidden_dim=64, heads=4, landmarks=32),
}
SMALL = dict(task="metastasis", splits={"train": 16, "val": 6, "test": 6}, n_classes=2, dim=8, strength=6.0, bag_size=(10, 30))


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with torch_threads(1):  # tiny heads, one bag per step: threads only add overhead
        yield


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    from planted_cohorts import write_planted_cohort

    root = tmp_path_factory.mktemp("planted")
    return {task: write_planted_cohort(root / task, **spec) for task, spec in PLANTED.items()}


@pytest.fixture()
def small(tmp_path):
    from planted_cohorts import write_planted_cohort

    return write_planted_cohort(tmp_path / "small", **SMALL)


def _data(cohort, **kw):
    return prepare_data(features_dir=cohort.features_dir, labels=cohort.labels_csv, **kw)


@pytest.mark.parametrize("aggregator", ["abmil", "transmil"])
@pytest.mark.parametrize("task", ["metastasis", "grading"])
def test_heads_learn_planted_signal(planted, tmp_path, task, aggregator):
    cohort = planted[task]
    config = make_config(task, aggregator=aggregator, accumulation=1, selection_window=2, **HEADS[aggregator])
    metrics = run_mil(_data(cohort), config, out_dir=tmp_path / "run", progress=False)
    test = metrics["cohorts"]["test"]
    if task == "metastasis":
        assert test["accuracy"] >= 0.95
    else:
        assert test["qwk"] >= 0.9
    with h5py.File(tmp_path / "run" / "attention" / "test.h5", "r") as h5:
        top_on_key, key_vs_rest = [], []
        for slide_id, keys in cohort.keys.items():
            if slide_id not in h5 or not keys.any():
                continue
            scores = h5[slide_id]["attention"][()]
            assert scores.shape == keys.shape
            top_on_key.append(keys[np.argmax(scores)])
            key_vs_rest.append(scores[keys].mean() > scores[~keys].mean())
    if task == "metastasis":
        assert np.mean(top_on_key) >= 0.9  # a few key tiles among 30-60 decide the label
    else:
        assert np.mean(key_vs_rest) >= 0.9  # grading needs the share, so attention may spread


def _run(cohort, out, *, seed=0, aggregator="abmil", **kw):
    config = make_config("metastasis", aggregator=aggregator, seed=seed, epochs=4, lr=1e-3, accumulation=4,
                         hidden_dim=32, heads=4, landmarks=8, max_instances=12, selection_window=2)
    return run_mil(_data(cohort), config, out_dir=out, progress=False, **kw)


def _comparable(metrics):
    return {k: metrics[k] for k in ("cohorts", "history", "selected_epoch")}


def test_same_seed_same_metrics(small, tmp_path):
    first = _run(small, tmp_path / "a")
    second = _run(small, tmp_path / "b")
    assert _comparable(first) == _comparable(second)
    assert (tmp_path / "a" / "predictions.csv").read_bytes() == (tmp_path / "b" / "predictions.csv").read_bytes()
    other = _run(small, tmp_path / "c", seed=1)
    assert other["history"] != first["history"]


def test_resume_equals_uninterrupted(small, tmp_path):
    whole = _run(small, tmp_path / "whole", aggregator="transmil")

    def stop_after_two(epoch):
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(small, tmp_path / "cut", aggregator="transmil", on_epoch_end=stop_after_two)
    assert (tmp_path / "cut" / "resume.pt").exists() and not (tmp_path / "cut" / "metrics.json").exists()
    resumed_epochs = []
    resumed = _run(small, tmp_path / "cut", aggregator="transmil", on_epoch_end=resumed_epochs.append)
    assert resumed_epochs == [3, 4]  # it continued, it did not start over
    assert _comparable(resumed) == _comparable(whole)
    assert not (tmp_path / "cut" / "resume.pt").exists()  # removed once the run is complete
    a = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_nan_loss_names_epoch_step_and_slide(small, tmp_path, monkeypatch):
    # finite features whose projection overflows: the loss, not the input, goes NaN.
    # Input standardisation would tame these values, so it is left at identity here.
    from pathtwt.mil.models import FeatureStandardizer

    monkeypatch.setattr(FeatureStandardizer, "fit", lambda self, bags: None)
    _, coords, _ = read_features(small.features_dir / "train-003.h5")
    write_features(small.features_dir / "train-003.h5", np.full((len(coords), 8), 3e38, np.float32), coords, {"status": "ok"})
    with pytest.raises(NumericsError, match=r"epoch 1, step \d+ \(slide train-003\)"):
        _run(small, tmp_path / "run")


def test_cli_train_and_summarize(small, tmp_path, capsys):
    from planted_cohorts import write_planted_cohort

    ext = write_planted_cohort(tmp_path / "ext", **{**SMALL, "splits": {"test": 5}, "seed": 9})
    runs = []
    for seed in (0, 1):
        out = tmp_path / f"seed{seed}"
        code = main([
            "train-mil", "--features", str(small.features_dir), "--labels", str(small.labels_csv),
            "--protocol", "metastasis", "--aggregator", "abmil", "--seed", str(seed), "--out", str(out),
            "--epochs", "3", "--accumulation", "4", "--hidden-dim", "16", "--lr", "1e-3", "--no-progress",
            "--external", f"ext={ext.features_dir}:{ext.labels_csv}",
        ])
        assert code == 0
        runs.append(out)
    metrics = json.loads((runs[0] / "metrics.json").read_text())
    assert set(metrics["cohorts"]) == {"val", "test", "ext"}
    # which device trained it, and the torch build
    assert metrics["device"]["device"] == "cpu" and metrics["device"]["torch_version"] == torch.__version__
    assert metrics["config"]["epochs"] == 3 and metrics["config"]["lr"] == 1e-3 and metrics["config"]["weight_decay"] == 1e-4
    assert metrics["selection"]["rule"] == "moving-average" and 1 <= metrics["selected_epoch"] <= 3
    assert all(set(h) >= {"val", "test", "ext"} for h in metrics["history"])  # metastasis: every cohort, every epoch
    predictions = pd.read_csv(runs[0] / "predictions.csv", dtype={"slide_id": str})
    assert list(predictions.columns) == ["slide_id", "cohort", "label", "prediction", "prob_0", "prob_1"]
    assert len(predictions) == 6 + 6 + 5
    assert np.allclose(predictions[["prob_0", "prob_1"]].sum(axis=1), 1.0, atol=1e-5)
    ext_rows = predictions[predictions.cohort == "ext"]
    assert metrics["cohorts"]["ext"]["accuracy"] == pytest.approx(np.mean(ext_rows.label == ext_rows.prediction))
    with h5py.File(runs[0] / "attention" / "ext.h5", "r") as h5:
        for slide_id in ext_rows.slide_id:
            _, coords, _ = read_features(ext.features_dir / f"{slide_id}.h5")
            assert np.array_equal(h5[slide_id]["coords"][()], coords)
    # the checkpoint alone rebuilds the head and its predictions
    state = torch.load(runs[0] / "checkpoint.pt", weights_only=True)
    head = build_head(state["aggregator"], in_dim=state["in_dim"], n_classes=state["n_classes"],
                      hidden_dim=state["config"]["hidden_dim"], dropout=0.0)
    head.load_state_dict(state["model"])
    head.eval()
    features, _, _ = read_features(ext.features_dir / f"{ext_rows.slide_id.iloc[0]}.h5")
    with torch.no_grad():
        probs = torch.softmax(head(torch.from_numpy(features))[0].double(), -1)[0].numpy()
    assert probs == pytest.approx(ext_rows[["prob_0", "prob_1"]].iloc[0].to_numpy(), abs=1e-5)

    code = main(["summarize-mil", *map(str, runs), "--out", str(tmp_path / "s.csv"), str(tmp_path / "s.json")])
    assert code == 0
    summary = pd.read_csv(tmp_path / "s.csv")
    row = summary[(summary.cohort == "test") & (summary.metric == "accuracy")].iloc[0]
    values = [json.loads((r / "metrics.json").read_text())["cohorts"]["test"]["accuracy"] for r in runs]
    assert row["mean"] == pytest.approx(np.mean(values)) and row["std"] == pytest.approx(np.std(values, ddof=1), abs=1e-6)
    assert json.loads((tmp_path / "s.json").read_text())["seeds"] == [0, 1]
    # the interval of the seed-mean over slides, from the runs' predictions.csv
    from pathtwt.mil.metrics import bootstrap_interval
    from pathtwt.mil.summary import read_predictions

    preds = [read_predictions(r)["test"] for r in runs]
    order = [np.argsort(p["slide_id"]) for p in preds]
    lo, hi = bootstrap_interval(preds[0]["label"][order[0]], [p["prediction"][o] for p, o in zip(preds, order)],
                                "accuracy", 2)
    assert [row["ci95_low"], row["ci95_high"]] == pytest.approx([lo, hi])
    assert lo <= row["mean"] <= hi
    assert main(["summarize-mil", str(runs[0]), str(runs[0]), "--out", str(tmp_path / "d.csv")]) == 1
    assert "seed(s) [0]" in capsys.readouterr().err


def test_cli_several_seeds_in_one_process_equal_one_run_each(small, tmp_path, capsys):
    """The workflow trains every seed of a head in one process: each run's predictions
    and metrics are those of a process of its own."""
    common = ["train-mil", "--features", str(small.features_dir), "--labels", str(small.labels_csv),
              "--protocol", "metastasis", "--aggregator", "transmil", "--epochs", "2", "--accumulation", "4",
              "--hidden-dim", "16", "--heads", "2", "--landmarks", "4", "--no-progress"]
    assert main([*common, "--seed", "0", "1", "--out", str(tmp_path / "both" / "seed{seed}")]) == 0
    for seed in (0, 1):
        assert main([*common, "--seed", str(seed), "--out", str(tmp_path / f"alone{seed}")]) == 0
        together, alone = tmp_path / "both" / f"seed{seed}", tmp_path / f"alone{seed}"
        assert (together / "predictions.csv").read_bytes() == (alone / "predictions.csv").read_bytes()
        a, b = (json.loads((d / "metrics.json").read_text()) for d in (together, alone))
        assert a["seed"] == seed and _comparable(a) == _comparable(b)
    out = capsys.readouterr().out
    assert "seed 0: selected epoch" in out and "seed 1: selected epoch" in out
    # several seeds need a {seed} in --out, and a seed given twice is refused before any run
    assert main([*common, "--seed", "0", "1", "--out", str(tmp_path / "flat")]) == 1
    assert main([*common, "--seed", "2", "2", "--out", str(tmp_path / "twice" / "seed{seed}")]) == 1
    err = capsys.readouterr().err
    assert "must contain {seed}" in err and "a seed is given twice" in err
    assert not (tmp_path / "flat").exists() and not (tmp_path / "twice").exists()
