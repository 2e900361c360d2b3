"""pathtwt bench: tiles/s of each backbone and its students on this machine, model-only and
end to end, with the machine's facts; Markdown, JSON and a plot, rewritten after every row."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pathtwt.cli.options import add_decode_argument, add_device_argument, add_precision_argument, add_workers_argument

HELP = ("how fast each backbone and its students go on this machine: model-only tiles/s at the batch sizes that fit, "
        "each decoder's and the readers' own rates, end-to-end tiles/s on 20x and 40x mosaics of a real (or generated) "
        "slide, peak memory, each student's speed-up over its teacher beside its MAC ratio; random weights")


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list of integers, e.g. 64,128") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers")
    return values


def _mosaics(text: str) -> dict[str, tuple[int, int]]:
    from pathtwt.bench.mosaics import MOSAIC_MPP

    out: dict[str, tuple[int, int]] = {}
    for part in (p for p in text.split(",") if p):
        name, _, copies = part.partition("=")
        cols, _, rows = copies.partition("x")
        if name not in MOSAIC_MPP or not (cols.isdigit() and rows.isdigit()) or min(int(cols), int(rows)) < 1:
            raise argparse.ArgumentTypeError(f"{part!r}: expected NAME=CxR with NAME one of {', '.join(MOSAIC_MPP)}, "
                                             "e.g. 20x=2x2")
        out[name] = (int(cols), int(rows))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backbone", action="append", default=None, metavar="NAME",
                        help="a registry backbone (repeatable; default: vit-s14-imgfocus on CPU, h0-mini on GPU)")
    parser.add_argument("--variants", default=None, metavar="A,B",
                        help="variants to measure: uncompressed and METHOD-K, or names of --config's variants "
                        "(default: uncompressed,twt-6 on CPU; uncompressed,twt-6,twt-4 on GPU; a student's "
                        "teacher is always measured)")
    parser.add_argument("--config", default=None, metavar="STUDY.yaml",
                        help="take the backbones and variants from a study config (default: none)")
    parser.add_argument("--weights", default=None, metavar="FILE",
                        help="the teacher's weights (default: random; throughput does not depend on them)")
    add_device_argument(parser)
    add_precision_argument(parser)
    parser.add_argument("--batch-sizes", type=_ints, default=None, metavar="N,N",
                        help="model-only batch sizes, ascending; larger ones stop at the first that does not fit "
                        "(default: 8 on CPU; 64,128,256,512 on GPU)")
    parser.add_argument("--mosaics", type=_mosaics, default=None, metavar="20x=CxR,40x=CxR",
                        help="copies of the slide side by side in each mosaic (default: 20x=1x1,40x=1x1 on CPU; "
                        "20x=5x4,40x=7x6 on GPU)")
    parser.add_argument("--slide", default=None, metavar="SLIDE",
                        help="the slide the mosaics repeat (default: ../shared's CMU-1-Small-Region.svs where present, "
                        "else a generated H&E-like image)")
    add_workers_argument(parser, "reading processes of the end-to-end rows")
    add_decode_argument(parser)
    parser.add_argument("--out", default="bench", metavar="PREFIX",
                        help="writes PREFIX.md, PREFIX.json and PREFIX.png, after every row (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="also print the JSON at the end")


def default_slide() -> Path | None:
    """../shared's CMU-1-Small-Region.svs (PATHTWT_SHARED overrides ../shared), if present."""
    import os

    shared = Path(os.environ.get("PATHTWT_SHARED", Path.cwd().parent / "shared"))
    slide = shared / "data" / "slides" / "CMU-1-Small-Region.svs"
    return slide if slide.is_file() else None


def settings(args: argparse.Namespace, device: str):
    from pathtwt.bench.runner import BenchSettings, cpu_defaults, gpu_defaults
    from pathtwt.bench.variants import check_backbone, from_config, parse_variant
    from pathtwt.models.registry import get_spec

    d = gpu_defaults() if device.startswith("cuda") else cpu_defaults()
    config_variants: dict = {}
    backbones = d["backbones"]
    if args.config:
        listed, config_variants = from_config(args.config)
        backbones = {b: v or list(config_variants) for b, v in listed.items()}
    if args.backbone:
        default_variants = next(iter(backbones.values()))
        backbones = {b: list(backbones.get(b, default_variants)) for b in args.backbone}
    if args.variants:
        backbones = {b: [v for v in args.variants.split(",") if v] for b in backbones}
    for name, variants in backbones.items():
        check_backbone(name)
        depth = get_spec(name).depth
        chosen = [parse_variant(v, depth, config_variants) for v in variants]  # an unknown name: one line
        if not any(v.is_teacher for v in chosen):  # a student's speed-up needs its teacher
            variants.insert(0, "uncompressed")
    return BenchSettings(
        device=device, backbones=backbones, config_variants=config_variants, weights=args.weights,
        precision=args.precision, batches=args.batch_sizes or d["batches"], e2e_batch=d["e2e_batch"],
        e2e_tiles=d["e2e_tiles"], mosaics=args.mosaics or d["mosaics"], mosaic_budget_s=d["mosaic_budget_s"], workers=args.workers,
        decode=args.decode, min_time_s=d["min_time_s"], timing=d["timing"], steady=d["steady"],
        slide=Path(args.slide) if args.slide else default_slide())


def run(args: argparse.Namespace) -> int:
    import json
    import logging
    import time

    from pathtwt.bench.doctor import Context, as_json, run_checks
    from pathtwt.bench.results import ResultsFile
    from pathtwt.bench.runner import run_bench
    from pathtwt.bench.table import COLUMNS, cell, markdown, plot
    from pathtwt.devices import available_cores, use_device

    device = use_device(args.device)  # --device cuda on a CPU machine: one line, exit 1
    s = settings(args, device)
    began = time.perf_counter()
    checks = run_checks(Context(store=".", workers=args.workers or max(1, available_cores() - 1)))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = ResultsFile(out.with_suffix(".json"), {"machine": as_json(checks), "device": device,
                          "precision": args.precision, "backbones": s.backbones}, text_path=out.with_suffix(".md"),
                          render=markdown)
    results.write()

    def log(line: str) -> None:
        print(f"pathtwt bench: {line}", file=sys.stderr, flush=True)

    print("  ".join(title for _, title in COLUMNS), flush=True)

    def add(row) -> None:
        written = results.add(row)
        print("  ".join(cell(written.get(key)) for key, _ in COLUMNS), flush=True)
        if written.get("note"):
            print(f"    {written['note']}", flush=True)

    # each extraction's own log line (what bounded it) would bury the rows: the rows say it
    logging.getLogger("pathtwt.features").setLevel(logging.WARNING)
    try:
        run_bench(s, add, lambda **facts: results.update(**facts), log)
    finally:
        results.update(seconds=round(time.perf_counter() - began, 1))
        if results.rows:
            plot(results.rows, out.with_suffix(".png"))
    log(f"{len(results.rows)} rows in {time.perf_counter() - began:.0f} s: {out.with_suffix('.md')}, "
        f"{out.with_suffix('.json')}, {out.with_suffix('.png')}")
    if args.json:
        print(json.dumps(results.data(), indent=1))
    return 0
