"""The ``pathtwt`` command: one subcommand per workflow step.

Each subcommand lives in ``pathtwt/cli/<name>.py`` and defines ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int | None``. Modules are imported only when
their subcommand runs, so ``pathtwt tile`` never pays for importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pathtwt.mil.heads import display_list as _head_names

# subcommand -> module under pathtwt.cli, in workflow order
COMMANDS: dict[str, str] = {
    "demo": "demo",
    "tile": "tile",
    "extract": "extract",
    "export-features": "export_features",
    "calibrate": "calibrate",
    "discover": "discover",
    "compress": "compress",
    "labels": "labels",
    "train-mil": "train_mil",
    "summarize-mil": "summarize_mil",
    "analyze": "analyze",
    "probe": "probe",
    "report": "report",
    "predict": "predict",
    "heatmap": "heatmap",
    "check-config": "check_config",
    "store": "store",
    "doctor": "doctor",
    "bench": "bench",
}

# one-line descriptions shown by `pathtwt --help` without importing every module
SUMMARIES: dict[str, str] = {
    "demo": "write the synthetic demo cohorts (pyramidal TIFF slides, label tables, true masks)",
    "tile": "find tissue and write the tile coordinates of one slide to HDF5",
    "extract": "embed every tile of a slide with a (compressed) backbone into HDF5",
    "export-features": "write features files in CLAM's (.pt) or STAMP's layout",
    "calibrate": "draw the calibration tiles for compression from the training cohort",
    "discover": "layer-similarity matrix and the exact min-max partition into blocks",
    "compress": "compress a backbone (TWT or a comparison method) and export a timm ViT",
    "labels": "build a cohort's slide_id,label,split table from its published metadata",
    "train-mil": f"train and evaluate an {_head_names()} slide head on frozen features",
    "summarize-mil": "mean +- std of MIL metrics over seeds",
    "analyze": "norm growth, eps sensitivity, intrinsic dimension and stability analyses",
    "probe": "logistic-regression and kNN probes of a backbone's tile embeddings on labelled tiles",
    "report": "build the results tables and HTML report",
    "predict": "class probabilities of new slides with a backbone variant and trained MIL heads, to CSV",
    "heatmap": "attention heatmap, top/bottom tiles and QuPath GeoJSON of a slide under a trained MIL head",
    "check-config": "validate a workflow config and its label tables before any job runs",
    "store": "list, measure and prune the store of tiles, models and features kept by what made them",
    "doctor": "what this machine can run: one line a check (OK / WARN / FAIL with the fix)",
    "bench": "tiles/s of each backbone and its students on this machine, model-only and end to end",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, just that subcommand's options are built
    (the others are listed by name, without importing their modules)."""
    from pathtwt import __version__
    from pathtwt.cli.options import HelpFormatter, use_help_formatter

    parser = argparse.ArgumentParser(
        prog="pathtwt", description=__doc__.splitlines()[0], formatter_class=HelpFormatter,
        epilog="Conventions: --device auto|cpu|cuda|cuda:N and --no-progress in every command that "
        "uses them; HF_HUB_OFFLINE=1 keeps backbone weights from being fetched from the Hugging Face hub "
        "(PATHTWT_OFFLINE=1 is an alias). `pathtwt COMMAND --help` shows a command's options and defaults.",
    )
    parser.add_argument("--version", action="version", version=f"pathtwt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=SUMMARIES[name], add_help=False)
            continue
        module = importlib.import_module(f"pathtwt.cli.{module_name}")
        p = sub.add_parser(name, help=SUMMARIES[name], description=getattr(module, "HELP", SUMMARIES[name]))
        module.add_arguments(p)
        use_help_formatter(p)
        p.set_defaults(_module=module)
    return parser


def error_prefix(command: str) -> str:
    """What the one line of a failure of ``command`` begins with."""
    return f"pathtwt {command}: error: "


def error_line(command: str, exc: BaseException) -> str | None:
    """The one line for an expected failure of ``command`` (a PathtwtError; a full disk, a
    full quota or a read-only folder met outside the atomic writers; a GPU out of memory),
    None for anything else: a bug, whose traceback is shown."""
    from pathtwt.errors import PathtwtError

    if isinstance(exc, PathtwtError):
        return str(exc)
    if isinstance(exc, OSError):
        from pathtwt.io.write_errors import raise_for_os_error

        try:
            raise_for_os_error(exc)
        except PathtwtError as line:
            return str(line)
        return None
    if isinstance(exc, RuntimeError):  # torch.cuda.OutOfMemoryError is one
        from pathtwt.out_of_memory import is_out_of_memory, out_of_memory_line

        if is_out_of_memory(exc):
            return out_of_memory_line(command, exc)
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=chosen if chosen in COMMANDS else "")
    args = parser.parse_args(argv)
    if getattr(args, "_module", None) is None:
        parser.print_help()
        return 0 if not argv else 2
    try:
        code = args._module.run(args)
    except KeyboardInterrupt:
        print(f"pathtwt {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # expected, user-facing failures: one line, no traceback
        line = error_line(args.command, exc)
        if line is None:
            raise
        print(f"{error_prefix(args.command)}{line}", file=sys.stderr)
        return 1
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
