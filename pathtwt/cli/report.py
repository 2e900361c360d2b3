"""`pathtwt report`: the results tables (CSV, Markdown) and the HTML page of a study."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "results tables per task (mean +- std over seeds, delta vs uncompressed, params, MACs) and the HTML report"


def _task_metric(text: str) -> tuple[str, str]:
    task, sep, metric = text.partition("=")
    if not sep or not task or not metric:
        raise argparse.ArgumentTypeError(f"expected TASK=METRIC, got {text!r}")
    return task, metric


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=Path, default=Path("results"), help="results folder of the workflow (default results)")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default RESULTS/report)")
    parser.add_argument(
        "--metric", type=_task_metric, action="append", default=[], metavar="TASK=METRIC",
        help="headline metric of a task (qwk, accuracy, balanced_accuracy, auc_macro); repeatable; "
        "tasks not named use accuracy",
    )
    parser.add_argument("--attention-slides", type=int, default=3, help="slides per task with attention heatmaps (default 3)")


def run(args: argparse.Namespace) -> int:
    from pathtwt.report.tables import write_report

    out = args.out or args.results / "report"
    page = write_report(args.results, out, metrics=dict(args.metric), attention_slides=args.attention_slides)
    print(f"report: {page}")
    return 0
