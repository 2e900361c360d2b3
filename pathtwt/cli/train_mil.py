"""pathtwt train-mil: train and evaluate a slide head (pathtwt.mil.heads) on frozen features."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pathtwt.cli.options import add_device_argument, add_progress_argument, add_threads_argument, show_progress
from pathtwt.mil import heads

HELP = f"train and evaluate an {heads.display_list()} slide head on frozen tile features (grading or metastasis protocol)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--features", required=True, type=Path, help="folder of {slide_id}.h5 features files")
    parser.add_argument("--labels", required=True, type=Path, help="label table CSV: slide_id,label,split (train/val/test)")
    parser.add_argument("--protocol", required=True, choices=("grading", "metastasis"), help="preset of the paper's training protocol")
    parser.add_argument(
        "--aggregator", default=heads.DEFAULT_HEAD, choices=heads.names(),
        help=f"slide head; {heads.summaries()}",
    )
    parser.add_argument(
        "--fold", type=int, default=None, metavar="F",
        help="k-fold cross-validation: test on fold F of the label table's `fold` column, select on fold F+1 "
        "(mod K), train on the others; compression hold-out rows (fold -1) are left out (default: the split column)",
    )
    parser.add_argument(
        "--seed", type=int, nargs="+", default=[0], metavar="SEED",
        help="seed of initialisation, bag sampling and data order; several seeds train one run each in this "
        "process, one after the other, on features read once (default 0)",
    )
    parser.add_argument(
        "--out", required=True, help="run folder: metrics.json, predictions.csv, attention/, checkpoint.pt; "
        "with several --seed values a pattern with {seed} (e.g. runs/seed{seed})",
    )
    parser.add_argument(
        "--external", action="append", default=[], metavar="NAME=DIR:CSV",
        help="an external test cohort: features folder and label table (all its rows are evaluated); repeatable",
    )
    parser.add_argument("--classes", type=int, default=None, help="number of classes (default: max label + 1 of the label table)")
    parser.add_argument("--allow-missing", action="store_true", help="skip label-table slides without features (and ignore unlisted features files), reporting how many")
    parser.add_argument(
        "--failed-slides", choices=("stop", "exclude"), default="stop",
        help="slides whose extraction failed (features status 'failed') or that kept no tile at the tissue "
        "threshold: stop with the list (default) or exclude them with a counted warning",
    )
    parser.add_argument("--no-resume", action="store_true", help="ignore an unfinished run's resume.pt in --out and start over")
    add_device_argument(parser)
    add_threads_argument(parser)
    add_progress_argument(parser)
    preset = parser.add_argument_group("protocol overrides (default: the value of --protocol's preset)")
    for flag, kwargs, text in (
        ("--epochs", dict(type=int), "training epochs"),
        ("--lr", dict(type=float), "peak learning rate"),
        ("--weight-decay", dict(type=float), "AdamW weight decay"),
        ("--scheduler", dict(choices=("cosine", "none")), "learning-rate schedule"),
        ("--accumulation", dict(type=int), "slides per optimiser step"),
        ("--grad-clip", dict(type=float), "max gradient norm (0: off)"),
        ("--class-weighted", dict(action=argparse.BooleanOptionalAction), "class-balanced loss weights"),
        ("--selection", dict(choices=("best", "moving-average")), "how the reported epoch is chosen"),
        ("--selection-metric", dict(choices=("qwk", "accuracy", "balanced_accuracy", "auc_macro")),
         "validation metric that chooses the epoch"),
        ("--selection-window", dict(type=int), "epochs in the moving average of --selection moving-average"),
        ("--eval-each-epoch", dict(choices=("val", "all")), "cohorts evaluated after every epoch"),
        ("--max-instances", dict(type=int), "random tiles per training bag per epoch"),
        ("--hidden-dim", dict(type=int), "width of the head"),
        ("--dropout", dict(type=float), "dropout of the head"),
        ("--heads", dict(type=int), "TransMIL attention heads"),
        ("--landmarks", dict(type=int), "TransMIL Nystrom landmarks"),
    ):
        preset.add_argument(flag, default=None, help=f"{text} ({preset_defaults(flag)})", **kwargs)


def preset_defaults(flag: str) -> str:
    """The presets' values of an override, for its help line: "default 1e-4" when the
    presets agree, else "default: grading 20, metastasis 100"."""
    from pathtwt.mil.protocols import PROTOCOLS

    name = flag.lstrip("-").replace("-", "_")
    shown = {p: _help_value(name, getattr(c, name)) for p, c in PROTOCOLS.items()}
    if len(set(shown.values())) == 1:
        return f"default {next(iter(shown.values()))}"
    return "default: " + ", ".join(f"{p} {v}" for p, v in shown.items())


def _help_value(name: str, value) -> str:
    if value is None:  # fields whose None means "the head decides"
        return {"dropout": f"the head's ({heads.default_dropouts()})", "landmarks": "hidden-dim / 2",
                "max_instances": "all tiles"}.get(name, "none")
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _check_positive(args: argparse.Namespace) -> None:
    from pathtwt.errors import ConfigError

    for key in ("epochs", "accumulation", "selection_window", "max_instances", "threads", "hidden_dim", "heads", "landmarks", "classes"):
        value = getattr(args, key)
        if value is not None and value < 1:
            raise ConfigError(f"--{key.replace('_', '-')} must be >= 1, got {value}")


def run_folders(out: str, seeds: list[int]) -> list[Path]:
    """One run folder per seed: ``out`` itself for one seed, else ``out`` with {seed} filled in."""
    from pathtwt.errors import ConfigError

    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seed {' '.join(map(str, seeds))}: a seed is given twice")
    if len(seeds) > 1 and "{seed}" not in out:
        raise ConfigError(f"--out {out}: with several --seed values it must contain {{seed}} (e.g. {out}/seed{{seed}})")
    return [Path(out.replace("{seed}", str(seed))) for seed in seeds]


def run(args: argparse.Namespace) -> int:
    from pathtwt.mil.data import parse_external, prepare_data
    from pathtwt.mil.protocols import OVERRIDABLE, make_config
    from pathtwt.mil.run import run_mil
    from pathtwt.devices import use_device

    _check_positive(args)
    folders = run_folders(args.out, args.seed)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    overrides = {k: getattr(args, k) for k in OVERRIDABLE if hasattr(args, k) and k != "seed"}
    overrides["n_classes"] = args.classes
    configs = [make_config(args.protocol, seed=seed, **overrides) for seed in args.seed]
    externals = [parse_external(spec) for spec in args.external]
    data = prepare_data(
        features_dir=args.features, labels=args.labels, externals=externals, n_classes=args.classes, allow_missing=args.allow_missing, failed=args.failed_slides,
        fold=args.fold,
    )
    for name, counts in data.skipped().items():
        if any(counts.values()):
            print(f"pathtwt train-mil: {name} label table: skipped {counts}", file=sys.stderr)
    sources = {"features": str(args.features), "labels": str(args.labels), "external": args.external}
    # one process for all seeds: the bags are read once (the MIL data cache) and torch is
    # imported once, which for a small cohort costs more than a run itself
    device = use_device(args.device)
    for config, folder in zip(configs, folders):
        metrics = run_mil(
            data, config, out_dir=folder, device=device, progress=show_progress(args),
            resume=not args.no_resume, sources=sources,
        )
        for name, values in metrics["cohorts"].items():
            shown = ", ".join(f"{k} {_fmt(values[k])}" for k in ("qwk_x100", "accuracy", "balanced_accuracy", "auc_macro"))
            print(f"seed {config.seed} {name}: {values['n_slides']} slides, {shown}")
        print(f"seed {config.seed}: selected epoch {metrics['selected_epoch']}; results in {folder}")
    return 0


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"
