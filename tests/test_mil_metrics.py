"""MIL metrics, epoch-selection rules and the Gleason -> ISUP label helper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import balanced_accuracy_score, cohen_kappa_score, roc_auc_score

from pathtwt.mil.labels import gleason_to_isup
from pathtwt.mil.metrics import quadratic_weighted_kappa, slide_metrics
from pathtwt.mil.selection import select_epoch, selection_scores

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("case", range(40))
def test_qwk_matches_sklearn_on_random_cases(case):
    rng = np.random.default_rng(case)
    n_classes = int(rng.integers(2, 7))
    n = int(rng.integers(3, 40))
    # draw both sides from random subsets of the classes, so some classes are absent
    # from labels, predictions or both
    y_true = rng.choice(rng.choice(n_classes, size=rng.integers(1, n_classes + 1), replace=False), size=n)
    y_pred = rng.choice(rng.choice(n_classes, size=rng.integers(1, n_classes + 1), replace=False), size=n)
    ours = quadratic_weighted_kappa(y_true, y_pred, n_classes)
    ref = cohen_kappa_score(y_true, y_pred, weights="quadratic", labels=list(range(n_classes)))
    if np.isnan(ref):
        assert np.isnan(ours)
    else:
        assert ours == pytest.approx(ref, abs=1e-12)


def test_qwk_class_absent_from_one_side_and_union_default():
    y_true = np.array([0, 1, 2, 3, 3, 1])
    y_pred = np.array([0, 1, 1, 2, 3, 0])
    y_pred_missing = np.array([0, 0, 1, 1, 1, 0])  # classes 2 and 3 never predicted
    for pred in (y_pred, y_pred_missing):
        # every class occurs on one side at least, so sklearn's default labels agree too
        assert quadratic_weighted_kappa(y_true, pred, 4) == pytest.approx(cohen_kappa_score(y_true, pred, weights="quadratic"))
    assert quadratic_weighted_kappa([0, 1, 2], [0, 1, 2], 3) == pytest.approx(1.0)
    assert quadratic_weighted_kappa([0, 1, 2], [2, 1, 0], 3) == pytest.approx(-1.0)


def test_slide_metrics_agree_with_sklearn():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 4, size=50)
    probs = rng.dirichlet(np.ones(4), size=50)
    m = slide_metrics(y, probs, 4)
    pred = probs.argmax(1)
    assert m["accuracy"] == pytest.approx(np.mean(pred == y))
    assert m["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y, pred))
    assert m["auc_macro"] == pytest.approx(roc_auc_score(y, probs, multi_class="ovr", average="macro"))
    assert m["qwk_x100"] == pytest.approx(100 * cohen_kappa_score(y, pred, weights="quadratic"))
    binary = slide_metrics([0, 1, 1, 0], np.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]]), 2)
    assert binary["auc_macro"] == pytest.approx(roc_auc_score([0, 1, 1, 0], [0.1, 0.7, 0.4, 0.8]))
    one_class = slide_metrics([1, 1], np.array([[0.2, 0.8], [0.4, 0.6]]), 2)
    assert one_class["auc_macro"] is None and one_class["qwk"] is None  # undefined, not a fake number


def test_best_rule_on_scripted_curve():
    curve = [0.2, 0.5, 0.7, 0.7, 0.6, None, 0.65]
    assert select_epoch(curve, "best") == 2  # first of the tied maxima
    assert select_epoch([None, None], "best") is None


def test_moving_average_rule_on_scripted_curve():
    # a single spike at epoch 3 (index 2) must lose to a sustained plateau later
    curve = [0.5, 0.6, 1.0, 0.6, 0.6, 0.8, 0.8, 0.8, 0.8, 0.8, 0.7, 0.7]
    scores = selection_scores(curve, "moving-average", window=5)
    assert scores[:4] == [None] * 4
    assert scores[4] == pytest.approx(np.mean(curve[0:5]))
    assert scores[9] == pytest.approx(0.8)
    assert select_epoch(curve, "moving-average", window=5) == 9  # first epoch whose 5-epoch window is all 0.8
    assert select_epoch(curve, "best") == 2
    # a prefix selects only what the full curve would (the loop relies on this)
    assert select_epoch(curve[:7], "moving-average", window=5, total_epochs=len(curve)) == 6
    # runs shorter than the window use their whole length
    assert select_epoch([0.5, 0.9, 0.7], "moving-average", window=5) == 2


def test_gleason_to_isup():
    assert [gleason_to_isup(*pair) for pair in [(3, 3), (3, 4), (4, 3), (4, 4), (3, 5), (5, 3), (4, 5), (5, 4), (5, 5)]] == [
        1, 2, 3, 4, 4, 4, 5, 5, 5,
    ]
    assert gleason_to_isup("benign") == 0 and gleason_to_isup("4+3") == 3 and gleason_to_isup(0, 0) == 0
    with pytest.raises(ValueError):
        gleason_to_isup(6, 3)
    table = pd.read_csv(REPO / "resources" / "gleason_to_isup.csv")
    for p, s, isup in table.itertuples(index=False):
        assert gleason_to_isup(p, s) == isup


# Numbers of the hand-written implementation these metrics replaced (scikit-learn now),
# recorded on fixed inputs: a change of library must not change a reported number.
RECORDED = [
    # y_true, y_pred, n_classes, qwk, balanced accuracy
    ([0, 1, 2, 3, 4, 5, 5, 4, 3, 2, 1, 0], [0, 1, 1, 3, 5, 5, 4, 4, 2, 2, 0, 0], 6, 0.9342105263157895, 0.5833333333333334),
    ([0, 0, 1, 1, 5, 5], [0, 1, 1, 2, 5, 4], 6, 0.9361702127659575, 0.5),  # grades 3, 4 absent from both sides
    ([1, 1, 1], [1, 1, 1], 6, float("nan"), 1.0),  # QWK 0 / 0
    ([0, 1, 0, 1, 1], [0, 1, 1, 1, 0], 2, 0.16666666666666663, 0.5833333333333333),
    ([2, 2, 3, 4], [0, 1, 2, 5], 6, 0.631578947368421, 0.0),  # predictions outside the true classes
]


def reference_qwk(y_true, y_pred, n_classes):
    """The formula of the replaced implementation: observed vs expected agreement."""
    observed = np.zeros((n_classes, n_classes))
    np.add.at(observed, (np.asarray(y_true), np.asarray(y_pred)), 1.0)
    expected = np.outer(observed.sum(1), observed.sum(0)) / observed.sum()
    weights = (np.arange(n_classes)[:, None] - np.arange(n_classes)[None, :]) ** 2.0
    denominator = (weights * expected).sum()
    return float("nan") if denominator == 0 else 1.0 - (weights * observed).sum() / denominator


@pytest.mark.parametrize("y_true, y_pred, n_classes, qwk, bacc", RECORDED)
def test_metrics_keep_the_recorded_numbers(y_true, y_pred, n_classes, qwk, bacc, recwarn):
    from pathtwt.mil.metrics import balanced_accuracy, confusion

    ours = quadratic_weighted_kappa(y_true, y_pred, n_classes)
    assert (np.isnan(ours) and np.isnan(qwk)) or ours == pytest.approx(qwk, abs=1e-12)
    assert balanced_accuracy(y_true, y_pred) == pytest.approx(bacc, abs=1e-12)
    matrix = confusion(y_true, y_pred, n_classes)
    assert matrix.shape == (n_classes, n_classes) and matrix.dtype == np.float64
    assert matrix.sum() == len(y_true) and matrix.trace() == sum(t == p for t, p in zip(y_true, y_pred))
    assert not [w for w in recwarn if "kappa" in str(w.message) or "y_pred contains" in str(w.message)]


def test_metrics_match_the_replaced_formula_on_random_cases():
    from pathtwt.mil.metrics import balanced_accuracy, confusion

    rng = np.random.default_rng(11)
    for _ in range(200):
        n_classes = int(rng.integers(2, 7))
        n = int(rng.integers(1, 30))
        y_true = rng.choice(rng.choice(n_classes, size=rng.integers(1, n_classes + 1), replace=False), size=n)
        y_pred = rng.choice(rng.choice(n_classes, size=rng.integers(1, n_classes + 1), replace=False), size=n)
        ref = reference_qwk(y_true, y_pred, n_classes)
        ours = quadratic_weighted_kappa(y_true, y_pred, n_classes)
        assert (np.isnan(ref) and np.isnan(ours)) or ours == pytest.approx(ref, abs=1e-12)
        recalls = [np.mean(y_pred[y_true == c] == c) for c in np.unique(y_true)]
        assert balanced_accuracy(y_true, y_pred) == pytest.approx(np.mean(recalls), abs=1e-12)
        expected = np.zeros((n_classes, n_classes))
        np.add.at(expected, (y_true, y_pred), 1.0)
        assert np.array_equal(confusion(y_true, y_pred, n_classes), expected)
    assert np.isnan(quadratic_weighted_kappa([], [], 3)) and confusion([], [], 3).sum() == 0


def test_bootstrap_forms_equal_the_scikit_learn_metrics():
    from pathtwt.mil.metrics import _fast_metric, balanced_accuracy, quadratic_weighted_kappa

    rng = np.random.default_rng(3)
    for _ in range(20):
        y = rng.integers(0, 6, 30)
        p = np.where(rng.random(30) < 0.6, y, rng.integers(0, 6, 30))
        assert _fast_metric("qwk", y, p, 6) == pytest.approx(quadratic_weighted_kappa(y, p, 6))
        assert _fast_metric("balanced_accuracy", y, p, 6) == pytest.approx(balanced_accuracy(y, p))
        assert _fast_metric("accuracy", y, p, 6) == pytest.approx(np.mean(y == p))


def test_bootstrap_interval_is_seeded_and_brackets_the_seed_mean():
    from pathtwt.mil.metrics import bootstrap_interval

    y = np.array([0] * 10 + [1] * 10)
    seeds = [np.where(np.arange(20) % 5 == k, 1 - y, y) for k in (0, 1)]  # 80 % right each
    lo, hi = bootstrap_interval(y, seeds, "accuracy", 2)
    assert (lo, hi) == bootstrap_interval(y, seeds, "accuracy", 2)
    assert lo < 0.8 < hi and 0.5 < lo and hi <= 1.0
    # a cohort whose metric is never defined (QWK with one class in truth and prediction)
    assert all(np.isnan(bootstrap_interval(np.zeros(5, int), [np.zeros(5, int)], "qwk", 2)))


def test_paired_difference_interval_resolves_what_overlapping_intervals_do_not():
    from pathtwt.mil.metrics import bootstrap_difference_interval, bootstrap_interval

    y = np.array([0] * 10 + [1] * 10)
    # the same run against itself: every resample gives a difference of exactly 0
    run = [np.where(np.arange(20) % 4 == 0, 1 - y, y)]  # 75 % right
    assert bootstrap_difference_interval(y, run, run, "accuracy", 2) == (0.0, 0.0)
    # right on 4 more slides than the reference, wrong nowhere the reference is right
    better = [np.where(np.arange(20) % 4 == 0, 1 - y, y)]
    better[0][[0, 4, 12, 16]] = y[[0, 4, 12, 16]]  # all four were wrong in the reference
    a, b = bootstrap_interval(y, better, "accuracy", 2), bootstrap_interval(y, run, "accuracy", 2)
    assert a[0] < b[1]  # the two rows' own intervals overlap...
    lo, hi = bootstrap_difference_interval(y, better, run, "accuracy", 2)
    assert 0.0 < lo <= 0.2 <= hi  # ...while the paired one excludes 0 and holds the difference
    assert (lo, hi) == bootstrap_difference_interval(y, better, run, "accuracy", 2)  # seeded
    assert all(np.isnan(bootstrap_difference_interval(y, [], run, "accuracy", 2)))


@pytest.mark.parametrize("case", range(20))
def test_auc_matches_sklearn_with_ties_and_absent_classes(case):
    from pathtwt.mil.metrics import binary_auc, macro_auc

    rng = np.random.default_rng(100 + case)
    n, k = int(rng.integers(4, 60)), int(rng.integers(2, 6))
    y = rng.integers(0, k, size=n)
    y[:2] = [0, 1]  # two classes at least
    probs = np.round(rng.dirichlet(np.ones(k), size=n), 1)  # rounded: many tied scores
    assert binary_auc(y == 1, probs[:, 1]) == pytest.approx(roc_auc_score(y == 1, probs[:, 1]), abs=1e-12)
    present = [c for c in range(k) if 0 < (y == c).sum() < n]
    expected = np.mean([roc_auc_score(y == c, probs[:, c]) for c in present])
    if k > 2:
        assert macro_auc(y, probs) == pytest.approx(expected, abs=1e-12)
    assert np.isnan(binary_auc(np.zeros(5, bool), np.arange(5.0)))


def test_a_mil_job_computes_its_metrics_without_importing_scikit_learn():
    """scikit-learn's import costs a MIL job about 2 s; the slide metrics never need it."""
    import subprocess
    import sys

    code = ("import sys, numpy as np; from pathtwt.mil.metrics import slide_metrics; "
            "m = slide_metrics([0, 1, 2, 1], np.eye(3)[[0, 1, 1, 1]], 3); "
            "assert m['accuracy'] == 0.75, m; print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_labels_outside_the_classes_are_refused():
    from pathtwt.mil.metrics import confusion

    with pytest.raises(ValueError, match="outside the classes 0..2"):
        confusion(np.array([0, 3]), np.array([0, 1]), 3)
