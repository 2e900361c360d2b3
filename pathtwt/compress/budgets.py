"""Appendix B's training budgets, as data: what the paper trained each method for on the
calibration tiles (epochs = passes over the fit split). A run's own budget is whatever
--steps / --epochs (or the config) gave; model.json records both. Methods that do not train
have none. A module of its own (no imports) so that the export, which records these, and
the method registry, which names the methods, do not import each other."""

from __future__ import annotations

from typing import Any

PAPER_BUDGETS: dict[str, dict[str, Any] | None] = {
    "twt": {"epochs": {"h0-mini": 1.5, "hibou-b": 2.0}},
    "nose": {"epochs": 2.0},
    "wdpruning": {"epochs": 2.0},
    "raptor": {"stage1_epochs": 1.0, "stage2_epochs": 2.0},
    "truncation": None,
    "linear": None,
    "subset": None,
}
