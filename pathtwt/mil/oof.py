"""Pooled out-of-fold predictions of k-fold cross-validation.

Each fold's head tests its own fold, so the test predictions of the K runs of one seed
together cover every slide of the cohort once: the headline is computed on that pool
(all slides at once, with the bootstrap over all slides, or over patients where the table
has groups), and the K per-fold values give the spread over folds beside it.

An external cohort is predicted by every fold's head; its pooled prediction of a slide is
the mean of the K heads' class probabilities (an ensemble of the fold heads), and its
per-fold values are each head's own.
"""

from __future__ import annotations

import math

import numpy as np

from pathtwt.errors import PathtwtError
from pathtwt.mil.labels import slide_listing

INTERNAL = "test"
VALIDATION = "val"


def pool_seed(fold_predictions: dict[int, dict[str, dict[str, np.ndarray]]], where: str) -> dict[str, dict[str, np.ndarray]]:
    """cohort -> pooled predictions of one seed, from ``{fold: read_predictions(run)}``:
    the internal test folds concatenated (a slide tested by two folds is an error), each
    external cohort averaged over the folds' probabilities. Validation is left out."""
    folds = sorted(fold_predictions)
    out: dict[str, dict[str, np.ndarray]] = {}
    tests = [(f, fold_predictions[f][INTERNAL]) for f in folds if INTERNAL in fold_predictions[f]]
    if tests:
        ids = np.concatenate([t["slide_id"] for _, t in tests])
        unique, counts = np.unique(ids, return_counts=True)
        twice = list(unique[counts > 1])
        if twice:
            raise PathtwtError(f"{where}: slide(s) tested by more than one fold: {slide_listing(twice)}; "
                               "the runs come from different fold tables: rerun them from one")
        entry = {k: np.concatenate([t[k] for _, t in tests]) for k in ("slide_id", "label", "prediction", "probs")}
        if all("group" in t for _, t in tests):
            entry["group"] = np.concatenate([t["group"] for _, t in tests])
        entry["fold"] = np.concatenate([np.full(len(t["slide_id"]), f) for f, t in tests])
        order = np.argsort(entry["slide_id"], kind="stable")
        out[INTERNAL] = {k: v[order] for k, v in entry.items()}
    externals = dict.fromkeys(c for f in folds for c in fold_predictions[f] if c not in (INTERNAL, VALIDATION))
    for cohort in externals:
        parts = [fold_predictions[f][cohort] for f in folds if cohort in fold_predictions[f]]
        common = sorted(set.intersection(*(set(p["slide_id"]) for p in parts)))
        probs, label = [], None
        for p in parts:
            pos = {s: i for i, s in enumerate(p["slide_id"])}
            idx = np.array([pos[s] for s in common], dtype=np.int64)
            probs.append(p["probs"][idx])
            label = p["label"][idx]
        mean = np.mean(probs, axis=0)
        out[cohort] = {"slide_id": np.array(common, dtype=object), "label": label, "probs": mean,
                       "prediction": mean.argmax(axis=1) if mean.size else np.zeros(len(common), np.int64)}
    return out


def mean_std(values: list[float]) -> tuple[float, float, int]:
    """(mean, sample standard deviation (0 for one value), n); NaNs for no value."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std, n


def fold_spread(values: dict[int, list[float | None]]) -> tuple[float, float, int]:
    """(mean, sample std, K) over folds of ``{fold: [value of each seed]}``, each fold the
    mean of its seeds; undefined values are left out."""
    per_fold = []
    for f in sorted(values):
        vals = [v for v in values[f] if v is not None and not math.isnan(v)]
        if vals:
            per_fold.append(sum(vals) / len(vals))
    return mean_std(per_fold)
