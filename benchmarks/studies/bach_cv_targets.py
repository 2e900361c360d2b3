"""The BACH cross-validation study against its targets (issue "a study that can tell"), from
a finished run's results folder: balanced accuracy on the pooled out-of-fold predictions
with the paired bootstrap intervals the targets are stated in, per head.

    PYTHONPATH=$PWD python benchmarks/studies/bach_cv_targets.py --results /tmp/bach_cv/results --json out.json

Targets (out of fold, on the BACH images):
- the teacher resolved above random-init (paired Δ interval excludes 0) with at least one head;
- twt-6's paired Δ against the teacher with a 95 % interval of half-width <= 0.06 balanced
  accuracy, and twt-6 within 0.03 of the teacher at <= 55 % of its MACs;
- twt-6 at or above truncation-6; every distilled student's fidelity R² above 0.
Prints one Markdown table and the verdicts; writes them as JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

METRIC = "balanced_accuracy"
TASK = "bach"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from pathtwt.mil.summary import pooled_difference_interval
    from pathtwt.report.tables import find_runs, task_table, variant_cost

    runs = find_runs(args.results)
    rows, cohorts, _ = task_table(runs, args.results, task=TASK, metric=METRIC)
    by = {(r.variant, r.head): r for r in rows if r.role != "chance"}
    heads = sorted({h for _, h in by})
    pooled: dict = {}
    for r in runs:
        pooled.setdefault((r.variant, r.head), []).append(r)
    out = {"metric": METRIC, "rows": [], "targets": {}}
    print("| Variant | Head | BAcc out-of-fold [95% CI] | per fold | ΔBAcc vs teacher [95% CI] | half-width |")
    print("|---|---|---|---|---|---|")
    for (variant, head), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        mean = r.values["test", METRIC][0]
        lo, hi = r.ci.get("test", (float("nan"),) * 2)
        fm, fs, _ = r.folds.get(("test", METRIC), (float("nan"),) * 3)
        d = r.delta.get("test")
        dlo, dhi = r.delta_ci.get("test", (float("nan"),) * 2)
        half = (dhi - dlo) / 2
        print(f"| {variant} | {head} | {mean:.3f} [{lo:.3f}, {hi:.3f}] | {fm:.3f} ± {fs:.3f} | "
              + ("—" if d is None or variant == "uncompressed" else f"{d:+.3f} [{dlo:+.3f}, {dhi:+.3f}]")
              + f" | {'—' if variant == 'uncompressed' else f'{half:.3f}'} |")
        out["rows"].append({"variant": variant, "head": head, "bacc": mean, "ci95": [lo, hi], "fold_mean": fm,
                            "fold_std": fs, "delta": d, "delta_ci95": [dlo, dhi]})

    def paired(a: str, b: str, head: str) -> tuple[float, float, float]:
        """BAcc of variant a minus variant b with one head, and its paired interval."""
        from pathtwt.mil.oof import pool_seed
        from pathtwt.mil.summary import read_predictions

        sets = []
        for v in (a, b):
            folds = {r.fold: read_predictions(r.path) for r in pooled[(v, head)]}
            sets.append([pool_seed(folds, where=f"{v}/{head}")["test"]])
        lo, hi = pooled_difference_interval(sets[0], sets[1], METRIC, 4)
        return by[(a, head)].values["test", METRIC][0] - by[(b, head)].values["test", METRIC][0], lo, hi

    t = out["targets"]
    teacher_vs_random = {h: paired("uncompressed", "random-init", h) for h in heads}
    t["teacher_above_random_init"] = {"met": any(lo > 0 for _, lo, _ in teacher_vs_random.values()),
                                      "per_head": {h: list(v) for h, v in teacher_vs_random.items()}}
    twt = {h: by[("twt-6", h)] for h in heads}
    t["twt6_delta_half_width_le_0.06"] = {
        "met_with": [h for h, r in twt.items() if (r.delta_ci["test"][1] - r.delta_ci["test"][0]) / 2 <= 0.06],
        "per_head": {h: (r.delta_ci["test"][1] - r.delta_ci["test"][0]) / 2 for h, r in twt.items()}}
    cost_t, cost_s = variant_cost(args.results, "vit-s14-imgfocus", "uncompressed"), variant_cost(args.results, "vit-s14-imgfocus", "twt-6")
    t["twt6_within_0.03_at_le_55pct_macs"] = {
        "macs_share": cost_s.macs / cost_t.macs,
        "met_with": [h for h, r in twt.items() if r.delta["test"] >= -0.03],
        "per_head": {h: r.delta["test"] for h, r in twt.items()}}
    twt_vs_trunc = {h: paired("twt-6", "truncation-6", h) for h in heads}
    t["twt6_at_or_above_truncation6"] = {"met_with": [h for h, v in twt_vs_trunc.items() if v[0] >= 0],
                                         "resolved_with": [h for h, v in twt_vs_trunc.items() if v[1] > 0],
                                         "per_head": {h: list(v) for h, v in twt_vs_trunc.items()}}
    r2 = {}  # the fidelity table's R²: model.json of every compressed variant, on the hold-out's report tiles
    for meta in sorted((args.results / "models").glob("*/*/model.json")):
        final = (json.loads(meta.read_text()).get("fidelity") or {}).get("final") or {}
        if final.get("r2") is not None:
            r2[meta.parent.name] = final["r2"]
    t["every_distilled_r2_above_0"] = {"r2": r2, "met": all(v > 0 for v in r2.values())}
    print()
    print(json.dumps(t, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
