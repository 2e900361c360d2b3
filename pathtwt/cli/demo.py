"""``pathtwt demo``: synthetic pyramidal TIFF slides for the demo workflow and tests."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "write the synthetic demo cohorts (pyramidal TIFF slides, label tables, true masks) or single test slides"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="demo_command", metavar="ACTION", required=True)

    cohorts = sub.add_parser("make-slides", help="all demo cohorts with labels.csv, true masks and demo.json")
    cohorts.add_argument("--out", required=True, type=Path, help="output folder (one subfolder per cohort)")
    cohorts.add_argument("--scale", choices=("demo", "test"), default="demo", help="demo: ~100 slides; test: a few tiny ones")
    cohorts.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    cohorts.add_argument("--workers", type=int, default=1, help="slides written in parallel processes")
    cohorts.add_argument("--force", action="store_true", help="regenerate even if OUT/demo.json exists")
    cohorts.set_defaults(demo_run=_make_slides)

    one = sub.add_parser("make-slide", help="one synthetic slide of any size (e.g. a 60,000 x 40,000 benchmark slide)")
    one.add_argument("--out", required=True, type=Path, help="output .tiff")
    one.add_argument("--width", type=int, default=2560, help="level-0 width in pixels")
    one.add_argument("--height", type=int, default=2048, help="level-0 height in pixels")
    one.add_argument("--mpp", type=float, default=0.25, help="level-0 microns per pixel")
    one.add_argument("--task", choices=("grading", "metastasis"), default="grading", help="which demo task the slide looks like")
    one.add_argument("--label", type=int, default=3, help="grade 0-5 (grading) or 0/1 (metastasis)")
    one.add_argument("--external", action="store_true", help="use the external cohort's stain")
    one.add_argument("--islands", type=int, default=2, help="tissue islands on the slide")
    one.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    one.add_argument("--mask", type=Path, help="also write the true tissue mask PNG here (default: no mask)")
    one.add_argument("--mask-downsample", type=int, default=16, help="downsample of the mask PNG against level 0")
    one.add_argument("--corrupt-tile", action="store_true", help="garble one level-0 tile in the middle (reader error tests)")
    one.set_defaults(demo_run=_make_slide)


def run(args: argparse.Namespace) -> int:
    return args.demo_run(args)


def _make_slides(args: argparse.Namespace) -> int:
    from pathtwt.demo.make import MANIFEST, make_demo_cohorts

    if args.workers < 1:
        from pathtwt.errors import ConfigError

        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    manifest = make_demo_cohorts(args.out, scale=args.scale, seed=args.seed, force=args.force, workers=args.workers)
    for name, cohort in manifest["cohorts"].items():
        tiles = sum(s["tiles_224px_0.5mpp"] for s in cohort["slides"])
        print(f"{name}: {len(cohort['slides'])} slides, ~{tiles} tissue tiles of 224 px at 0.5 um/px")
    print(f"wrote {args.out / MANIFEST}")
    return 0


def _make_slide(args: argparse.Namespace) -> int:
    from pathtwt.demo.cohorts import single_slide_recipe
    from pathtwt.demo.corrupt import corrupt_middle_tile
    from pathtwt.demo.make import write_png
    from pathtwt.demo.synthetic import SyntheticSlide
    from pathtwt.demo.tiff_writer import write_pyramidal_tiff

    recipe = single_slide_recipe(
        width=args.width,
        height=args.height,
        mpp=args.mpp,
        task=args.task,
        label=args.label,
        external=args.external,
        islands=args.islands,
        seed=args.seed,
    )
    slide = SyntheticSlide(recipe)
    dims = write_pyramidal_tiff(args.out, slide.width, slide.height, slide.render, mpp=slide.mpp)
    if args.corrupt_tile:
        corrupt_middle_tile(args.out)
    if args.mask is not None:
        write_png(args.mask, slide.tissue_mask(args.mask_downsample).astype("uint8") * 255)
    print(f"wrote {args.out}: levels {' '.join(f'{w}x{h}' for w, h in dims)}, mpp {slide.mpp:g}")
    return 0
