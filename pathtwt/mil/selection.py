"""Which epoch's model is reported.

- ``best``: the epoch with the highest validation score (grading: validation QWK).
- ``moving-average``: the epoch whose trailing ``window``-epoch mean of the validation
  score is highest (metastasis: 5-epoch mean of validation accuracy). Only epochs with a
  full window are candidates; a run shorter than the window uses its whole length as the
  window.

Ties go to the earliest epoch. Because both rules look only backwards, the selected
epoch of a prefix of the curve is final as soon as it is selected, so the training loop
keeps the selected weights in memory instead of saving every epoch.
"""

from __future__ import annotations

import math
from typing import Sequence

RULES = ("best", "moving-average")


def selection_scores(curve: Sequence[float | None], rule: str, window: int = 5, total_epochs: int | None = None) -> list[float | None]:
    """Per-epoch selection score (None where an epoch cannot be selected)."""
    values = [float("nan") if v is None else float(v) for v in curve]
    if rule == "best":
        return [None if math.isnan(v) else v for v in values]
    if rule != "moving-average":
        raise ValueError(f"unknown selection rule {rule!r}; choose one of {RULES}")
    total = len(values) if total_epochs is None else total_epochs
    width = max(1, min(window, total))
    scores: list[float | None] = []
    for i in range(len(values)):
        if i + 1 < width:
            scores.append(None)
            continue
        chunk = values[i + 1 - width : i + 1]
        # an undefined value (e.g. a one-class validation QWK) counts as the worst score
        scores.append(sum(-math.inf if math.isnan(v) else v for v in chunk) / width)
    return scores


def select_epoch(curve: Sequence[float | None], rule: str, window: int = 5, total_epochs: int | None = None) -> int | None:
    """0-based index of the selected epoch, or None when no epoch qualifies yet."""
    best_index, best_score = None, -math.inf
    for i, score in enumerate(selection_scores(curve, rule, window, total_epochs)):
        if score is not None and (best_index is None or score > best_score):
            best_index, best_score = i, score
    return best_index
