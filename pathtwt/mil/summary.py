"""Repeats: mean +- standard deviation of the metrics of several runs (seeds) of the
same protocol and head, as the paper reports them. The standard deviation is the
sample one (ddof=1); a single run gets std 0. Where every run left its predictions.csv,
QWK, accuracy and balanced accuracy also get a 95 % bootstrap interval over the cohort's
slides of the mean over the runs (pooled: each resample scores every run on the same
slides), and each cohort counts the runs that predicted one class for every slide."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from pathtwt.errors import ConfigError, PathtwtError
from pathtwt.mil.metrics import BOOTSTRAP_METRICS

SUMMARY_METRICS = ("qwk_x100", "accuracy", "balanced_accuracy", "auc_macro")


def load_run(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / "metrics.json"
    if not path.is_file():
        raise PathtwtError(f"{run_dir}: no metrics.json (the run has not finished); run `pathtwt train-mil` for it first")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise PathtwtError(f"{path}: not valid JSON ({exc}); re-run that training") from None


def summarize_runs(run_dirs: list[str | os.PathLike]) -> dict:
    runs = [load_run(d) for d in run_dirs]
    kinds = {(r["protocol"], r["aggregator"]) for r in runs}
    if len(kinds) > 1:
        raise ConfigError(f"runs mix protocols/heads {sorted(kinds)}; summarise one protocol and head at a time")
    if any(r.get("fold") is not None for r in runs):
        return summarize_folds(runs, run_dirs, *next(iter(kinds)))
    seeds = [r["seed"] for r in runs]
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ConfigError(f"seed(s) {repeated} appear in more than one run; each repeat needs its own seed")
    cohorts = list(dict.fromkeys(name for r in runs for name in r["cohorts"]))
    predictions = [read_predictions(d) for d in run_dirs]
    n_classes = next((r.get("n_classes") for r in runs if r.get("n_classes")), None)
    summary: dict[str, dict] = {}
    single_class: dict[str, int] = {}  # cohort -> runs that predicted one class for every slide
    for cohort in cohorts:
        summary[cohort] = {}
        per_seed = [p[cohort] for p in predictions if cohort in p]
        for metric in SUMMARY_METRICS:
            values = [r["cohorts"].get(cohort, {}).get(metric) for r in runs]
            valid = np.array([v for v in values if v is not None], dtype=np.float64)
            entry = {
                "mean": float(valid.mean()) if len(valid) else None,
                "std": float(valid.std(ddof=1)) if len(valid) > 1 else (0.0 if len(valid) else None),
                "n": int(len(valid)),
                "values": values,
            }
            if metric in BOOTSTRAP_METRICS and n_classes and len(per_seed) == len(runs):
                # the seed-mean's 95 % interval over slides, every seed scored on each resample
                lo, hi = pooled_interval(per_seed, metric, int(n_classes))
                entry["ci95"] = [None if np.isnan(lo) else lo, None if np.isnan(hi) else hi]
            summary[cohort][metric] = entry
        if per_seed:
            single_class[cohort] = int(sum(len(np.unique(p["prediction"])) == 1 and len(p["prediction"]) > 1
                                           for p in per_seed))
    protocol, aggregator = next(iter(kinds))
    return {
        "protocol": protocol,
        "aggregator": aggregator,
        "seeds": seeds,
        "runs": [str(d) for d in run_dirs],
        "selected_epochs": [r["selected_epoch"] for r in runs],
        "summary": summary,
        "single_class_runs": single_class,
    }


def summarize_folds(runs: list[dict], run_dirs: list, protocol: str, aggregator: str) -> dict:
    """Cross-validation runs (one per fold and seed): each metric on the pooled out-of-fold
    predictions (:mod:`pathtwt.mil.oof`), mean ± std over seeds, its bootstrap interval
    over all pooled slides (by group where the table has groups), and the mean ± std over
    folds of the folds' own values."""
    from pathtwt.mil.metrics import slide_metrics
    from pathtwt.mil.oof import fold_spread, pool_seed

    keys = [(r.get("fold"), r["seed"]) for r in runs]
    repeated = sorted({k for k in keys if keys.count(k) > 1}, key=str)
    if repeated or any(f is None for f, _ in keys):
        raise ConfigError(f"runs {repeated or 'without a fold'}: summarise one cross-validation (one run per fold and seed)")
    n_classes = next((r.get("n_classes") for r in runs if r.get("n_classes")), None)
    by_seed: dict[int, dict[int, dict]] = {}
    for (fold, seed), d in zip(keys, run_dirs):
        by_seed.setdefault(seed, {})[fold] = read_predictions(d)
    pooled = {seed: pool_seed(f, where=f"{run_dirs[0]} seed {seed}") for seed, f in sorted(by_seed.items())}
    cohorts = list(dict.fromkeys(c for p in pooled.values() for c in p))
    summary: dict[str, dict] = {}
    for cohort in cohorts:
        per_seed = [p[cohort] for p in pooled.values() if cohort in p]
        scored = [slide_metrics(p["label"], p["probs"], int(n_classes)) for p in per_seed]
        summary[cohort] = {}
        for metric in SUMMARY_METRICS:
            values = [v.get(metric) for v in scored]
            valid = np.array([v for v in values if v is not None], dtype=np.float64)
            per_fold: dict[int, list] = {}
            for (fold, _), r in zip(keys, runs):
                per_fold.setdefault(fold, []).append(r["cohorts"].get(cohort, {}).get(metric))
            mean, std, k = fold_spread(per_fold)
            entry = {"mean": float(valid.mean()) if len(valid) else None,
                     "std": float(valid.std(ddof=1)) if len(valid) > 1 else (0.0 if len(valid) else None),
                     "n": int(len(valid)), "values": values, "n_slides": int(len(per_seed[0]["label"])),
                     "fold_mean": None if k == 0 else mean, "fold_std": None if k == 0 else std, "n_folds": k}
            if metric in BOOTSTRAP_METRICS:
                lo, hi = pooled_interval(per_seed, metric, int(n_classes))
                entry["ci95"] = [None if np.isnan(lo) else lo, None if np.isnan(hi) else hi]
            summary[cohort][metric] = entry
    return {
        "protocol": protocol,
        "aggregator": aggregator,
        "seeds": sorted(by_seed),
        "folds": sorted({f for f, _ in keys}),
        "pooled": "out-of-fold: every slide predicted once by the head of the fold that tested it; external cohorts: "
                  "the mean of the fold heads' probabilities",
        "runs": [str(d) for d in run_dirs],
        "selected_epochs": [r["selected_epoch"] for r in runs],
        "summary": summary,
        "single_class_runs": {},
    }


def summary_rows(result: dict) -> list[dict]:
    rows = []
    for cohort, metrics in result["summary"].items():
        for metric, s in metrics.items():
            rows.append(
                {
                    "protocol": result["protocol"],
                    "aggregator": result["aggregator"],
                    "cohort": cohort,
                    "metric": metric,
                    "mean": s["mean"],
                    "std": s["std"],
                    "n_runs": s["n"],
                    "ci95_low": (s.get("ci95") or [None, None])[0],
                    "ci95_high": (s.get("ci95") or [None, None])[1],
                    "values": ";".join("" if v is None else f"{v:.6g}" for v in s["values"]),
                }
            )
    return rows


def write_summary(run_dirs: list[str | os.PathLike], outs: list[str | os.PathLike]) -> dict:
    """Summarise the runs (:func:`summarize_runs`) into each of ``outs`` (.json or .csv)."""
    import pandas as pd

    from pathtwt.io.atomic import atomic_output, write_json_atomic

    bad = [str(p) for p in outs if Path(p).suffix.lower() not in (".csv", ".json")]
    if bad:
        raise ConfigError(f"--out {', '.join(bad)}: the summary is written as .csv or .json")
    result = summarize_runs(run_dirs)
    for path in map(Path, outs):
        if path.suffix.lower() == ".json":
            write_json_atomic(path, result)
        else:
            with atomic_output(path) as tmp:
                pd.DataFrame(summary_rows(result)).to_csv(tmp, index=False, float_format="%.6g")
    return result


def read_predictions(run_dir: str | os.PathLike) -> dict[str, dict[str, np.ndarray]]:
    """cohort -> {"slide_id", "label", "prediction", "probs" (n, C) and, where the run
    wrote one, "group"} arrays of a finished run's ``predictions.csv`` ({} when the run has
    none, e.g. one written before it existed)."""
    import pandas as pd

    path = Path(run_dir) / "predictions.csv"
    if not path.is_file():
        return {}
    try:
        table = pd.read_csv(path, dtype={"slide_id": str, "cohort": str, "group": str}, keep_default_na=False)
        probs = sorted((c for c in table.columns if c.startswith("prob_")), key=lambda c: int(c[5:]))
        out = {}
        for name, rows in table.groupby("cohort", sort=False):
            entry = {"slide_id": rows["slide_id"].to_numpy(), "label": rows["label"].to_numpy(np.int64),
                     "prediction": rows["prediction"].to_numpy(np.int64),
                     "probs": rows[probs].to_numpy(np.float64) if probs else np.zeros((len(rows), 0))}
            if "group" in rows.columns:
                entry["group"] = rows["group"].to_numpy(object)
            out[str(name)] = entry
    except (KeyError, ValueError, pd.errors.ParserError) as exc:
        raise PathtwtError(f"{path}: not a predictions table of `pathtwt train-mil` ({exc}); re-run that training") from None
    return out


def pooled_interval(per_seed: list[dict[str, np.ndarray]], metric: str, n_classes: int, *, n_boot: int = 1000,
                    seed: int = 0) -> tuple[float, float]:
    """Bootstrap 95 % interval over slides of the seed-mean ``metric`` of one cohort, from
    each seed's predictions (``read_predictions(...)[cohort]``), aligned on slide id; slides
    missing from some seed are left out."""
    from pathtwt.mil.metrics import bootstrap_interval

    aligned = _aligned(per_seed)
    if aligned is None:
        return float("nan"), float("nan")
    y_true, preds, groups = aligned
    return bootstrap_interval(y_true, preds[0], metric, n_classes, n_boot=n_boot, seed=seed, groups=groups)


def pooled_difference_interval(per_seed: list[dict[str, np.ndarray]], reference: list[dict[str, np.ndarray]],
                               metric: str, n_classes: int, *, n_boot: int = 1000, seed: int = 0) -> tuple[float, float]:
    """Paired bootstrap 95 % interval of (seed-mean ``metric`` of ``per_seed``) minus that of
    ``reference`` on one cohort, both scored on the same resampled slides (those every seed
    of both predicted)."""
    from pathtwt.mil.metrics import bootstrap_difference_interval

    aligned = _aligned(per_seed, reference)
    if aligned is None:
        return float("nan"), float("nan")
    y_true, (preds, ref), groups = aligned
    return bootstrap_difference_interval(y_true, preds, ref, metric, n_classes, n_boot=n_boot, seed=seed, groups=groups)


def _aligned(*groups: list[dict[str, np.ndarray]]) -> tuple[np.ndarray, list[list[np.ndarray]], np.ndarray | None] | None:
    """The labels, each group's per-seed predictions on the slides all of them hold, in
    slide-id order, and the slides' groups (patient, case: None unless every slide has
    one, then the bootstrap resamples groups); None when a group is empty or no slide is
    common."""
    if not groups or not all(groups):
        return None
    runs = [p for group in groups for p in group]
    common = set(runs[0]["slide_id"])
    for p in runs[1:]:
        common &= set(p["slide_id"])
    order = sorted(common)
    if not order:
        return None

    def pick(p: dict[str, np.ndarray], key: str) -> np.ndarray:
        pos = {s: i for i, s in enumerate(p["slide_id"])}
        return p[key][np.array([pos[s] for s in order])]
    slide_groups = pick(runs[0], "group") if "group" in runs[0] else None
    if slide_groups is not None and any(g in ("", None) for g in slide_groups):
        slide_groups = None
    return pick(runs[0], "label"), [[pick(p, "prediction") for p in group] for group in groups], slide_groups
