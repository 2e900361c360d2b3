"""pathtwt calibrate: draw the calibration tiles for compression."""

from __future__ import annotations

import argparse
from pathlib import Path

from pathtwt.cli.options import add_progress_argument, progress_bar

HELP = "draw a seeded calibration set of tiles (split fit/select/report) from training-cohort coords files or images"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--coords", nargs="+", default=[], metavar="PATH",
        help="coords .h5 files or folders of them (training cohort only)",
    )
    parser.add_argument(
        "--images", nargs="+", default=[], metavar="PATH",
        help="image files or folders (tif/tiff/png/jpg); large images are cut into tiles",
    )
    parser.add_argument("--out", required=True, type=Path, help="calibration HDF5 to write")
    parser.add_argument("--n-tiles", type=int, default=10_000, help="tiles to draw (default 10000)")
    from pathtwt.compress.defaults import COMPRESS_DEFAULTS

    holdout = COMPRESS_DEFAULTS.holdout
    parser.add_argument("--holdout", type=float, default=holdout,
                        help=f"fraction kept out of fitting, half select and half report (default {holdout:g})")
    parser.add_argument("--holdout-by", choices=("tile", "slide"), default="tile",
                        help="hold out random tiles (default) or whole slides, so that a streamed training set "
                        "(pathtwt compress --train-coords) can leave the held-out slides out")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    parser.add_argument(
        "--patch-size", type=int, default=None,
        help="side in pixels the drawn tiles are resized to, the teacher's input size (default: the coords files' "
        "tiling size, their patch_size, else 224)",
    )
    parser.add_argument(
        "--labels", type=Path, default=None,
        help="label table (slide_id,label,split): keep only coords files of slides in --splits "
        "(default: no table, every coords file given is used)",
    )
    parser.add_argument("--splits", nargs="+", default=["train"], help="splits allowed with --labels")
    add_progress_argument(parser)


def run(args: argparse.Namespace) -> int:
    from pathtwt.compress.calibration import draw_tiles, expand_sources, restrict_to_splits, write_calibration
    from pathtwt.errors import ConfigError

    if not args.coords and not args.images:
        raise ConfigError("give --coords and/or --images")
    calib, coords, _ = expand_sources(args.coords)
    if calib:
        raise ConfigError(f"{calib[0]} is already a calibration file; pass coords files to --coords")
    if args.labels is not None:
        n_before = len(coords)
        coords = restrict_to_splits(coords, args.labels, args.splits)
        print(f"{args.labels}: {len(coords)} of {n_before} coords files are in splits {', '.join(args.splits)}")
    _, _, images = expand_sources(args.images)
    if args.coords and not coords:
        raise ConfigError(f"no coords .h5 files found in --coords {' '.join(args.coords)}")
    if args.images and not images:
        raise ConfigError(f"no images found in --images {' '.join(args.images)}")
    with progress_bar(args, args.n_tiles, "calibration tiles") as bar:
        drawn = draw_tiles(
            coords, images, n_tiles=args.n_tiles, seed=args.seed, holdout=args.holdout, resize_to=args.patch_size,
            holdout_by=args.holdout_by,
            progress=bar.update,
        )
    provenance = {
        "seed": args.seed,
        "n_tiles_requested": args.n_tiles,
        "n_tiles": int(len(drawn.tiles)),
        "holdout": args.holdout,
        "holdout_by": args.holdout_by,
        "labels": str(args.labels) if args.labels else None,
        "splits": args.splits if args.labels else None,
        "coords": [str(p) for p in coords],
        "images": [str(p) for p in images],
    }
    write_calibration(args.out, drawn, provenance)
    counts = [int((drawn.split == code).sum()) for code in range(3)]
    print(f"{args.out}: {len(drawn.tiles)} tiles of {drawn.patch_size} px "
          f"({counts[0]} fit, {counts[1]} select, {counts[2]} report) from {len(drawn.sources)} sources")
    return 0
