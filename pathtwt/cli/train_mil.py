"""pathtwt train-mil: train and evaluate an ABMIL or TransMIL slide head on frozen features."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "train and evaluate an ABMIL or TransMIL slide head on frozen tile features (grading or metastasis protocol)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--features", required=True, type=Path, help="folder of {slide_id}.h5 features files")
    parser.add_argument("--labels", required=True, type=Path, help="label table CSV: slide_id,label,split (train/val/test)")
    parser.add_argument("--protocol", required=True, choices=("grading", "metastasis"), help="preset of the paper's training protocol")
    parser.add_argument("--aggregator", default="abmil", choices=("abmil", "transmil"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, type=Path, help="run folder: metrics.json, predictions.csv, attention/, checkpoint.pt")
    parser.add_argument(
        "--external", action="append", default=[], metavar="NAME=DIR:CSV",
        help="an external test cohort: features folder and label table (all its rows are evaluated); repeatable",
    )
    parser.add_argument("--classes", type=int, default=None, help="number of classes (default: max label + 1 of the label table)")
    parser.add_argument("--allow-missing", action="store_true", help="skip label-table slides without features (and ignore unlisted features files), reporting how many")
    parser.add_argument(
        "--failed-slides", choices=("stop", "exclude"), default="stop",
        help="slides whose extraction failed (features status 'failed'): stop with the list (default) or "
        "exclude them with a counted warning",
    )
    parser.add_argument("--no-resume", action="store_true", help="ignore an unfinished run's resume.pt in --out and start over")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice; 1 is fastest for small bags)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    preset = parser.add_argument_group("protocol overrides (default: the protocol's preset)")
    preset.add_argument("--epochs", type=int)
    preset.add_argument("--lr", type=float)
    preset.add_argument("--weight-decay", type=float)
    preset.add_argument("--scheduler", choices=("cosine", "none"))
    preset.add_argument("--accumulation", type=int, help="slides per optimiser step")
    preset.add_argument("--grad-clip", type=float, help="max gradient norm (0: off)")
    preset.add_argument("--class-weighted", action=argparse.BooleanOptionalAction, default=None)
    preset.add_argument("--selection", choices=("best", "moving-average"))
    preset.add_argument("--selection-metric", choices=("qwk", "accuracy", "balanced_accuracy", "auc_macro"))
    preset.add_argument("--selection-window", type=int)
    preset.add_argument("--eval-each-epoch", choices=("val", "all"))
    preset.add_argument("--max-instances", type=int, help="random tiles per training bag per epoch")
    preset.add_argument("--hidden-dim", type=int)
    preset.add_argument("--dropout", type=float)
    preset.add_argument("--heads", type=int, help="TransMIL attention heads")
    preset.add_argument("--landmarks", type=int, help="TransMIL Nystrom landmarks")


def _check_positive(args: argparse.Namespace) -> None:
    from pathtwt.errors import ConfigError

    for key in ("epochs", "accumulation", "selection_window", "max_instances", "threads", "hidden_dim", "heads", "landmarks", "classes"):
        value = getattr(args, key)
        if value is not None and value < 1:
            raise ConfigError(f"--{key.replace('_', '-')} must be >= 1, got {value}")


def run(args: argparse.Namespace) -> int:
    from pathtwt.mil.data import parse_external, prepare_data
    from pathtwt.mil.protocols import OVERRIDABLE, make_config
    from pathtwt.mil.run import run_mil
    from pathtwt.devices import resolve_device

    _check_positive(args)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    overrides = {k: getattr(args, k) for k in OVERRIDABLE if hasattr(args, k)}
    overrides["n_classes"] = args.classes
    config = make_config(args.protocol, **overrides)
    externals = [parse_external(spec) for spec in args.external]
    data = prepare_data(
        features_dir=args.features, labels=args.labels, externals=externals, n_classes=args.classes, allow_missing=args.allow_missing, failed=args.failed_slides
    )
    for name, counts in data.skipped().items():
        if any(counts.values()):
            print(f"pathtwt train-mil: {name} label table: skipped {counts}", file=sys.stderr)
    sources = {"features": str(args.features), "labels": str(args.labels), "external": args.external}
    metrics = run_mil(
        data, config, out_dir=args.out, device=resolve_device(args.device), progress=not args.no_progress,
        resume=not args.no_resume, sources=sources,
    )
    for name, values in metrics["cohorts"].items():
        shown = ", ".join(f"{k} {_fmt(values[k])}" for k in ("qwk_x100", "accuracy", "balanced_accuracy", "auc_macro"))
        print(f"{name}: {values['n_slides']} slides, {shown}")
    print(f"selected epoch {metrics['selected_epoch']}; results in {args.out}")
    return 0


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"
