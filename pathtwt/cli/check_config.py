"""`pathtwt check-config`: validate a workflow config and its label tables before any job
runs (the Snakefile runs the same checks when it parses the config)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("validate a workflow config before any job runs: the schema, the label tables, the backbones and folds, "
        "and every labelled slide opened, tiled and read as its jobs will")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "configs", nargs="*", metavar="CONFIG",
        help="config YAML files, later ones overriding earlier ones (default: config/config.yaml)",
    )
    parser.add_argument(
        "--no-slides", action="store_true",
        help="do not require the labelled slides to exist on disk (plan on another machine)",
    )
    parser.add_argument(
        "--no-read", action="store_true",
        help="check that the labelled slides exist, but do not open, tile and read them (default: read every one)",
    )
    parser.add_argument(
        "--jobs", type=int, default=None, metavar="N",
        help="slides read at a time, in as many processes (default: the machine's CPUs)",
    )
    parser.add_argument(
        "--slide-cache", metavar="DIR", default=None,
        help="where the result of each slide's check is kept, by the slide's fingerprint, so an unchanged slide "
        "is not read again (default: $PATHTWT_CACHE_DIR/slide-checks, else ~/.cache/pathtwt/slide-checks; "
        "'none' keeps nothing)",
    )
    parser.add_argument(
        "--extra-args", action="append", default=[], metavar="SECTION=TEXT",
        help="check only these extra_args words (compress=..., mil=...) against the flags of the subcommand the "
        "section runs, as the workflow does for a config that has extra_args; repeatable (default: none)",
    )
    parser.add_argument("--source", default="--extra-args", help="the config named in an --extra-args error")
    table = parser.add_argument_group("one label table (used by the workflow's labels rule)")
    table.add_argument(
        "--label-table", metavar="CSV", help="check this label table instead of a config (default: check configs)"
    )
    table.add_argument("--label-column", default="label", help="column holding the slide label")
    table.add_argument("--split-column", default="split", help="column holding the split name")
    table.add_argument("--splits", nargs="+", default=["train", "val", "test"], help="split names allowed")
    table.add_argument(
        "--rename-split", action="append", default=[], metavar="OLD=NEW",
        help="rename a split in the written table (e.g. the cohort's training split to train); repeatable",
    )
    table.add_argument(
        "--write-labels", metavar="OUT_CSV",
        help="write the checked table as slide_id,label,split, the layout train-mil reads (default: check only)",
    )


def run(args: argparse.Namespace) -> int:
    from pathtwt.config.check import load_and_check, read_label_table, write_normalized_labels
    from pathtwt.errors import ConfigError

    if args.label_table:
        table = read_label_table(
            args.label_table, label_column=args.label_column,
            split_column=args.split_column, splits=args.splits, where=args.label_table,
        )
        rename = dict(r.split("=", 1) for r in args.rename_split if "=" in r)
        if len(rename) != len(args.rename_split):
            raise ConfigError(f"--rename-split takes OLD=NEW, got {args.rename_split}")
        if args.write_labels:
            write_normalized_labels(table, args.write_labels, rename=rename)
        print(f"{args.label_table}: {len(table.slide_ids)} slides, splits ok")
        return 0
    if args.write_labels:
        raise ConfigError("--write-labels needs --label-table CSV")
    from pathtwt.config.extra_args import EXTRA_ARGS_COMMANDS, check_extra_args

    if args.extra_args:
        given = dict(text.partition("=")[::2] for text in args.extra_args)
        unknown = sorted(set(given) - set(EXTRA_ARGS_COMMANDS))
        if unknown:
            raise ConfigError(f"--extra-args {unknown[0]}=...: not a section with extra_args ({', '.join(EXTRA_ARGS_COMMANDS)})")
        check_extra_args({s: {"extra_args": t} for s, t in given.items()}, source=args.source, flags_of=command_flags)
        print(f"extra_args ok: {', '.join(given)}")
        return 0
    configs = args.configs or ["config/config.yaml"]
    source = " + ".join(str(c) for c in configs)
    config, tables = load_and_check(configs, require_slides=not args.no_slides)
    check_extra_args(config, source=source, flags_of=command_flags)
    if not args.no_slides and not args.no_read:
        import sys
        import time

        from pathtwt.config.check import read_and_check_slides
        from pathtwt.config.slide_reads import default_cache

        if args.jobs is not None and args.jobs < 1:
            raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
        cache = None if args.slide_cache == "none" else Path(args.slide_cache) if args.slide_cache else default_cache()
        began = time.perf_counter()
        for line in read_and_check_slides(config, tables, source=source, jobs=args.jobs, cache=cache):
            print(f"pathtwt check-config: warning: {line}", file=sys.stderr)
        n = sum(len(t.slide_ids) for t in tables.values())
        print(f"read {n} labelled slides in {time.perf_counter() - began:.1f} s (cache: {cache or 'none'})")
    for cohort in config["cohorts"]:
        if cohort in tables:
            counts = {s: tables[cohort].splits.count(s) for s in dict.fromkeys(tables[cohort].splits)}
            print(f"cohort {cohort}: {len(tables[cohort].slide_ids)} slides {counts}")
        else:
            print(f"cohort {cohort}: demo cohort, generated by the workflow")
    from pathtwt.io.layout import study_results

    print(f"config ok: {len(config['tasks'])} tasks, {len(config['backbones'])} backbones, {len(config['variants'])} variants; "
          f"study {config['study']}: its results and report go to {study_results(config['study'])}/")
    return 0


def command_flags(command: str) -> set[str]:
    """Every option string of ``pathtwt COMMAND`` (built without importing torch)."""
    from pathtwt.cli import build_parser

    parser = build_parser(only=command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {s for action in sub._actions for s in action.option_strings}
