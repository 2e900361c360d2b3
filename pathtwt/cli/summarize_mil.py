"""pathtwt summarize-mil: mean +- std of MIL metrics over the runs of several seeds."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "mean +- std (sample std over seeds) of QWK x100, accuracy, balanced accuracy and AUC per cohort"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="train-mil output folders (one per seed)")
    parser.add_argument("--out", nargs="+", required=True, type=Path, help="summary file(s): .csv and/or .json")


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from pathtwt.errors import ConfigError
    from pathtwt.io.atomic import atomic_output, write_json_atomic
    from pathtwt.mil.summary import summarize_runs, summary_rows

    bad = [str(p) for p in args.out if p.suffix.lower() not in (".csv", ".json")]
    if bad:
        raise ConfigError(f"--out {', '.join(bad)}: the summary is written as .csv or .json")
    result = summarize_runs(args.runs)
    for path in args.out:
        if path.suffix.lower() == ".json":
            write_json_atomic(path, result)
        else:
            with atomic_output(path) as tmp:
                pd.DataFrame(summary_rows(result)).to_csv(tmp, index=False, float_format="%.6g")
    for cohort, metrics in result["summary"].items():
        shown = ", ".join(
            f"{name} {m['mean']:.4g} +- {m['std']:.2g}" for name, m in metrics.items() if m["mean"] is not None
        )
        print(f"{cohort}: {shown} ({len(result['runs'])} runs)")
    return 0
