"""Slide-level metrics: quadratic weighted kappa (the grading score, reported x100),
accuracy, balanced accuracy and macro one-vs-rest AUC, all from scikit-learn.

QWK and the confusion matrix are computed over the task's full class range
``0..n_classes-1`` (``labels=``), so that the disagreement weight between grades i and j
is always (i - j)^2, also when some grade is absent from both labels and predictions
(scikit-learn's default would re-index the labels that happen to occur). Undefined
values (0 / 0) are NaN, never a warning or a made-up number."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np


def confusion(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> np.ndarray:
    """(n_classes, n_classes) counts, rows = truth, columns = prediction, as float64."""
    from sklearn.metrics import confusion_matrix

    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    if len(y_true) == 0:
        return np.zeros((n_classes, n_classes), dtype=np.float64)
    return confusion_matrix(y_true, y_pred, labels=np.arange(n_classes)).astype(np.float64)


def quadratic_weighted_kappa(y_true, y_pred, n_classes: int | None = None) -> float:
    """Cohen's kappa with quadratic weights; NaN when it is undefined (0 / 0, e.g. every
    label and prediction is one and the same class)."""
    from sklearn.exceptions import UndefinedMetricWarning
    from sklearn.metrics import cohen_kappa_score

    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    if n_classes is None:
        n_classes = int(max(y_true.max(initial=0), y_pred.max(initial=0))) + 1
    if len(y_true) == 0:
        return float("nan")
    with warnings.catch_warnings():
        # 0 / 0 gives NaN (the value we return) with a warning: a RuntimeWarning before
        # scikit-learn 1.6, an UndefinedMetricWarning since
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        value = cohen_kappa_score(y_true, y_pred, labels=np.arange(n_classes), weights="quadratic")
    return float(value)


def balanced_accuracy(y_true, y_pred) -> float:
    """Mean recall over the classes present in ``y_true``."""
    from sklearn.metrics import balanced_accuracy_score

    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    if len(y_true) == 0:
        return float("nan")
    with warnings.catch_warnings():
        # predicted classes absent from y_true have no recall; scikit-learn leaves them
        # out, as this definition does, and warns about it
        warnings.simplefilter("ignore", UserWarning)
        return float(balanced_accuracy_score(y_true, y_pred))


def macro_auc(y_true, probs: np.ndarray) -> float:
    """Binary: AUC of the positive-class probability. Multi-class: mean one-vs-rest AUC
    over the classes that have both positives and negatives in ``y_true``; NaN when no
    class qualifies (a cohort with a single label)."""
    from sklearn.metrics import roc_auc_score

    y_true = np.asarray(y_true, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    if probs.shape[1] == 2:
        if len(np.unique(y_true)) < 2:
            return float("nan")
        return float(roc_auc_score(y_true, probs[:, 1]))
    aucs = []
    for c in range(probs.shape[1]):
        positives = y_true == c
        if positives.any() and not positives.all():
            aucs.append(roc_auc_score(positives.astype(int), probs[:, c]))
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
