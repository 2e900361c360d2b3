"""pathtwt tile: tissue tile coordinates of one slide -> coords HDF5 (+ thumbnail PNG)."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "find tissue on one slide (Otsu on a low-resolution level) and write the coordinates of the tiles with enough tissue to HDF5"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pathtwt.cli.tiling_options import add_tissue_arguments
    from pathtwt.wsi.tiling import TILING_DEFAULTS as D

    parser.add_argument("slide", help="whole-slide image (any format OpenSlide or tiffslide reads) or a JPEG/PNG image")
    parser.add_argument("--out", required=True, help="coords HDF5 to write")
    parser.add_argument("--mpp", type=float, default=D.target_mpp,
                        help=f"target microns per pixel of the tiles (default {D.target_mpp:g}; 0.5 = 20x)")
    parser.add_argument("--tile-size", type=int, default=D.tile_size,
                        help=f"tile side in pixels at the target mpp (default {D.tile_size})")
    add_tissue_arguments(parser)
    parser.add_argument(
        "--on-failure", choices=("stop", "record"), default="stop",
        help="a slide that cannot be opened or decoded: stop with its error (default), or record it: a coords "
        "file with no tiles, status 'failed' and failure_reason (extraction then lists it in its failures "
        "table and the MIL heads leave it out)",
    )
    parser.add_argument(
        "--thumbnail", default=None,
        help="also write a PNG with the tissue outline and kept tiles (default: no thumbnail)",
    )


def run(args: argparse.Namespace) -> int:
    from pathtwt.cli.tiling_options import tile_request
    from pathtwt.errors import PathtwtError, SlideError
    from pathtwt.wsi.tile_job import write_failed, write_tiles

    for option, value in (("--out", args.out), ("--thumbnail", args.thumbnail)):
        if value and Path(value).is_dir():
            raise PathtwtError(f"{option} {value}: is a folder; give the file to write, e.g. {Path(value) / 'SLIDE.h5'}")
    request = tile_request(args)
    try:
        tiling = write_tiles(request, args.slide, args.out, thumbnail=args.thumbnail)
    except SlideError as exc:
        if args.on_failure == "stop" or getattr(exc, "after_open", False):
            raise
        write_failed(request, args.slide, args.out, args.thumbnail, str(exc))
        return 0
    print(
        f"{args.slide}: {len(tiling.coords)} tiles of {args.tile_size} px at {args.mpp} um/px "
        f"(level-0 side {tiling.attrs['patch_size_level0']}, read level {tiling.attrs['read_level']}, "
        f"status {tiling.attrs['status']}) -> {args.out}"
    )
    return 0
