"""`pathtwt report`: the results tables (CSV, Markdown) and the HTML page of a study."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("results tables per task (mean +- std over seeds with bootstrap intervals, reference rows, delta vs "
        "uncompressed, params, MACs, precision, tiles/s) and the HTML report")


def _task_metric(text: str) -> tuple[str, str]:
    task, sep, metric = text.partition("=")
    if not sep or not task or not metric:
        raise argparse.ArgumentTypeError(f"expected TASK=METRIC, got {text!r}")
    return task, metric


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=Path, default=Path("results"),
                        help="results folder of the study: the workflow's results/STUDY (default results)")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default RESULTS/report)")
    parser.add_argument(
        "--metric", type=_task_metric, action="append", default=[], metavar="TASK=METRIC",
        help="headline metric of a task (qwk, accuracy, balanced_accuracy, auc_macro); repeatable; "
        "tasks not named use accuracy",
    )
    parser.add_argument("--attention-slides", type=int, default=1,
                        help="slides per class with the attention of every variant and head: those of the task's own "
                        "cohort the teacher's first attention head classified correctly with the highest probability "
                        "(default 1; 0: none)")
    parser.add_argument("--config", type=Path, action="append", default=[], metavar="FILE",
                        help="workflow config(s) whose tasks give the headline metrics (as --metric does); repeatable")
    for name, what in (("tasks", "tasks"), ("backbones", "backbones"), ("variants", "backbone variants"),
                       ("heads", "MIL heads")):
        parser.add_argument(f"--{name}", nargs="+", default=None, metavar="NAME",
                            help=f"report only these {what} (default: every one found under RESULTS; the workflow "
                            "names its study's own)")
    parser.add_argument("--markdown", action="store_true",
                        help="also print the result tables of the docs (OUT/tables.md: per task, tile probe, fidelity, with the "
                        "commit and machine) to stdout, to be pasted as they are")


def run(args: argparse.Namespace) -> int:
    from pathtwt.report.selection import Selection
    from pathtwt.report.tables import write_report

    out = args.out or args.results / "report"
    metrics = {}
    if args.config:
        from pathtwt.config.check import load_and_check

        config, _ = load_and_check(args.config, require_slides=False)
        metrics = {task: spec["metric"] for task, spec in config["tasks"].items()}
    metrics.update(dict(args.metric))
    selection = Selection.of(tasks=args.tasks, backbones=args.backbones, variants=args.variants, heads=args.heads)
    page = write_report(args.results, out, metrics=metrics, attention_slides=args.attention_slides, selection=selection)
    if args.markdown:
        print((out / "tables.md").read_text(encoding="utf-8"), end="")
    else:
        print(f"report: {page}")
    return 0
