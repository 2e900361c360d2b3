"""Slide-level metrics: quadratic weighted kappa (the grading score, reported x100),
accuracy, balanced accuracy and macro one-vs-rest AUC, in numpy from the confusion matrix
and the score ranks (tests/test_mil_metrics.py checks each against scikit-learn's; a MIL
job then never imports scikit-learn, which costs it about 2 s).

QWK and the confusion matrix are computed over the task's full class range
``0..n_classes-1``, so that the disagreement weight between grades i and j is always
(i - j)^2, also when some grade is absent from both labels and predictions (scikit-learn's
default would re-index the labels that happen to occur). Undefined values (0 / 0) are NaN,
never a warning or a made-up number."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def confusion(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> np.ndarray:
    """(n_classes, n_classes) counts, rows = truth, columns = prediction, as float64."""
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    for name, values in (("labels", y_true), ("predictions", y_pred)):
        if len(values) and (values.min() < 0 or values.max() >= n_classes):
            raise ValueError(f"{name} outside the classes 0..{n_classes - 1}: {sorted(set(values.tolist()))}")
    counts = np.bincount(y_true * n_classes + y_pred, minlength=n_classes * n_classes)
    return counts.reshape(n_classes, n_classes).astype(np.float64)


def quadratic_weighted_kappa(y_true, y_pred, n_classes: int | None = None) -> float:
    """Cohen's kappa with quadratic weights; NaN when it is undefined (0 / 0, e.g. every
    label and prediction is one and the same class)."""
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    if n_classes is None:
        n_classes = int(max(y_true.max(initial=0), y_pred.max(initial=0))) + 1
    return _fast_metric("qwk", y_true, y_pred, n_classes)


def balanced_accuracy(y_true, y_pred) -> float:
    """Mean recall over the classes present in ``y_true`` (predicted classes absent from
    ``y_true`` have no recall and are left out, as scikit-learn leaves them)."""
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    n_classes = int(max(y_true.max(initial=0), y_pred.max(initial=0))) + 1
    return _fast_metric("balanced_accuracy", y_true, y_pred, n_classes)


def binary_auc(positive: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a positive outscores a negative, ties
    counted half (the Mann-Whitney U over the average ranks); NaN without both classes."""
    positive = np.asarray(positive, dtype=bool)
    scores = np.asarray(scores, dtype=np.float64)
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    _, first, counts = np.unique(scores[order], return_index=True, return_counts=True)
    ranks = np.empty(len(scores), dtype=np.float64)
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)  # 1-based average rank of each tie group
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def macro_auc(y_true, probs: np.ndarray) -> float:
    """Binary: AUC of the positive-class probability. Multi-class: mean one-vs-rest AUC
    over the classes that have both positives and negatives in ``y_true``; NaN when no
    class qualifies (a cohort with a single label)."""
    y_true = np.asarray(y_true, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    if probs.shape[1] == 2:
        return binary_auc(y_true == 1, probs[:, 1])
    aucs = [binary_auc(y_true == c, probs[:, c]) for c in range(probs.shape[1])]
    aucs = [a for a in aucs if not math.isnan(a)]
    return float(np.mean(aucs)) if aucs else float("nan")


def slide_metrics(y_true, probs: np.ndarray, n_classes: int) -> dict[str, Any]:
    """All metrics of one cohort. NaN (undefined) values become None so metrics.json
    stays valid JSON."""
    y_true = np.asarray(y_true, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64).reshape(len(y_true), n_classes)
    y_pred = probs.argmax(axis=1)
    qwk = quadratic_weighted_kappa(y_true, y_pred, n_classes)
    values = {
        "n_slides": int(len(y_true)),
        "qwk": qwk,
        "qwk_x100": 100.0 * qwk,
        "accuracy": float(np.mean(y_pred == y_true)) if len(y_true) else float("nan"),
        "balanced_accuracy": balanced_accuracy(y_true, y_pred),
        "auc_macro": macro_auc(y_true, probs) if len(y_true) else float("nan"),
    }
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in values.items()}


# The headline metrics a bootstrap interval is computed for (from the confusion matrix,
# so that a bootstrap's thousands of calls stay cheap).
BOOTSTRAP_METRICS = ("qwk", "qwk_x100", "accuracy", "balanced_accuracy")


def _fast_metric(metric: str, y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> float:
    """One metric from the confusion matrix (a bootstrap calls it thousands of times)."""
    cm = confusion(y_true, y_pred, n_classes)
    n = cm.sum()
    if n == 0:
        return math.nan
    if metric == "accuracy":
        return float(np.trace(cm) / n)
    if metric == "balanced_accuracy":
        support = cm.sum(axis=1)
        present = support > 0
        return float(np.mean(np.diag(cm)[present] / support[present]))
    if metric in ("qwk", "qwk_x100"):
        idx = np.arange(n_classes)
        w = (idx[:, None] - idx[None, :]) ** 2
        expected = np.outer(cm.sum(axis=1), cm.sum(axis=0)) / n
        denom = float((w * expected).sum())
        if denom == 0:
            return math.nan
        value = 1.0 - float((w * cm).sum()) / denom
        return 100.0 * value if metric == "qwk_x100" else value
    raise ValueError(f"no bootstrap form for metric {metric!r}; use one of {BOOTSTRAP_METRICS}")


def bootstrap_interval(
    y_true, predictions: list[np.ndarray], metric: str, n_classes: int, *, n_boot: int = 1000, seed: int = 0,
    level: float = 0.95, groups=None,
) -> tuple[float, float]:
    """Percentile interval of the mean over seeds of ``metric``, resampling the cohort's
    slides with replacement within each true class (so every class keeps its count and
    QWK stays defined). ``predictions`` holds one array of predicted classes per seed,
    aligned with ``y_true``; every resample scores all seeds on the same slides, so the
    interval is the slide-sampling uncertainty of the seed-mean in the table. Resamples
    where the metric is undefined are left out; (NaN, NaN) when none is defined. With
    ``groups`` (a patient or case per slide) whole groups are resampled
    (:func:`resample_units`)."""
    return _percentile_interval(y_true, [predictions], metric, n_classes, n_boot=n_boot, seed=seed, level=level,
                                groups=groups)


def bootstrap_difference_interval(
    y_true, predictions: list[np.ndarray], reference: list[np.ndarray], metric: str, n_classes: int, *,
    n_boot: int = 1000, seed: int = 0, level: float = 0.95, groups=None,
) -> tuple[float, float]:
    """Percentile interval of (seed-mean of ``predictions``) - (seed-mean of ``reference``),
    both scored on the same resampled slides (paired). Two rows whose own intervals
    overlap can still differ beyond slide sampling: the paired interval is what says
    whether these slides resolve the difference (it excludes 0) or not."""
    return _percentile_interval(y_true, [predictions, reference], metric, n_classes, n_boot=n_boot, seed=seed,
                                level=level, groups=groups)


def resample_units(y_true: np.ndarray, groups=None) -> list[list[np.ndarray]]:
    """The units a bootstrap draws, per stratum: without ``groups`` every slide is a unit
    and the strata are the true classes; with ``groups`` every group (patient, case) is a
    unit, holding all its slides, and a group's stratum is its most frequent label
    (ties: the lowest), so slides of one patient are drawn together."""
    y_true = np.asarray(y_true, dtype=np.int64)
    if groups is None:
        return [[np.array([i]) for i in np.flatnonzero(y_true == c)] for c in np.unique(y_true)]
    groups = np.asarray(groups, dtype=object)
    units: dict[int, list[np.ndarray]] = {}
    for g in sorted(set(groups.tolist()), key=str):
        idx = np.flatnonzero(groups == g)
        units.setdefault(int(np.bincount(y_true[idx]).argmax()), []).append(idx)
    return [units[c] for c in sorted(units)]


def _percentile_interval(y_true, prediction_sets: list[list[np.ndarray]], metric: str, n_classes: int, *,
                         n_boot: int, seed: int, level: float, groups=None) -> tuple[float, float]:
    """The interval of the seed-mean of one set, or of the first set's minus the second's,
    over class-stratified resamples of the slides, or of the groups (the same resamples for
    every seed and set, so the sets are compared on the same slides)."""
    y_true = np.asarray(y_true, dtype=np.int64)
    sets = [[np.asarray(p, dtype=np.int64) for p in preds] for preds in prediction_sets]
    if len(y_true) == 0 or not all(sets):
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    strata = resample_units(y_true, groups)
    values = []
    for _ in range(n_boot):
        idx = np.concatenate([u[k] for u in strata for k in rng.integers(0, len(u), size=len(u))])
        means = []
        for preds in sets:
            scores = [_fast_metric(metric, y_true[idx], p[idx], n_classes) for p in preds]
            means.append(math.nan if any(math.isnan(s) for s in scores) else sum(scores) / len(scores))
        if not any(math.isnan(m) for m in means):
            values.append(means[0] - means[1] if len(means) == 2 else means[0])
    if not values:
        return math.nan, math.nan
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(values, [tail, 100.0 - tail])
    return float(lo), float(hi)


def chance_metrics(y_true, n_classes: int) -> dict[str, float]:
    """What a head that knows nothing scores on a cohort: QWK 0 (agreement at chance),
    balanced accuracy 1/C over the C classes present (any constant prediction), macro
    AUC 0.5, and the accuracy of always predicting the cohort's majority class."""
    y_true = np.asarray(y_true, dtype=np.int64)
    if len(y_true) == 0:
        return {"qwk": math.nan, "qwk_x100": math.nan, "accuracy": math.nan, "balanced_accuracy": math.nan,
                "auc_macro": math.nan, "n_slides": 0}
    counts = np.bincount(y_true, minlength=n_classes)
    return {"qwk": 0.0, "qwk_x100": 0.0, "accuracy": float(counts.max() / len(y_true)),
            "balanced_accuracy": 1.0 / int((counts > 0).sum()), "auc_macro": 0.5, "n_slides": int(len(y_true))}
