"""Layer-subset search: which K of the teacher's L layers to keep, in their original order.

Deleting blocks of layers costs more than the sum of deleting each alone (super-additive),
so ranking single-layer deletions once and dropping the cheapest ones can pick exactly
the pairs that hurt together. Local search fixes that: start from the ranking's subset,
then repeatedly try swapping one kept layer for one dropped layer (neighbours in a seeded
random order) and move to the first swap that scores better; stop at a local optimum or
when the budget of evaluations is spent. Two controls: random search with the same budget,
and the single-deletion ranking's subset on its own (the search's starting point).

A scorer maps a subset (sorted 0-based layer indices) to a fidelity, higher is better; the
search is independent of how it is computed. The default scorer distills the K-layer
student for a short budget and measures the embedding R^2 on the calibration set's select
tiles (never its report tiles, on which the exported model's fidelity is reported); the
winning subset is then distilled with the full budget and exported as a plain timm ViT of
depth K.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from pathtwt.compress.method_options import method_option
from pathtwt.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from pathtwt.compress.calibration import CalibrationSet
    from pathtwt.compress.distill import DeepSupervision
    from pathtwt.compress.pipeline import CompressOptions
    from pathtwt.models.registry import Backbone

Subset = tuple[int, ...]
Scorer = Callable[[Subset], float]


class BudgetExhausted(Exception):
    """Raised inside the search when no evaluation is left (caught by the search itself)."""


@dataclass
class SearchResult:
    best: Subset
    best_score: float
    evaluations: int  # distinct subsets scored
    trace: list[tuple[Subset, float]] = field(default_factory=list)  # every scoring, in order
    start: Subset | None = None  # the subset the search started from (local search)

    def to_dict(self) -> dict[str, Any]:
        # 1-based layer numbers in files, as in plans
        out = {"best_layers": [i + 1 for i in self.best], "best_score": self.best_score, "evaluations": self.evaluations,
               "trace": [[[i + 1 for i in s], round(v, 6)] for s, v in self.trace]}
        if self.start is not None:
            out["start_layers"] = [i + 1 for i in self.start]
            out["start_score"] = next((v for s, v in self.trace if s == self.start), None)
        return out


class BudgetedScorer:
    """Caches scores (a subset is never paid for twice) and counts distinct evaluations."""

    def __init__(self, scorer: Scorer, budget: int) -> None:
        self.scorer, self.budget = scorer, int(budget)
        self.cache: dict[Subset, float] = {}
        self.trace: list[tuple[Subset, float]] = []

    def __call__(self, subset: Subset) -> float:
        subset = tuple(sorted(subset))
        if subset not in self.cache:
            if len(self.cache) >= self.budget:
                raise BudgetExhausted
            score = float(self.scorer(subset))
            self.cache[subset] = score
            self.trace.append((subset, score))
        return self.cache[subset]

    def best(self, size: int) -> tuple[Subset, float]:
        candidates = [(s, v) for s, v in self.cache.items() if len(s) == size]
        return max(candidates, key=lambda sv: sv[1])

    def result(self, size: int, start: Subset | None = None) -> SearchResult:
        best, score = self.best(size)
        return SearchResult(best=best, best_score=score, evaluations=len(self.cache), trace=list(self.trace), start=start)


def _check(num_layers: int, keep: int) -> None:
    if not 1 <= keep < num_layers:
        raise ConfigError(f"--depth {keep}: keep between 1 and {num_layers - 1} of the teacher's {num_layers} layers")


def rank_single_deletions(num_layers: int, keep: int, score: Scorer) -> Subset:
    """Score the L models that lack one layer; keep the ``keep`` layers whose deletion hurts most."""
    _check(num_layers, keep)
    cost = {i: -score(tuple(j for j in range(num_layers) if j != i)) for i in range(num_layers)}
    # highest deletion cost first; ties broken towards earlier layers
    ranked = sorted(range(num_layers), key=lambda i: (-cost[i], i))
    return tuple(sorted(ranked[:keep]))


def local_search(num_layers: int, keep: int, scorer: Scorer, *, budget: int, start: Subset | str = "ranking", seed: int = 0) -> SearchResult:
    """First-improvement swap search within ``budget`` distinct evaluations (the ranking
    start's L evaluations included). Swaps are tried in order of their additive estimate
    (single-deletion cost of the layer dropped minus that of the layer restored, when the
    ranking is known; seeded random order otherwise): under additivity the ranking's subset
    is optimal, so the least-bad-looking swaps are exactly the ones that can undo an
    interaction the ranking could not see."""
    _check(num_layers, keep)
    needed = num_layers + 1 if start == "ranking" else 1
    if budget < needed:
        raise ConfigError(f"subset search budget {budget} is below the {needed} evaluations its start needs; raise search_budget")
    scored = BudgetedScorer(scorer, budget)
    rng = np.random.default_rng(seed)
    cost: dict[int, float] = {}
    first: Subset | None = None
    try:
        if start == "ranking":
            current = rank_single_deletions(num_layers, keep, scored)
            full = tuple(range(num_layers))
            cost = {i: -scored(tuple(j for j in full if j != i)) for i in full}  # cached: free
        elif start == "first":
            current = tuple(range(keep))
        else:
            current = tuple(sorted(start))
        first = current
        current_score = scored(current)
        improved = True
        while improved:
            improved = False
            dropped = [j for j in range(num_layers) if j not in current]
            swaps = list(itertools.product(current, dropped))
            order = rng.permutation(len(swaps))
            if cost:
                order = sorted(order, key=lambda k: cost[swaps[k][0]] - cost[swaps[k][1]])
            for k in order:
                out_layer, in_layer = swaps[k]
                candidate = tuple(sorted(set(current) - {out_layer} | {in_layer}))
                value = scored(candidate)
                if value > current_score:
                    current, current_score, improved = candidate, value, True
                    break
    except BudgetExhausted:
        pass
    return scored.result(keep, start=first)


def random_search(num_layers: int, keep: int, scorer: Scorer, *, budget: int, seed: int = 0) -> SearchResult:
    """The control: ``budget`` distinct uniformly random K-subsets, best kept."""
    _check(num_layers, keep)
    scored = BudgetedScorer(scorer, budget)
    rng = np.random.default_rng(seed)
    total = math.comb(num_layers, keep)
    try:
        while len(scored.cache) < min(budget, total):
            scored(tuple(sorted(rng.choice(num_layers, size=keep, replace=False).tolist())))
    except BudgetExhausted:
        pass
    return scored.result(keep)


# ---------------------------------------------------------------------------- distillation


def subset_boundaries(subset: Subset, num_layers: int) -> list[int]:
    """Teacher layer numbers (1-based) matched by the student's blocks: kept layer j stands
    for the teacher's layers up to the next kept one, so it is supervised with the output of
    the layer just before it (the last with the teacher's final layer)."""
    return [subset[j + 1] for j in range(len(subset) - 1)] + [num_layers]


def subset_student(teacher: Backbone, subset: Subset) -> nn.Module:
    """A plain timm ViT made of copies of the teacher's layers ``subset`` (0-based), in order."""
    from pathtwt.compress.student import clone_layers, stitch_student

    return stitch_student(teacher.model, clone_layers(teacher.model, subset), spec=teacher.spec)


def candidate_student(teacher: Backbone, subset: Subset) -> nn.Module:
    """The same network as :func:`subset_student` for scoring: a trainable copy of the
    teacher with only the kept blocks. Skips building and initialising a fresh model,
    which dominates a candidate's cost on small budgets."""
    import copy

    from torch import nn

    student = copy.deepcopy(teacher.model)
    student.blocks = nn.Sequential(*(student.blocks[i] for i in subset))
    return student.requires_grad_(True)


def subset_objective(teacher: Backbone, subset: Subset, options: CompressOptions, steps: int) -> DeepSupervision:
    """TWT's deep supervision at the subset's boundaries, ramp schedule per the backbone's default."""
    from pathtwt.compress.distill import DeepSupervision
    from pathtwt.compress.pipeline import backbone_default
    from pathtwt.compress.schedule import default_alphas

    boundaries = subset_boundaries(subset, len(teacher.model.blocks))
    alphas = default_alphas(len(boundaries) + 1, steps) if backbone_default(options.schedule, teacher.spec) else None
    return DeepSupervision(boundaries=boundaries, alphas=alphas)


def distillation_scorer(teacher: Backbone, calib: CalibrationSet, options: CompressOptions, *, steps: int) -> Scorer:
    """Embedding R^2 on the select tiles after a short distillation of the candidate subset
    (no augmentation, on the first ``steps * batch_size`` fit tiles only: the teacher's
    targets are then computed once per candidate for just the tiles the short run sees).
    Several ranks score together and take rank 0's score (:func:`pathtwt.compress.ranks.decide`):
    the search compares scores, and a near tie that fell differently on two GPUs would send
    the ranks to different candidates, one distilling where another found its score cached,
    their collectives no longer matching."""
    from pathtwt.compress.distill import distill
    from pathtwt.compress.methods.common import select_r2, side_run_options
    from pathtwt.compress.ranks import decide

    tiles = calib.fit[: max(1, steps * options.distill.batch_size)]

    def score(subset: Subset) -> float:
        student = candidate_student(teacher, subset)
        if steps > 0:
            distill(student, teacher.model, tiles, transform=teacher.transform,
                    objective=subset_objective(teacher, subset, options, steps),
                    options=side_run_options(options, steps=steps, augment=False), description=f"subset {subset}")
        return decide(f"the score of layers {list(subset)}", select_r2(student, teacher, calib, options))

    return score


def search_settings(teacher: Backbone, calib: CalibrationSet, options: CompressOptions, total_steps: int) -> dict[str, Any]:
    """Everything a search record depends on (a stored record is reused only if all match)."""
    extra, num_layers = options.extra, len(teacher.model.blocks)
    return {"depth": int(options.depth), "budget": int(method_option(extra, "search_budget", 2 * num_layers + 12)),
            "search_steps": int(method_option(extra, "search_steps", max(1, total_steps // 10))),
            "random_control": bool(method_option(extra, "random_control")), "seed": int(options.distill.seed),
            "batch_size": int(options.distill.batch_size), "lr": float(options.distill.lr), "teacher_weights_sha256": teacher.weights_sha256,
            "score": "embedding R^2 on the select split", "splits": calib.splits_record()}


def _memoised(scorer: Scorer, memo: dict[Subset, float]) -> Scorer:
    """A scorer that computes each subset once across searches: the short distillation is
    seeded, so a subset drawn by two searches (or at two depths: the single deletions are
    the same L-1 layer models) has one score; each search still counts it against its own
    budget."""

    def score(subset: Subset) -> float:
        if subset not in memo:
            memo[subset] = scorer(subset)
        return memo[subset]

    return score


def run_search(teacher: Backbone, calib: CalibrationSet, options: CompressOptions, settings: dict[str, Any]) -> dict[str, Any]:
    """Local search (and the random-search control if asked), as a JSON-ready record; the
    single-deletion ranking control is the local search's start (``local.start_layers``).
    The record is kept in ``OUT/subset_search.json`` so a resumed run does not search again.
    Several ranks search together (each candidate's short distillation is data-parallel):
    whether to search and what was chosen are rank 0's, and only rank 0 writes the record."""
    from pathtwt.compress.ranks import decide, is_writer
    from pathtwt.io.atomic import write_json_atomic

    record_path = Path(options.out) / "subset_search.json"
    stored = decide("the stored subset search", _stored_search(record_path, settings))
    if stored is not None:
        return stored
    num_layers, keep = len(teacher.model.blocks), settings["depth"]
    # scores depend on the tiles, the teacher and the short run's settings, not on the depth
    memo_key = ("subset_scores", id(teacher.model), settings["search_steps"], settings["batch_size"], settings["lr"],
                settings["seed"], options.schedule)
    scorer = _memoised(distillation_scorer(teacher, calib, options, steps=settings["search_steps"]),
                       calib.derived.subset_scores.setdefault(memo_key, {}))
    record: dict[str, Any] = {"settings": settings, "search": "local search (swap one kept layer for one dropped), ranking start",
                              "local": local_search(num_layers, keep, scorer, budget=settings["budget"], seed=settings["seed"]).to_dict()}
    if settings["random_control"]:
        record["random"] = random_search(num_layers, keep, scorer, budget=settings["budget"], seed=settings["seed"]).to_dict()
    record = decide("the subset search's choice", record)
    if is_writer():
        write_json_atomic(record_path, record)
    return record


def _stored_search(path: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The search record of an earlier run with the same settings, if ``path`` holds one."""
    if not path.exists():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    return record if record.get("settings") == settings else None


def compress(teacher: Backbone, calib: CalibrationSet, options: CompressOptions) -> Path | None:
    """Registry entry (``--method subset``): search K layers, distill them fully, export."""
    from pathtwt.compress.pipeline import total_steps

    num_layers = len(teacher.model.blocks)
    if options.depth is None:
        raise ConfigError("--method subset needs --depth K (the number of layers to keep)")
    _check(num_layers, int(options.depth))
    total = total_steps(options, calib)
    record = run_search(teacher, calib, options, search_settings(teacher, calib, options, total))
    best = tuple(i - 1 for i in record["local"]["best_layers"])
    return distill_subset(teacher, calib, options, best, {"subset_search": record})


def control_subsets(record: dict[str, Any]) -> dict[str, Subset]:
    """The controls' choices in a search record (0-based): ``ranking`` (the single-deletion
    ranking's subset) and, when the random control ran, ``random`` (its best)."""
    out = {}
    if record["local"].get("start_layers"):
        out["ranking"] = tuple(i - 1 for i in record["local"]["start_layers"])
    if "random" in record:
        out["random"] = tuple(i - 1 for i in record["random"]["best_layers"])
    return out


def distill_subset(teacher: Backbone, calib: CalibrationSet, options: CompressOptions, subset: Subset, extra: dict[str, Any]) -> Path | None:
    """Distill the K-layer student of ``subset`` (0-based) with the full budget and export it
    with its report-split fidelity (the search's choice, or a control's)."""
    from pathtwt.compress.pipeline import distill_and_export, total_steps

    num_layers = len(teacher.model.blocks)
    total = total_steps(options, calib)
    return distill_and_export(
        teacher, calib, options, method="subset", student=subset_student(teacher, subset),
        objective=subset_objective(teacher, subset, options, total), boundaries=subset_boundaries(subset, num_layers),
        selection_split="select",
        extra={"kept_layers": [i + 1 for i in subset], **extra},
    )
