"""Does the meanpool head's choice of C decide whether the BACH study can tell the teacher
from random weights? A sensitivity check on a finished cross-validated run, made after the
study and not adopted by it: the study's rule (C by the protocol's metric on the
validation fold, fit on the training folds) beside three other common rules, each scored
out of fold with the paired bootstrap interval of the report.

    PYTHONPATH=$PWD python benchmarks/studies/bach_meanpool_selection.py --results /path/to/results

Rules (nothing is chosen on a test fold by any of them):
- ``val-qwk``: the study's rule (the grading protocol's metric on the validation fold);
- ``val-bacc``: C by balanced accuracy on the validation fold, fit on the training folds;
- ``val-logloss``: C by log-loss on the validation fold, fit on the training folds;
- ``val-logloss-refit``: the same C, refit on training and validation folds;
- ``inner-logloss``: C by mean log-loss over the non-test folds taken in turn, refit on all.
Reads the features and the label table's ``fold`` column; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

RULES = ("val-qwk", "val-bacc", "val-logloss", "val-logloss-refit", "inner-logloss")
VARIANTS = ("uncompressed", "random-init", "twt-6")


def slide_means(features: Path, slide_ids) -> dict[str, np.ndarray]:
    """Mean tile embedding of every slide that kept tiles."""
    import h5py

    out = {}
    for s in slide_ids:
        with h5py.File(features / f"{s}.h5", "r") as h:
            if len(h["features"]):
                out[s] = h["features"][:].astype(np.float64).mean(axis=0)
    return out


def fit(x: np.ndarray, y: np.ndarray, c: float, n_classes: int):
    """The study's meanpool head fitted on these slides (class-weighted, as the protocols'
    heads are): a function from mean embeddings to class probabilities."""
    from pathtwt.mil.meanpool import fit_head, predict

    head = fit_head(x, y, c, class_weighted=True, seed=0)
    return lambda z: predict(head, n_classes, z)


def out_of_fold(means: dict[str, np.ndarray], table, rule: str, k: int, n_classes: int) -> dict[str, np.ndarray]:
    from sklearn.metrics import balanced_accuracy_score, log_loss

    from pathtwt.mil.folds import val_fold
    from pathtwt.mil.meanpool import C_GRID
    from pathtwt.mil.metrics import quadratic_weighted_kappa

    labels = list(range(n_classes))
    table = table[table.slide_id.isin(means)]

    def xy(part):
        return np.stack([means[s] for s in part.slide_id]), part.label.to_numpy()

    def score(train, val, c):
        (xt, yt), (xv, yv) = xy(train), xy(val)
        p = fit(xt, yt, c, n_classes)(xv)
        if rule == "val-qwk":
            return quadratic_weighted_kappa(yv, p.argmax(1), n_classes)
        return balanced_accuracy_score(yv, p.argmax(1)) if rule == "val-bacc" else -log_loss(yv, p, labels=labels)

    probs = {}
    for f in range(k):
        test, val = table[table.fold == f], table[table.fold == val_fold(f, k)]
        train = table[~table.fold.isin([f, val_fold(f, k)])]
        if rule == "inner-logloss":
            rest = table[table.fold != f]
            inner = sorted(set(rest.fold))
            c = max(C_GRID, key=lambda c: np.mean([score(rest[rest.fold != g], rest[rest.fold == g], c) for g in inner]))
            fit_on = rest
        else:
            c = max(C_GRID, key=lambda c: score(train, val, c))  # ties: the first, the smaller C
            fit_on = train if rule != "val-logloss-refit" else table[table.fold != f]
        p = fit(*xy(fit_on), c, n_classes)(xy(test)[0])
        probs.update(zip(test.slide_id, p))
    return probs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--backbone", default="vit-s14-imgfocus")
    parser.add_argument("--cohort", default="bach")
    parser.add_argument("--classes", type=int, default=4)
    args = parser.parse_args()

    import pandas as pd

    from pathtwt.mil.metrics import bootstrap_difference_interval, slide_metrics

    warnings.filterwarnings("ignore", category=UserWarning)
    table = pd.read_csv(args.results / "labels" / f"{args.cohort}.csv")
    table = table[table.fold >= 0]
    k = int(table.fold.max()) + 1
    means = {v: slide_means(args.results / "features" / args.backbone / v / args.cohort, table.slide_id)
             for v in VARIANTS}
    print("| rule | teacher BAcc | random-init BAcc | twt-6 BAcc | teacher - random-init [95% CI] | twt-6 - teacher [95% CI] |")
    print("|---|---|---|---|---|---|")
    for rule in RULES:
        probs = {v: out_of_fold(means[v], table, rule, k, args.classes) for v in VARIANTS}
        ids = sorted(set.intersection(*(set(p) for p in probs.values())))
        y = table.set_index("slide_id").loc[ids, "label"].to_numpy()
        p = {v: np.stack([probs[v][s] for s in ids]) for v in VARIANTS}
        bacc = {v: slide_metrics(y, p[v], args.classes)["balanced_accuracy"] for v in VARIANTS}
        label = {v: p[v].argmax(axis=1) for v in VARIANTS}  # the bootstrap scores predicted classes
        lo1, hi1 = bootstrap_difference_interval(y, [label["uncompressed"]], [label["random-init"]], "balanced_accuracy",
                                                 args.classes)
        lo2, hi2 = bootstrap_difference_interval(y, [label["twt-6"]], [label["uncompressed"]], "balanced_accuracy",
                                                 args.classes)
        print(f"| {rule} | {bacc['uncompressed']:.3f} | {bacc['random-init']:.3f} | {bacc['twt-6']:.3f} | "
              f"{bacc['uncompressed'] - bacc['random-init']:+.3f} [{lo1:+.3f}, {hi1:+.3f}] | "
              f"{bacc['twt-6'] - bacc['uncompressed']:+.3f} [{lo2:+.3f}, {hi2:+.3f}] |")
    print(f"\n{len(ids)} slides out of fold, {k} folds; 1000 paired bootstrap resamples within each class, seed 0. "
          f"Chance: balanced accuracy {1 / args.classes:.3f}; the teacher (uncompressed) and the floor (random-init) "
          "are the reference columns.")


if __name__ == "__main__":
    main()
