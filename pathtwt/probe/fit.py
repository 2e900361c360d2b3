"""Embed a probe set with a backbone and read the embeddings out with two probes.

- ``logistic``: multinomial logistic regression (scikit-learn, L2, C = 1.0, lbfgs) on
  features standardised with the train split's mean and standard deviation. One fixed
  regularisation for every backbone, so no choice is made on the test split.
- ``knn``: k = 20 nearest train tiles by cosine distance on the raw embeddings, majority
  vote (the class probabilities are the vote shares).

Both report balanced accuracy, accuracy and macro one-vs-rest AUC on the test split, and
a 95 % percentile bootstrap interval of the balanced accuracy (test tiles resampled with
replacement, stratified by class, seeded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from pathtwt.errors import NumericsError
from pathtwt.mil.metrics import balanced_accuracy, macro_auc
from pathtwt.probe.data import ProbeSet, read_tile

LOGISTIC_C = 1.0
KNN_K = 20
BOOTSTRAP_ROUNDS = 1000


@dataclass
class ProbeResult:
    name: str
    probs: np.ndarray  # (n_test, n_classes)
    metrics: dict[str, Any]


def embed_probe_set(
    backbone: Any, probe_set: ProbeSet, *, batch_size: int = 32, progress: Callable[[int, int], None] | None = None,
    bf16_autocast: bool = False,
) -> tuple[np.ndarray, dict[str, str]]:
    """(n_tiles, D) float32 tile embeddings in ``probe_set.tiles`` order, and the precision
    they were computed in (probe.json's ``precision`` and ``precision_check``). Every image
    goes through the backbone's own transform (resized to its input, its normalisation).
    ``bf16_autocast``: bf16 autocast if the first tiles agree with fp32, as in extraction."""
    import torch

    from pathtwt.models.bf16_guard import AutoPrecision, check_bf16_on

    n = len(probe_set.tiles)
    out = np.zeros((n, backbone.embedding_dim), dtype=np.float32)
    precision: AutoPrecision | None = None
    with torch.inference_mode():
        for start in range(0, n, batch_size):
            chunk = probe_set.tiles[start : start + batch_size]
            images = [read_tile(probe_set.root, t.path) for t in chunk]
            x = backbone.transform.batch(images).to(backbone.device)
            if precision is None:
                precision = (check_bf16_on(backbone.model, x, backbone.spec.num_prefix_tokens, where=str(probe_set.root),
                                           tool="probe") if bf16_autocast else AutoPrecision())
            with precision.context(backbone.device, backbone.model):
                out[start : start + len(chunk)] = backbone.embed_tiles(x).float().cpu().numpy()
            if progress is not None:
                progress(start + len(chunk), n)
    if not np.isfinite(out).all():
        bad = [probe_set.tiles[i].path for i in np.flatnonzero(~np.isfinite(out).all(axis=1))[:3]]
        raise NumericsError(f"{probe_set.root}: non-finite embeddings for tiles {bad}; check the backbone weights")
    if precision is None or not bf16_autocast:
        return out, {"precision": backbone.precision}
    return out, precision.attrs()


def fit_logistic(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, n_classes: int, seed: int) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), LogisticRegression(C=LOGISTIC_C, max_iter=5000, random_state=seed))
    model.fit(train_x, train_y)
    return _full_probs(model.predict_proba(test_x), model.classes_, n_classes)


def fit_knn(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, n_classes: int) -> np.ndarray:
    from sklearn.neighbors import KNeighborsClassifier

    model = KNeighborsClassifier(n_neighbors=min(KNN_K, len(train_x)), metric="cosine", algorithm="brute")
    model.fit(train_x, train_y)
    return _full_probs(model.predict_proba(test_x), model.classes_, n_classes)


def _full_probs(probs: np.ndarray, seen: np.ndarray, n_classes: int) -> np.ndarray:
    out = np.zeros((len(probs), n_classes), dtype=np.float64)
    out[:, np.asarray(seen, dtype=np.int64)] = probs
    return out


def bootstrap_interval(y_true: np.ndarray, y_pred: np.ndarray, *, rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0) -> list[float]:
    """95 % percentile interval of the balanced accuracy over test-set resamples drawn
    within each class (so every resample holds every class)."""
    rng = np.random.default_rng(seed)
    members = [np.flatnonzero(y_true == c) for c in np.unique(y_true)]
    values = np.empty(rounds)
    for r in range(rounds):
        idx = np.concatenate([rng.choice(m, size=len(m), replace=True) for m in members])
        values[r] = balanced_accuracy(y_true[idx], y_pred[idx])
    lo, hi = np.percentile(values, [2.5, 97.5])
    return [float(lo), float(hi)]


def probe_metrics(y_true: np.ndarray, probs: np.ndarray, *, seed: int) -> dict[str, Any]:
    y_pred = probs.argmax(axis=1)
    auc = macro_auc(y_true, probs)
    return {
        "balanced_accuracy": balanced_accuracy(y_true, y_pred),
        "balanced_accuracy_ci95": bootstrap_interval(y_true, y_pred, seed=seed),
        "accuracy": float(np.mean(y_pred == y_true)),
        "macro_auc": None if np.isnan(auc) else float(auc),
    }


def run_probes(features: np.ndarray, probe_set: ProbeSet, *, seed: int = 0) -> list[ProbeResult]:
    """Fit both probes on the train tiles, evaluate on the test tiles."""
    split = np.array([t.split for t in probe_set.tiles])
    labels = np.array([t.label for t in probe_set.tiles], dtype=np.int64)
    train, test = split == "train", split == "test"
    n_classes = len(probe_set.classes)
    results = []
    for name, probs in (
        ("logistic", fit_logistic(features[train], labels[train], features[test], n_classes, seed)),
        ("knn", fit_knn(features[train], labels[train], features[test], n_classes)),
    ):
        results.append(ProbeResult(name=name, probs=probs, metrics=probe_metrics(labels[test], probs, seed=seed)))
    return results
