"""k-fold cross-validation folds, stratified by class and kept whole by group (patient,
case), with an optional compression-only hold-out.

Every slide of the cohort gets a ``fold``: 0..K-1 for the slides that are tested (each in
exactly one test fold), or :data:`HOLDOUT` (-1) for the compression-only hold-out, the
slides calibration, discovery and distillation draw from and no fold reports on.

The draw works on groups (a slide without a group is its own group), like scikit-learn's
``StratifiedGroupKFold``: groups are placed one at a time, largest first (seeded order
among equal sizes), each into the bin (the hold-out or a fold) where it brings the bins'
class counts closest to their targets (bin fraction x class total). With one slide per
group every class is split as evenly as rounding allows; with groups the counts can miss
their targets, and :func:`stratification_gaps` says where.

For fold ``f``, :func:`fold_roles` gives the slides' roles: test = fold f, val = fold
(f + 1) mod K (so the validation part is stratified and group-aware too, and every slide
is validated on exactly once), train = the other K - 2 folds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pathtwt.errors import ConfigError

HOLDOUT = -1  # the fold value of a compression-only slide
HOLDOUT_SPLIT = "compress"  # its `split` value in a label table
FOLD_SPLIT = "cv"  # the `split` value of every slide that is in a fold


@dataclass(frozen=True)
class Gap:
    """A (bin, class) whose slide count is more than rounding away from its target."""

    fold: int  # HOLDOUT for the hold-out
    label: int
    count: int
    target: float

    def __str__(self) -> str:
        where = "hold-out" if self.fold == HOLDOUT else f"fold {self.fold}"
        return f"{where} class {self.label}: {self.count} slides (target {self.target:.1f})"


def group_ids(slide_ids: list[str], groups: list[str] | None) -> list[str]:
    """The group of each slide; a slide without one (None or empty) is its own group."""
    if groups is None:
        return [f"slide:{s}" for s in slide_ids]
    return [f"group:{g}" if g not in (None, "") else f"slide:{s}" for s, g in zip(slide_ids, groups)]


# the fewest folds that leave a fold to train on: for test fold f the heads select on fold
# f+1 and train on the other K-2
MIN_FOLDS = 3


def check_fold_count(k: object, where: str) -> None:
    """Refuse a fold count that leaves no training slide (fewer than :data:`MIN_FOLDS`)."""
    if not isinstance(k, int) or isinstance(k, bool) or k < MIN_FOLDS:
        raise ConfigError(f"{where}: folds {k!r} leaves no training slide (for test fold f the heads select on fold "
                          f"f+1 and train on the other K-2 folds); give at least {MIN_FOLDS} folds")


def check_k(labels: np.ndarray, groups: list[str], k: int, where: str) -> None:
    """K folds need at least K slides of every class and at least K groups."""
    classes, counts = np.unique(labels, return_counts=True)
    if len(counts) and counts.min() < k:
        small = int(classes[counts.argmin()])
        raise ConfigError(
            f"{where}: folds {k} is larger than the smallest class (class {small}: {int(counts.min())} slides"
            f" outside the hold-out); use at most {int(counts.min())} folds"
        )
    n_groups = len(set(groups))
    if n_groups < k:
        raise ConfigError(f"{where}: folds {k} is larger than the number of groups ({n_groups}); use at most {n_groups} folds")


def assign_folds(
    slide_ids: list[str], labels, k: int, seed: int = 0, groups: list[str] | None = None, holdout: float = 0.0,
    where: str = "label table",
) -> np.ndarray:
    """The fold of every slide (0..K-1, or HOLDOUT), drawn as the module says. Depends on
    the slide ids, labels and groups, not on the row order."""
    labels = np.asarray(labels, dtype=np.int64)
    check_fold_count(k, where)
    if not 0.0 <= holdout < 1.0:
        raise ConfigError(f"{where}: holdout {holdout}: give a fraction in [0, 1)")
    gids = group_ids(list(slide_ids), groups)
    classes = np.unique(labels)
    col = {c: j for j, c in enumerate(classes)}
    members: dict[str, list[int]] = {}
    for i, g in enumerate(gids):
        members.setdefault(g, []).append(i)
    counts = {g: np.bincount([col[labels[i]] for i in idx], minlength=len(classes)) for g, idx in members.items()}
    totals = np.bincount([col[y] for y in labels], minlength=len(classes)).astype(float)
    weights = np.array(([holdout] if holdout > 0 else []) + [(1.0 - holdout) / k] * k)
    bins = (["holdout"] if holdout > 0 else []) + list(range(k))
    if holdout > 0 and np.round(holdout * totals).min() < 1:
        raise ConfigError(f"{where}: holdout {holdout} leaves a class without a hold-out slide; raise it or give none")
    rng = np.random.default_rng(seed)
    names = sorted(members)
    order = [names[i] for i in rng.permutation(len(names))]
    order.sort(key=lambda g: -len(members[g]))  # stable: the seeded order among equal sizes
    filled = np.zeros((len(bins), len(classes)))
    target = weights[:, None] * totals[None, :]
    out = np.empty(len(labels), dtype=np.int64)
    for g in order:
        c = counts[g]
        # squared distance of every bin's class counts to their targets, after adding g there
        before = ((filled - target) ** 2 / np.maximum(totals, 1)).sum(1)
        after = ((filled + c - target) ** 2 / np.maximum(totals, 1)).sum(1)
        cost = after - before
        best = np.flatnonzero(np.isclose(cost, cost.min()))
        # among equally good bins: the emptiest relative to its size, then the seeded draw
        fill = filled.sum(1)[best] / weights[best]
        best = best[np.isclose(fill, fill.min())]
        b = int(best[rng.integers(len(best))])
        filled[b] += c
        out[members[g]] = HOLDOUT if bins[b] == "holdout" else bins[b]
    check_k(labels[out != HOLDOUT], [gids[i] for i in np.flatnonzero(out != HOLDOUT)], k, where)
    check_every_fold_has_every_class(labels, out, k, where)
    return out


def check_every_fold_has_every_class(labels: np.ndarray, folds: np.ndarray, k: int, where: str) -> None:
    """A fold without a slide of some class cannot test (or validate) that class."""
    labels, folds = np.asarray(labels), np.asarray(folds)
    missing = [f"fold {f} has no slide of class {int(c)}" for f in range(k) for c in np.unique(labels[folds != HOLDOUT])
               if not np.any((folds == f) & (labels == c))]
    if missing:
        raise ConfigError(f"{where}: {'; '.join(missing)}; use fewer folds or other groups")


def stratification_gaps(labels, folds, holdout: float, k: int) -> list[Gap]:
    """Every (bin, class) more than one slide away from its target (rounding allows one)."""
    labels, folds = np.asarray(labels), np.asarray(folds)
    gaps = []
    for c in np.unique(labels):
        total = float(np.sum(labels == c))
        for f, w in ([(HOLDOUT, holdout)] if holdout > 0 else []) + [(f, (1 - holdout) / k) for f in range(k)]:
            n = int(np.sum((folds == f) & (labels == c)))
            if abs(n - w * total) >= 1.0:
                gaps.append(Gap(int(f), int(c), n, w * total))
    return gaps


def mixed_label_groups(labels, groups: list[str] | None, slide_ids: list[str]) -> list[str]:
    """Groups whose slides carry different labels (allowed: a patient's slides may differ)."""
    if groups is None:
        return []
    seen: dict[str, set[int]] = {}
    for g, y in zip(group_ids(slide_ids, groups), labels):
        seen.setdefault(g, set()).add(int(y))
    return sorted(g.split(":", 1)[1] for g, ys in seen.items() if len(ys) > 1 and g.startswith("group:"))


def val_fold(test_fold: int, k: int) -> int:
    """The validation fold that goes with a test fold."""
    return (test_fold + 1) % k


def fold_roles(folds, test_fold: int, k: int) -> np.ndarray:
    """train / val / test of every slide when ``test_fold`` is tested; hold-out slides get ""."""
    folds = np.asarray(folds)
    roles = np.where(folds == test_fold, "test", np.where(folds == val_fold(test_fold, k), "val", "train"))
    return np.where(folds == HOLDOUT, "", roles)


def check_fold_column(folds, k: int, where: str) -> None:
    """A label table's fold column must hold exactly 0..K-1 (plus HOLDOUT)."""
    values = {int(v) for v in np.asarray(folds) if int(v) != HOLDOUT}
    if values != set(range(k)):
        missing = sorted(set(range(k)) - values)
        extra = sorted(values - set(range(k)))
        detail = (f"lacks fold(s) {missing}" if missing else "") + ("; " if missing and extra else "") + (
            f"has fold(s) {extra} outside 0..{k - 1}" if extra else "")
        raise ConfigError(f"{where}: fold column {detail}; redraw it with `pathtwt labels split --folds {k}`")
