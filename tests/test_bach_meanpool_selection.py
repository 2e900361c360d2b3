"""benchmarks/bach_meanpool_selection.py: every rule for meanpool's C is out of fold, so a
slide's prediction never depends on the labels of its own test fold."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("bach_meanpool_selection", REPO / "benchmarks" / "bach_meanpool_selection.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cohort(tmp_path: Path, n_per_class: int = 10, k: int = 5, dim: int = 16):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), n_per_class)
    folds = np.concatenate([rng.permutation(np.arange(n_per_class) % k) for _ in range(4)])
    table = pd.DataFrame({"slide_id": [f"s{i:03d}" for i in range(len(labels))], "label": labels, "fold": folds})
    features = tmp_path / "features"
    features.mkdir()
    centres = rng.normal(size=(4, dim))
    for s, y in zip(table.slide_id, table.label):
        with h5py.File(features / f"{s}.h5", "w") as h:
            h["features"] = (centres[y] + rng.normal(scale=2.0, size=(12, dim))).astype(np.float32)
    return table, features


@pytest.mark.parametrize("rule", ["val-qwk", "val-bacc", "val-logloss", "val-logloss-refit", "inner-logloss"])
def test_no_rule_reads_the_labels_of_the_fold_it_predicts(tmp_path, rule):
    module = _module()
    table, features = _cohort(tmp_path)
    means = module.slide_means(features, table.slide_id)
    before = module.out_of_fold(means, table, rule, 5, 4)
    assert sorted(before) == sorted(table.slide_id), "every slide is predicted once"
    test = table.fold == 0
    shuffled = table.copy()
    shuffled.loc[test, "label"] = (shuffled.loc[test, "label"] + 1) % 4  # other labels in test fold 0 only
    after = module.out_of_fold(means, shuffled, rule, 5, 4)
    for s in table.slide_id[test]:
        np.testing.assert_allclose(after[s], before[s], err_msg=f"{rule}: test fold 0's labels changed its predictions")
    # the other folds train on fold 0, so some of their predictions move: the check above can fail
    assert any(not np.allclose(after[s], before[s]) for s in table.slide_id[~test])
