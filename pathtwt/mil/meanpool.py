"""The mean-pooling baseline head (``meanpool``): each slide is the mean of its tile
embeddings, standardised with the training slides' mean and standard deviation, and
classified by a multinomial logistic regression whose inverse regularisation C is chosen
on the validation slides (by the protocol's selection metric; ties go to the smaller C,
the stronger regularisation). It is the slide-level linear probe of the field's
benchmarks and the floor an attention head should beat; it trains in seconds.

The fitted head is saved like an attention head's checkpoint, its ``model`` entry a dict
of tensors (standardisation, coefficients, intercepts, the classes seen in training), so
it loads with ``torch.load(weights_only=True)``; :func:`predict` applies it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from pathtwt.mil.data import Cohort, MILData, load_bag
from pathtwt.mil.metrics import slide_metrics

C_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
MAX_ITER = 5000


class FitOptions(Protocol):
    """What the fit reads of a :class:`~pathtwt.mil.protocols.MILConfig`. Not the class
    itself: the head registry names this module and the config's default names the
    registry's head, so importing protocols here would close an import cycle."""

    aggregator: str
    seed: int
    class_weighted: bool
    selection_metric: str


def bag_means(cohort: Cohort) -> np.ndarray:
    """(n_slides, D) mean tile embedding of every slide, in float64."""
    return np.stack([load_bag(b)[0].astype(np.float64).mean(axis=0) for b in cohort.bags])


def predict(model: dict, n_classes: int, means: np.ndarray) -> np.ndarray:
    """(n, n_classes) class probabilities of slides' mean embeddings under a fitted head
    (a checkpoint's ``model``); classes absent from training get probability 0."""
    as_np = {k: (v.numpy() if hasattr(v, "numpy") else np.asarray(v)) for k, v in model.items()}
    x = (means - as_np["mean"]) / as_np["scale"]
    logits = x @ as_np["coef"].T + as_np["intercept"]
    classes = as_np["classes"].astype(np.int64)
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    out = np.zeros((len(means), int(n_classes)))
    out[:, classes] = p
    return out


def fit_head(x_train: np.ndarray, y_train: np.ndarray, c: float, *, class_weighted: bool, seed: int) -> dict:
    """A fitted head (the tensors :func:`predict` reads) on slides' mean embeddings:
    standardised with these slides, then a logistic regression with inverse
    regularisation ``c``."""
    import torch
    from sklearn.linear_model import LogisticRegression

    mean = x_train.mean(axis=0)
    scale = x_train.std(axis=0)
    scale[scale == 0] = 1.0  # a constant dimension carries nothing; leave it at 0
    model = LogisticRegression(C=c, max_iter=MAX_ITER, class_weight="balanced" if class_weighted else None,
                               random_state=seed)
    model.fit((x_train - mean) / scale, y_train)
    coef, intercept = model.coef_, model.intercept_
    if len(model.classes_) == 2:  # one logit row for the second class -> two rows
        coef, intercept = np.vstack([np.zeros_like(coef), coef]), np.concatenate([[0.0], intercept])
    return {"mean": torch.from_numpy(mean), "scale": torch.from_numpy(scale), "coef": torch.from_numpy(coef),
            "intercept": torch.from_numpy(np.asarray(intercept, dtype=np.float64)),
            "classes": torch.from_numpy(model.classes_.astype(np.int64))}


def fit_meanpool(data: MILData, config: FitOptions) -> tuple[dict, dict, dict[str, np.ndarray]]:
    """(checkpoint state, summary with the per-C validation history, probabilities of
    every evaluated cohort under the selected C)."""
    x_train = bag_means(data.train)
    y_train = data.train.labels
    means = {c.name: bag_means(c) for c in data.evaluated}
    val = data.evaluated[0]
    history, fitted = [], []
    for i, c in enumerate(C_GRID):
        head = fit_head(x_train, y_train, c, class_weighted=config.class_weighted, seed=config.seed)
        state = {"model": head, "aggregator": config.aggregator, "n_classes": data.n_classes, "in_dim": data.dim, "C": c}
        metrics = slide_metrics(val.labels, predict(head, data.n_classes, means[val.name]), data.n_classes)
        history.append({"epoch": i + 1, "C": c, "val": metrics})
        fitted.append(state)
    from pathtwt.mil.selection import select_epoch

    curve = [h["val"][config.selection_metric] for h in history]
    best = select_epoch(curve, "best")
    fallback = best is None
    if fallback:  # the validation metric undefined for every C: the middle of the grid
        best = len(C_GRID) // 2
    state = fitted[best]
    probs = {name: predict(state["model"], data.n_classes, m) for name, m in means.items()}
    summary = {"selected_epoch": best + 1, "selected_C": C_GRID[best], "selection_fallback_to_last": fallback,
               "history": history}
    return state, summary, probs
