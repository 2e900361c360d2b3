"""The results tables of a study, like the paper's Tables 2-3: per task, one row per
backbone variant x MIL head; per evaluated cohort the metric's mean +- std over seeds;
the change against the uncompressed backbone with the same head; parameters and MACs.

Everything is read from the files the workflow writes (docs/pipeline.md and docs/formats.md):
``results/mil/{backbone}/{variant}/{task}/{head}/seed{n}/metrics.json`` and
``results/models/{backbone}/{variant}/model.json``. The uncompressed teacher's cost is
counted on its architecture (no weights needed) with the same counter.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from pathtwt.errors import PathtwtError
# the teacher, and its architecture with random weights (a reference row wherever it was run)
from pathtwt.io.layout import RANDOM_INIT, UNCOMPRESSED
from pathtwt.models.registry import variant_depth
from pathtwt.report.extraction import Extraction, throughput_comparable
from pathtwt.report.markdown import markdown_table
from pathtwt.report.selection import EVERYTHING, Selection

CHANCE = "chance"
# Bootstrap resamples of each cohort's slides (seeded with 0) for the 95 % intervals.
N_BOOT = 1000
# The mark of a cell where some run predicted one class for every slide of the cohort.
SINGLE_CLASS_FLAG = "⚠"
# Cohort names of the label-table splits in metrics.json; "test" is the internal test.
INTERNAL, VALIDATION = "test", "val"
METRIC_LABELS = {
    "qwk": "QWK",
    "accuracy": "Acc",
    "balanced_accuracy": "BAcc",
    "auc_macro": "AUC",
}
COUNTING_NOTE = (
    "Parameters count unique tensors (shared weights once); MACs are per tile, counted "
    "analytically by pathtwt.models.flops: every linear layer, the attention matmuls "
    "QK^T and AV, and the patch embedding; norms and activations excluded. The paper's "
    "'GFLOPs' are these MACs."
)


@dataclass
class Run:
    backbone: str
    variant: str
    task: str
    head: str
    seed: int
    cohorts: dict[str, dict[str, Any]]
    path: Path | None = None  # the run folder (predictions.csv)
    n_classes: int | None = None
    fold: int | None = None  # the test fold of a cross-validation run


@dataclass
class Cost:
    params: int | None
    macs: int | None
    depth: int | None
    method: str
    teacher: str
    weights_sha256: str | None = None
    source: str = ""
    extracted: str = "-"  # precision of the features files
    distilled: str = "-"  # precision of the distillation (model.json)
    extraction: Extraction = field(default_factory=lambda: Extraction(precision="-"))  # its timing and conditions


@dataclass
class Row:
    backbone: str
    variant: str
    head: str
    seeds: list[int]
    cost: Cost
    # (cohort, metric) -> (mean, std, n)
    values: dict[tuple[str, str], tuple[float, float, int]] = field(default_factory=dict)
    delta: dict[str, float | None] = field(default_factory=dict)
    role: str = "variant"  # "teacher", "variant", "random-init" or "chance"
    # cohort -> bootstrap 95 % interval of the headline metric's seed-mean
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    # cohort -> paired bootstrap 95 % interval of the delta (same resampled slides as the teacher's row)
    delta_ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    # cohort -> (runs that predicted one class for every slide, runs with predictions)
    single_class: dict[str, tuple[int, int]] = field(default_factory=dict)
    # cross-validation: (cohort, metric) -> (mean, std, K) over the folds beside the pooled value
    folds: dict[tuple[str, str], tuple[float, float, int]] = field(default_factory=dict)
    grouped: bool = False  # the intervals resample groups (patients), not slides


def find_runs(results: Path) -> list[Run]:
    """Every finished MIL run (metrics.json is written last, so it marks completion), in
    the layout of :mod:`pathtwt.mil.layout` (with or without a fold level)."""
    from pathtwt.mil.layout import parse_run_dir

    runs = []
    paths = sorted((results / "mil").glob("*/*/*/*/seed*/metrics.json")) + sorted(
        (results / "mil").glob("*/*/*/*/fold*/seed*/metrics.json"))
    for path in paths:
        key = parse_run_dir(path.parent, results)
        if key is None:
            continue
        try:
            metrics = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise PathtwtError(f"{path}: unreadable MIL metrics ({exc}); re-run this `pathtwt train-mil` job") from None
        cohorts = metrics.get("cohorts")
        if not isinstance(cohorts, dict):
            raise PathtwtError(f"{path}: no 'cohorts' section; it was not written by `pathtwt train-mil`")
        runs.append(Run(
            backbone=key.backbone, variant=key.variant, task=key.task, head=key.head, seed=key.seed, cohorts=cohorts,
            path=path.parent, n_classes=metrics.get("n_classes"), fold=key.fold,
        ))
    return runs


def is_random_init(variant: str, method: str | None = None) -> bool:
    """The random-init backbone (the teacher's architecture with random weights): a variant
    named, or configured with the method, ``random-init``."""
    return variant == RANDOM_INIT or method == RANDOM_INIT


def variant_cost(results: Path, backbone: str, variant: str) -> Cost:
    """Parameters and MACs of a variant: model.json of a compressed one, the registry
    architecture (counted on the meta device) of the uncompressed teacher and of the
    random-init backbone; with the precision and throughput of its extraction."""
    from pathtwt.report.extraction import distill_precision, extraction_info

    cost = _architecture_cost(results, backbone, variant)
    cost.extraction = extraction_info(results, backbone, variant)
    cost.extracted = cost.extraction.precision
    cost.distilled = distill_precision(results, backbone, variant) if cost.method not in ("none", RANDOM_INIT) else "-"
    return cost


def _architecture_cost(results: Path, backbone: str, variant: str) -> Cost:
    meta_path = results / "models" / backbone / variant / "model.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        prov = meta.get("provenance", {})
        if meta.get("params") is not None or not is_random_init(variant, meta.get("method")):
            return Cost(
                params=meta.get("params"), macs=meta.get("macs_per_tile"), depth=variant_depth(meta),
                method=meta.get("method", variant), teacher=prov.get("teacher", meta.get("base_backbone", backbone)),
                weights_sha256=meta.get("teacher_weights_sha256"), source=str(prov.get("teacher_source", "")),
            )
    random_init = is_random_init(variant)
    method = "none" if variant == UNCOMPRESSED else RANDOM_INIT if random_init else variant
    cost = Cost(params=None, macs=None, depth=None, method=method, teacher=backbone)
    if variant == UNCOMPRESSED or random_init:
        try:
            from pathtwt.models.flops import describe_cost, meta_model

            described = describe_cost(meta_model(backbone))
            cost.params, cost.macs, cost.depth = described["params"], described["macs_per_tile"], described["depth"]
        except (ImportError, KeyError, PathtwtError):
            pass  # not a registry name: the table shows "n/a" rather than a guess
    if variant == UNCOMPRESSED:
        cost.weights_sha256, cost.source = teacher_weights(results, backbone)
    return cost


def teacher_weights(results: Path, backbone: str) -> tuple[str | None, str]:
    """The teacher's weights hash and source as recorded in its features files."""
    from pathtwt.io.h5 import read_attrs

    for path in sorted((results / "features" / backbone / UNCOMPRESSED).glob("*/[!.]*.h5"))[:1]:
        attrs = read_attrs(path)
        return (attrs.get("weights_sha256") or None), str(attrs.get("weights_source", ""))
    return None, ""


def _mean_std(values: list[float]) -> tuple[float, float, int]:
    """Mean and sample standard deviation over seeds (0 for a single seed)."""
    from pathtwt.mil.oof import mean_std

    return mean_std(values)


def role_of(variant: str, cost: Cost) -> str:
    if variant == UNCOMPRESSED:
        return "teacher"
    return RANDOM_INIT if is_random_init(variant, cost.method) else "variant"


def variant_sort_key(variant: str, cost: Cost) -> tuple:
    """Teacher first, the students by decreasing depth, the random-init backbone last."""
    role = role_of(variant, cost)
    return (role == RANDOM_INIT, role != "teacher", -(cost.depth or 0), variant)


def sort_cohorts(cohorts: Iterable[str]) -> list[str]:
    """The internal test first, then the external cohorts by name (validation left out)."""
    return sorted((c for c in dict.fromkeys(cohorts) if c != VALIDATION), key=lambda c: (c != INTERNAL, c))


def shown_metrics(metric: str) -> list[str]:
    """The headline metric, then balanced accuracy and macro AUC."""
    return list(dict.fromkeys([metric, "balanced_accuracy", "auc_macro"]))


def task_table(
    runs: Iterable[Run], results: Path, *, task: str, metric: str, cost_cache: dict | None = None,
    n_boot: int = N_BOOT,
) -> tuple[list[Row], list[str], list[str]]:
    """Rows of one task (the chance row last), the cohorts evaluated (internal test first)
    and the metrics shown."""
    from pathtwt.mil.metrics import BOOTSTRAP_METRICS, chance_metrics
    from pathtwt.mil.summary import pooled_difference_interval, pooled_interval, read_predictions

    runs = [r for r in runs if r.task == task]
    cost_cache = {} if cost_cache is None else cost_cache
    cohorts = sort_cohorts(c for r in runs for c in r.cohorts)
    metrics = shown_metrics(metric)
    groups: dict[tuple[str, str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.backbone, r.variant, r.head), []).append(r)
    rows = []
    labels: dict[str, np.ndarray] = {}
    predictions: dict[tuple[str, str, str, str], list[dict[str, np.ndarray]]] = {}  # (backbone, variant, head, cohort)
    n_classes = next((r.n_classes for r in runs if r.n_classes), None)
    for (backbone, variant, head), members in groups.items():
        members.sort(key=lambda r: r.seed)
        if (backbone, variant) not in cost_cache:
            cost_cache[backbone, variant] = variant_cost(results, backbone, variant)
        cost = cost_cache[backbone, variant]
        row = Row(backbone=backbone, variant=variant, head=head, seeds=[r.seed for r in members], cost=cost,
                  role=role_of(variant, cost))
        if any(r.fold is not None for r in members):
            row.seeds = sorted({r.seed for r in members})
            pooled = cross_validation_values(row, members, cohorts, metrics, n_classes, where=f"{backbone}/{variant}/{task}/{head}")
        else:
            pooled = None
            preds = [read_predictions(r.path) if r.path is not None else {} for r in members]
        for cohort in cohorts:
            if pooled is None:
                for m in metrics:
                    vals = [r.cohorts[cohort][m] for r in members if r.cohorts.get(cohort, {}).get(m) is not None]
                    row.values[cohort, m] = _mean_std([float(v) for v in vals])
                sizes = [int(r.cohorts[cohort]["n_slides"]) for r in members if r.cohorts.get(cohort, {}).get("n_slides") is not None]
                row.values[cohort, "n_slides"] = (float(max(sizes)), math.nan, len(sizes)) if sizes else (math.nan, math.nan, 0)
                per_seed = [p[cohort] for p in preds if cohort in p]
            else:
                per_seed = pooled[cohort]
            predictions[backbone, variant, head, cohort] = per_seed
            row.grouped |= bool(per_seed) and all("group" in p and all(g not in ("", None) for g in p["group"]) for p in per_seed)
            if per_seed:
                labels.setdefault(cohort, per_seed[0]["label"])
                row.single_class[cohort] = (sum(len(np.unique(p["prediction"])) == 1 and len(p["prediction"]) > 1
                                                for p in per_seed), len(per_seed))
                if metric in BOOTSTRAP_METRICS and n_classes:
                    row.ci[cohort] = pooled_interval(per_seed, metric, n_classes, n_boot=n_boot)
        rows.append(row)
    rows.sort(key=lambda r: (r.backbone, r.head, *variant_sort_key(r.variant, r.cost)))
    base = {(r.backbone, r.head): r for r in rows if r.variant == UNCOMPRESSED}
    for row in rows:
        ref = base.get((row.backbone, row.head))
        for cohort in cohorts:
            mine, theirs = row.values[cohort, metric][0], ref.values[cohort, metric][0] if ref else math.nan
            row.delta[cohort] = None if ref is None or math.isnan(mine) or math.isnan(theirs) else mine - theirs
            theirs_preds = predictions.get((row.backbone, UNCOMPRESSED, row.head, cohort))
            mine_preds = predictions.get((row.backbone, row.variant, row.head, cohort))
            if ref is not None and ref is not row and mine_preds and theirs_preds and metric in BOOTSTRAP_METRICS and n_classes:
                row.delta_ci[cohort] = pooled_difference_interval(mine_preds, theirs_preds, metric, n_classes, n_boot=n_boot)
    if rows:
        chance = Row(backbone="-", variant=CHANCE, head="-", seeds=[], role="chance",
                     cost=Cost(params=None, macs=None, depth=None, method=CHANCE, teacher="-"))
        for cohort in cohorts:
            if cohort in labels and n_classes:
                values = chance_metrics(labels[cohort], n_classes)
            else:  # no predictions.csv: only what the number of classes says
                values = {"qwk": 0.0, "qwk_x100": 0.0, "auc_macro": 0.5, "accuracy": math.nan,
                          "balanced_accuracy": 1.0 / n_classes if n_classes else math.nan}
            for m in metrics:
                chance.values[cohort, m] = (float(values.get(m, math.nan)), math.nan, 1)
            n = len(labels[cohort]) if cohort in labels else math.nan
            chance.values[cohort, "n_slides"] = (float(n), math.nan, 0 if math.isnan(n) else 1)
            chance.delta[cohort] = None
        rows.append(chance)
    return rows, cohorts, metrics


def cross_validation_values(row: Row, members: list[Run], cohorts: list[str], metrics: list[str], n_classes: int | None,
                            *, where: str) -> dict[str, list[dict[str, np.ndarray]]]:
    """Fill a cross-validation row: each metric on the pooled out-of-fold predictions
    (:func:`pathtwt.mil.oof.pool_seed`; mean over seeds where several) and its mean ± std
    over the folds' own values. Returns cohort -> the pooled predictions of each seed (for
    the intervals)."""
    from pathtwt.mil.metrics import slide_metrics
    from pathtwt.mil.oof import fold_spread, pool_seed
    from pathtwt.mil.summary import read_predictions

    by_seed: dict[int, dict[int, dict]] = {}
    for r in members:
        by_seed.setdefault(r.seed, {})[r.fold] = read_predictions(r.path) if r.path is not None else {}
    pooled = [pool_seed(folds, where=f"{where} seed {seed}") for seed, folds in sorted(by_seed.items())]
    out = {}
    for cohort in cohorts:
        per_seed = [p[cohort] for p in pooled if cohort in p]
        out[cohort] = per_seed
        scored = [slide_metrics(p["label"], p["probs"], n_classes) for p in per_seed if n_classes and p["probs"].shape[1] == n_classes]
        for m in metrics:
            row.values[cohort, m] = _mean_std([float(v[m]) for v in scored if v.get(m) is not None])
            per_fold: dict[int, list] = {}
            for r in members:
                per_fold.setdefault(r.fold, []).append(r.cohorts.get(cohort, {}).get(m))
            row.folds[cohort, m] = fold_spread(per_fold)
        n = len(per_seed[0]["label"]) if per_seed else math.nan
        row.values[cohort, "n_slides"] = (float(n), math.nan, len(per_seed))
    return out


def _fmt(value: float, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def cohort_label(cohort: str, cv: bool = False) -> str:
    """How a table names a cohort; the internal test of a cross-validated task is every
    slide once, out of fold."""
    if cohort == INTERNAL:
        return "out-of-fold" if cv else "internal test"
    return cohort


def is_cross_validated(rows: list[Row]) -> bool:
    return any(r.folds for r in rows)


def row_label(row: Row) -> str:
    """The variant cell: reference rows say what they are."""
    return {"teacher": f"{row.variant} (teacher)", RANDOM_INIT: f"{row.variant} (floor)",
            "chance": "chance (reference)"}.get(row.role, row.variant)


def table_records(rows: list[Row], cohorts: list[str], metrics: list[str], metric: str) -> list[dict[str, Any]]:
    """Machine-readable rows (one CSV line each): means, stds, intervals and deltas as numbers."""
    records = []
    for r in rows:
        rec: dict[str, Any] = {
            "backbone": r.backbone, "variant": r.variant, "role": r.role, "method": r.cost.method, "depth": r.cost.depth,
            "head": r.head, "n_seeds": len(r.seeds),
            "extracted_precision": r.cost.extracted, "distilled_precision": r.cost.distilled,
        }
        for cohort in cohorts:
            rec[f"{cohort}_n_slides"] = r.values.get((cohort, "n_slides"), (math.nan,))[0]
            for m in metrics:
                mean, std, _ = r.values[cohort, m]
                rec[f"{cohort}_{m}_mean"], rec[f"{cohort}_{m}_std"] = mean, std
            lo, hi = r.ci.get(cohort, (math.nan, math.nan))
            rec[f"{cohort}_{metric}_ci95_low"], rec[f"{cohort}_{metric}_ci95_high"] = lo, hi
            rec[f"{cohort}_{metric}_delta"] = r.delta[cohort]
            lo, hi = r.delta_ci.get(cohort, (math.nan, math.nan))
            rec[f"{cohort}_{metric}_delta_ci95_low"], rec[f"{cohort}_{metric}_delta_ci95_high"] = lo, hi
            rec[f"{cohort}_single_class_runs"] = r.single_class.get(cohort, (0, 0))[0]
            if r.folds:
                for m in metrics:
                    mean, std, k = r.folds.get((cohort, m), (math.nan, math.nan, 0))
                    rec[f"{cohort}_{m}_fold_mean"], rec[f"{cohort}_{m}_fold_std"], rec["n_folds"] = mean, std, k
        rec["params"], rec["macs_per_tile"] = r.cost.params, r.cost.macs
        timing = r.cost.extraction
        rec["tiles_per_second"] = timing.tiles_per_second  # the median over the jobs
        rec["tiles_per_second_jobs"] = len(timing.jobs)
        rec["tiles_per_second_min"] = min(timing.jobs) if timing.jobs else None
        rec["tiles_per_second_max"] = max(timing.jobs) if timing.jobs else None
        rec["extraction_devices"] = "/".join(timing.devices)
        rec["extraction_threads"] = "/".join(map(str, timing.threads))
        records.append(rec)
    return records


def table_header(cohorts: list[str], metrics: list[str], metric: str, cv: bool = False) -> list[str]:
    """The header of a task table; the demo tables of docs/results.md are checked against it. A
    cross-validated task has the spread over folds beside its pooled headline."""
    label = METRIC_LABELS.get(metric, metric)
    header = ["Backbone", "Variant", "Head", "Extracted", "Distilled", "Params (M)", "GMACs", "tiles/s"]
    for cohort in cohorts:
        c = cohort_label(cohort, cv)
        header += [f"Slides {c}", f"{label} {c} [95% CI]"] + ([f"{label} {c} per fold"] if cv else [])
        header += [f"{METRIC_LABELS.get(m, m)} {c}" for m in metrics if m != metric]
        header += [f"Δ{label} {c} [95% CI]"]
    return header


def _mean_cell(value: tuple[float, float, int], reference: bool) -> str:
    mean, std, n = value
    if n == 0 or math.isnan(mean):
        return "n/a"
    return f"{mean:.3f}" if reference or math.isnan(std) else f"{mean:.3f} ± {std:.3f}"


def table_cells(rows: list[Row], cohorts: list[str], metrics: list[str], metric: str) -> tuple[list[str], list[list[str]]]:
    """Human-readable header and cells (Markdown and HTML share them)."""
    cv = is_cross_validated(rows)
    header = table_header(cohorts, metrics, metric, cv)
    comparable, _ = throughput_comparable(r.cost.extraction for r in rows)
    body = []
    for r in rows:
        chance = r.role == "chance"
        cost = r.cost
        cells = [r.backbone, row_label(r), r.head, "-" if chance else cost.extracted, "-" if chance else cost.distilled]
        cells.append("-" if chance else ("n/a" if cost.params is None else f"{cost.params / 1e6:.2f}"))
        cells.append("-" if chance else ("n/a" if cost.macs is None else f"{cost.macs / 1e9:.2f}"))
        rate = cost.extraction.tiles_per_second
        cells.append("-" if rate is None else f"{rate:.1f}" + ("" if comparable else " (not comparable)"))
        for cohort in cohorts:
            n = r.values.get((cohort, "n_slides"), (math.nan, math.nan, 0))
            cells.append("n/a" if n[2] == 0 or math.isnan(n[0]) else str(int(n[0])))
            # a cross-validated row with one seed has no spread over seeds to show
            head = _mean_cell(r.values[cohort, metric], chance or (bool(r.folds) and len(r.seeds) == 1))
            lo, hi = r.ci.get(cohort, (math.nan, math.nan))
            if not (math.isnan(lo) or math.isnan(hi)):
                head += f" [{lo:.3f}, {hi:.3f}]"
            flagged, total = r.single_class.get(cohort, (0, 0))
            if flagged:
                head += f" {SINGLE_CLASS_FLAG}{flagged}/{total}"
            cells.append(head)
            if cv:
                spread = r.folds.get((cohort, metric))
                cells.append("-" if spread is None else _mean_cell(spread, False))
            cells += [_mean_cell(r.values[cohort, m], chance or (bool(r.folds) and len(r.seeds) == 1))
                      for m in metrics if m != metric]
            d = r.delta[cohort]
            delta = "—" if r.role in ("teacher", "chance") else ("n/a" if d is None else f"{d:+.3f}")
            lo, hi = r.delta_ci.get(cohort, (math.nan, math.nan))
            if d is not None and not (math.isnan(lo) or math.isnan(hi)):
                delta += f" [{lo:+.3f}, {hi:+.3f}]"
            cells.append(delta)
        body.append(cells)
    return header, body


def throughput_note(rows: list[Row]) -> str:
    """What the tiles/s column measured and under which conditions, or why it compares nothing."""
    timed = list(dict.fromkeys(r.cost.extraction for r in rows if r.cost.extraction.jobs))
    if not timed:
        return "tiles/s: no features file of these variants records its extraction time (\"-\")."
    comparable, why = throughput_comparable(timed)
    jobs = sorted({len(t.jobs) for t in timed})
    devices = sorted({d for t in timed for d in t.devices}) or ["a device not recorded"]
    threads = sorted({n for t in timed for n in t.threads})
    conditions = (f"on {' / '.join(devices)} with {'/'.join(map(str, threads)) or 'unrecorded'} CPU "
                  f"thread{'' if threads == [1] else 's'} per job (the features files' `device`, `gpu_name` and "
                  "`torch_threads`)")
    text = ("tiles/s: the median over a variant's extraction jobs (one per cohort; "
            f"{'/'.join(map(str, jobs))} per variant) of each job's tiles / wall seconds (reading, decoding and the "
            f"forward passes), {conditions}; the CSV has each variant's slowest and fastest job. ")
    if comparable:
        return text + ("A job shares the machine with whatever else runs, so a difference within that spread ranks "
                       "nothing; the MACs are the cost that compares variants.")
    return text + (f"Marked not comparable: {why}, and one job's time depends on what else the machine ran, so these "
                   "numbers must not rank the variants; the MACs are the cost that compares them.")


def task_notes(rows: list[Row], cohorts: list[str], metric: str) -> list[str]:
    """The sentences printed under a task table: what the cells are, the flags that occur,
    and a missing random-init row."""
    label = METRIC_LABELS.get(metric, metric)
    seeds = sorted({len(r.seeds) for r in rows if r.role != "chance"})
    if is_cross_validated(rows):
        notes = [cross_validation_note(rows, cohorts, label, seeds)]
    else:
        notes = [
            f"Cells: mean ± sample standard deviation over the seeds ({'/'.join(map(str, seeds)) or 'n/a'} per row); "
            f"[95% CI] beside {label}: percentile bootstrap over the cohort's slides ({N_BOOT} resamples within each "
            "true class, seed 0) of that mean, every resample scoring all seeds' predictions (predictions.csv) on the "
            f"same slides. Δ{label}: difference of the means against the uncompressed teacher with the same head; "
            "[95% CI] beside it: the same bootstrap, paired (each resample scores this row and the teacher's on the "
            "same slides), so an interval that excludes 0 is a difference these slides resolve, and one that "
            "contains 0 is not, whatever the overlap of the two rows' own intervals. "
            "BAcc: balanced accuracy; AUC: macro one-vs-rest AUC.",
        ]
    notes += [
        "Chance row: QWK 0, BAcc 1/C over the C classes present in the cohort, AUC 0.5, accuracy of always "
        "predicting the cohort's majority class. Extracted / Distilled: the precision of the features files "
        "(their `precision` attribute) and of the distillation (model.json).",
    ]
    notes.append(throughput_note(rows))
    flagged = [(r, c) for r in rows for c in cohorts if r.single_class.get(c, (0, 0))[0]]
    if flagged:
        listed = "; ".join(f"{r.backbone}/{r.variant}/{r.head} on {cohort_label(c)} ({r.single_class[c][0]} of "
                           f"{r.single_class[c][1]} seeds)" for r, c in flagged)
        notes.append(
            f"{SINGLE_CLASS_FLAG}k/n: in k of the n seeds the head predicted one and the same class for every slide "
            f"of the cohort, so its accuracy is that class's share and its BAcc 1/C: {listed}."
        )
    if not any(r.role == RANDOM_INIT for r in rows):
        notes.append(
            "No random-init backbone row: this study's config has no variant named (or with method) "
            "`random-init`, so the MIL heads were not trained on random-weight features; the tile probe's "
            "random-init floor is the backbone-level reference."
        )
    return notes


def fold_designs(results: Path) -> list[str]:
    """One sentence per cross-validation label table under results/labels: its folds, its
    groups and its compression-only hold-out."""
    import pandas as pd

    from pathtwt.mil.folds import HOLDOUT

    lines = []
    for path in sorted((results / "labels").glob("*.csv")):
        try:
            table = pd.read_csv(path, dtype={"slide_id": str, "group": str})
        except (OSError, ValueError, pd.errors.ParserError):
            continue
        if "fold" not in table.columns:
            continue
        fold = pd.to_numeric(table["fold"], errors="coerce").fillna(HOLDOUT).astype(int)
        held = int((fold == HOLDOUT).sum())
        k = int(fold.max()) + 1
        groups = f", {table['group'].nunique()} groups (`group`) each within one fold" if "group" in table.columns else ", by slide (no groups)"
        hold = (f"; {held} slides are a compression-only hold-out (split `compress`): calibration, discovery and "
                "distillation drew only from them, and no fold reports on them") if held else \
            "; no compression hold-out in this cohort (compression drew from another cohort, or none was compressed)"
        lines.append(f"{path.stem}: {k} folds over {int((fold != HOLDOUT).sum())} slides{groups}{hold}.")
    return lines


def cross_validation_note(rows: list[Row], cohorts: list[str], label: str, seeds: list[int]) -> str:
    """What the cells of a cross-validated table are."""
    folds = sorted({k for r in rows for (_, _), (_, _, k) in r.folds.items() if k})
    grouped = any(r.grouped for r in rows)
    external = [c for c in cohorts if c != INTERNAL]
    text = (
        f"Cross-validation ({'/'.join(map(str, folds)) or 'n/a'} folds, {'/'.join(map(str, seeds)) or 'n/a'} seed(s) "
        "per fold): every slide of the cohort outside the compression hold-out is tested once, by the head of the "
        "fold that held it out, and every variant uses the same folds. Out-of-fold cells: the metric on the pooled "
        "out-of-fold predictions of all slides at once (mean ± std over seeds where there are several); [95% CI]: "
        f"percentile bootstrap over all those slides ({N_BOOT} resamples within each true class, seed 0; "
        + ("whole groups (the label table's `group`: patient, case) are resampled, each in the stratum of its most "
           "frequent label" if grouped else "by slide: the label table names no groups")
        + "); per fold: mean ± "
        f"sample standard deviation over the folds of each fold's own test value. Δ{label}: against the "
        "uncompressed teacher with the same head on the same slides; [95% CI] beside it: the same bootstrap, "
        "paired, so an interval that excludes 0 is a difference these slides resolve. "
        "BAcc: balanced accuracy; AUC: macro one-vs-rest AUC."
    )
    if external:
        text += (f" {', '.join(external)}: predicted by every fold's head; the pooled prediction of a slide is the "
                 "mean of the fold heads' class probabilities, and per fold is each head's own value.")
    return text


def csv_text(records: list[dict[str, Any]]) -> str:
    import csv
    import io

    buf = io.StringIO()
    if records:
        writer = csv.DictWriter(buf, fieldnames=list(records[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
    return buf.getvalue()


def teacher_lines(costs: dict[tuple[str, str], Cost]) -> list[str]:
    """One sentence per teacher: name, weights hash and source, random weights flagged."""
    lines = []
    for backbone in sorted({b for b, _ in costs}):
        teacher = costs.get((backbone, UNCOMPRESSED)) or next(c for (b, _), c in costs.items() if b == backbone)
        sha, source = teacher.weights_sha256, teacher.source
        if not sha or "random" in source.lower():
            lines.append(
                f"{backbone}: RANDOM weights (the pretrained weights were not available); "
                "the numbers check the pipeline, not the method."
            )
        else:
            lines.append(f"{backbone}: pretrained weights sha256 {sha} ({source or 'source not recorded'}).")
    return lines


PROBE_NOTE = (
    "Balanced accuracy on each probe set's test split of a logistic-regression probe "
    "(standardised features, C = 1) and a cosine kNN (k = 20) fitted on its train split "
    "(pathtwt probe); in brackets the 95 % bootstrap interval over test tiles. The "
    "uncompressed teacher, the same architecture with random weights (the floor) and chance "
    "(balanced accuracy 1/C) are reference rows."
)
FIDELITY_NOTE = (
    "Student against teacher tile embeddings on held-out calibration tiles: R² of the "
    "teacher embedding (1 = the teacher, 0 = a constant at the teacher's fit mean), cosine "
    "after subtracting the teacher's fit mean, linear CKA; the uncentred cosine is "
    "secondary (a constant output already scores high on it). R² per block: at each block "
    "boundary. Reference rows are measured on the same tiles."
)


def reference_rows(body: list[list[str]]) -> list[int]:
    """Rows whose variant cell names a reference (teacher, floor, constant)."""
    return [i for i, cells in enumerate(body) if cells[1].endswith(("(reference)", "(teacher)", "(floor)"))]


def backbone_tables(results: Path, out: Path, costs: dict[tuple[str, str], Cost],
                    selection: Selection = EVERYTHING) -> list[dict[str, Any]]:
    """The tile-probe and fidelity tables (``probes.*``, ``fidelity.*``) of the backbones
    and variants ``selection`` keeps, those that have rows."""
    from pathtwt.io.atomic import write_text_atomic
    from pathtwt.report.fidelity import fidelity_table
    from pathtwt.report.probes import below_floor_notes, probe_sets_note, probe_table

    def cost_of(backbone: str, variant: str) -> Cost:
        if (backbone, variant) not in costs:
            costs[backbone, variant] = variant_cost(results, backbone, variant)
        return costs[backbone, variant]

    tables = []
    header, body, records = probe_table(results, cost_of, selection)
    if body:
        note = f"{PROBE_NOTE} {probe_sets_note(results, selection)}"
        tables.append({"name": "probes", "title": "Tile probe", "header": header, "body": body, "records": records,
                       "notes": [note, *below_floor_notes(results, selection)], "references": reference_rows(body)})
    header, body, records, notes = fidelity_table(results, cost_of, selection)
    if body:
        tables.append({"name": "fidelity", "title": "Fidelity", "header": header, "body": body,
                       "records": records, "notes": [FIDELITY_NOTE, *notes], "references": reference_rows(body)})
    for t in tables:
        write_text_atomic(out / f"{t['name']}.csv", csv_text(t["records"]))
        notes_md = "".join(f"\n{n}\n" for n in t["notes"])
        write_text_atomic(out / f"{t['name']}.md", f"## {t['title']}\n\n" + markdown_table(t["header"], t["body"]) + notes_md)
    return tables


def task_sections(results: Path, metrics: dict[str, str], costs: dict[tuple[str, str], Cost],
                  selection: Selection = EVERYTHING) -> list[dict[str, Any]]:
    """One section per task: its rows, header, cells, notes and reference rows (of the
    runs ``selection`` keeps)."""
    runs = [r for r in find_runs(results)
            if selection.keeps(task=r.task, backbone=r.backbone, variant=r.variant, head=r.head)]
    tasks = [t for t in dict.fromkeys(list(metrics) + [r.task for r in runs]) if selection.keeps(task=t)]
    if not tasks:
        raise PathtwtError(f"{results}: no finished MIL runs under mil/ and no task given; run the workflow first")
    sections = []
    for task in tasks:
        metric = metrics.get(task, "accuracy")
        rows, cohorts, shown = task_table(runs, results, task=task, metric=metric, cost_cache=costs)
        header, body = table_cells(rows, cohorts, shown, metric)
        notes = task_notes(rows, cohorts, metric) if rows else []
        if is_cross_validated(rows):
            notes += fold_designs(results)
        sections.append({
            "task": task, "metric": metric, "label": METRIC_LABELS.get(metric, metric), "header": header, "body": body, "rows": rows, "cohorts": cohorts,
            "records": table_records(rows, cohorts, shown, metric),
            "notes": notes,
            "references": [i for i, r in enumerate(rows) if r.role != "variant"],
            "flagged": {(i, j) for i, cells in enumerate(body) for j, c in enumerate(cells) if SINGLE_CLASS_FLAG in c},
        })
    return sections


def readme_layout(config: Mapping[str, Any]) -> dict[str, tuple[list[str], list[tuple[str, str]]]]:
    """task -> (header, [(variant cell, head)]) of the MIL tables `pathtwt report --markdown`
    writes for a finished run of ``config`` (the chance row last)."""
    variants = []
    for name, spec in (config.get("variants") or {}).items():
        spec = spec or {}
        cost = Cost(params=None, macs=None, depth=spec.get("depth"), method=spec.get("method", name), teacher="")
        variants.append((name, cost))
    heads = list((config.get("mil") or {}).get("heads") or [])
    layout = {}
    for task, spec in (config.get("tasks") or {}).items():
        metric = spec.get("metric", "accuracy")
        cohorts = sort_cohorts(["test", *(spec.get("external") or [])])
        keys = []
        for backbone in sorted(config.get("backbones") or {}):
            for head in sorted(heads):
                for name, cost in sorted(variants, key=lambda vc: variant_sort_key(*vc)):
                    row = Row(backbone=backbone, variant=name, head=head, seeds=[], cost=cost, role=role_of(name, cost))
                    keys.append((row_label(row), head))
        keys.append(("chance (reference)", "-"))
        draw = ((config.get("cohorts") or {}).get(spec.get("cohort")) or {}).get("draw_split") or {}
        layout[task] = (table_header(cohorts, shown_metrics(metric), metric, cv=bool(draw.get("folds"))), keys)
    return layout


def write_report(results: str | Path, out: str | Path, *, metrics: dict[str, str], attention_slides: int = 1,
                 selection: Selection = EVERYTHING) -> Path:
    """Write ``{task}.csv``, ``{task}.md``, ``tables.md`` (the tables of docs/results.md) and
    ``index.html`` (with figures) into ``out``, of what ``selection`` keeps."""
    from pathtwt.io.atomic import write_text_atomic
    from pathtwt.report.html import render_html
    from pathtwt.report.markdown import readme_markdown, task_markdown

    results, out = Path(results), Path(out)
    costs: dict[tuple[str, str], Cost] = {}
    sections = task_sections(results, metrics, costs, selection)
    for s in sections:
        write_text_atomic(out / f"{s['task']}.csv", csv_text(s["records"]))
        write_text_atomic(out / f"{s['task']}.md", task_markdown(s))
    extra = backbone_tables(results, out, costs, selection)
    write_text_atomic(out / "tables.md", readme_markdown(sections, extra, results=results))
    html = render_html(
        results, out, sections=sections, teachers=teacher_lines(costs), counting=COUNTING_NOTE,
        attention_slides=attention_slides, tables=extra, selection=selection,
    )
    write_text_atomic(out / "index.html", html)
    return out / "index.html"
