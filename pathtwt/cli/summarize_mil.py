"""pathtwt summarize-mil: mean +- std of MIL metrics over the runs of several seeds."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "mean +- std (sample std over seeds) of QWK x100, accuracy, balanced accuracy and AUC per cohort"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="train-mil output folders (one per seed)")
    parser.add_argument("--out", nargs="+", required=True, type=Path, help="summary file(s): .csv and/or .json")


def run(args: argparse.Namespace) -> int:
    from pathtwt.mil.summary import write_summary

    result = write_summary(args.runs, args.out)
    for cohort, metrics in result["summary"].items():
        shown = ", ".join(
            f"{name} {m['mean']:.4g} +- {m['std']:.2g}" for name, m in metrics.items() if m["mean"] is not None
        )
        print(f"{cohort}: {shown} ({len(result['runs'])} runs)")
    return 0
