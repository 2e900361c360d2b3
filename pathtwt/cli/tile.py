"""pathtwt tile: tissue tile coordinates of one slide -> coords HDF5 (+ thumbnail PNG)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELP = "find tissue on one slide (Otsu on a low-resolution level) and write the coordinates of the tiles with enough tissue to HDF5"


def add_arguments(parser: argparse.ArgumentParser) -> None:
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


def add_tissue_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of how tiles are chosen and the slide is opened (all but --mpp and
    --tile-size), shared with `pathtwt predict`."""
    from pathtwt.wsi.readers import names as reader_names
    from pathtwt.wsi.tiling import DEFAULT_MIN_TISSUE
    from pathtwt.wsi.tiling import TILING_DEFAULTS as D
    from pathtwt.wsi.tissue import TissueParams

    parser.add_argument(
        "--tissue",
        choices=("fraction", "otsu"),
        default=D.tissue,
        help="which tiles of the Otsu tissue mask are kept: those with a tissue fraction >= --min-tissue, whose "
        f"default is {DEFAULT_MIN_TISSUE['fraction']} for fraction (PANDA-style) and {DEFAULT_MIN_TISSUE['otsu']} "
        f"for otsu (CAMELYON-style) (default: {D.tissue})",
    )
    parser.add_argument(
        "--min-tissue", type=float, default=D.min_tissue,
        help=f"minimum tissue fraction of a kept tile (default {DEFAULT_MIN_TISSUE['fraction']} with --tissue "
        f"fraction, {DEFAULT_MIN_TISSUE['otsu']} with --tissue otsu); recorded in the coords file",
    )
    parser.add_argument(
        "--slide-mpp", type=float, default=None,
        help="level-0 um/px to use when the slide metadata has none (default: none; such a slide is an error)",
    )
    parser.add_argument(
        "--mask-mpp",
        type=float,
        default=TissueParams.mask_mpp,
        help=f"resolution of the tissue mask in um/px (default {TissueParams.mask_mpp})",
    )
    parser.add_argument(
        "--reader", choices=("auto", *reader_names()), default="auto",
        help="slide reader (default auto: JPEG/PNG images by the image reader, an OME-Zarr folder by its reader, other files OpenSlide, then tiffslide); recorded so extraction reopens it the same way",
    )
    parser.add_argument(
        "--channels", default=None, metavar="I,J,K",
        help="for fluorescence/multiplexed slides: the three channel indices shown as R, G, B "
        "(tissue is then found by intensity, not saturation; default: the slide's own RGB)",
    )
    parser.add_argument(
        "--modality", choices=("brightfield", "fluorescence"), default=None,
        help="default: fluorescence with --channels, else brightfield; fluorescence without --channels "
        "uses channels 0,1,2 (e.g. a fluorescence scan stored as RGB JPEG)",
    )
    parser.add_argument(
        "--allow-upsample", action="store_true",
        help="accept a --mpp finer than the slide's level 0 (tiles are stretched; recorded in the coords file)",
    )
    parser.add_argument(
        "--roi", default=None, metavar="GEOJSON",
        help="keep only the tiles whose centre lies in the file's areas (QuPath GeoJSON export, level-0 pixels) "
        "and outside its areas classed Ignore*/Exclude/Excluded/Exclusion/Background; recorded in the coords file "
        "(attrs roi_*, dataset roi) (default: the whole slide)",
    )


def run(args: argparse.Namespace) -> int:
    from pathtwt.errors import PathtwtError, SlideError

    for option, value in (("--out", args.out), ("--thumbnail", args.thumbnail)):
        if value and Path(value).is_dir():
            raise PathtwtError(f"{option} {value}: is a folder; give the file to write, e.g. {Path(value) / 'SLIDE.h5'}")
    try:
        tiling = write_tiles(args, args.slide, args.out, thumbnail=args.thumbnail)
    except SlideError as exc:
        if args.on_failure == "stop" or getattr(exc, "after_open", False):
            raise
        return _record_failed(args, str(exc))
    print(
        f"{args.slide}: {len(tiling.coords)} tiles of {args.tile_size} px at {args.mpp} um/px "
        f"(level-0 side {tiling.attrs['patch_size_level0']}, read level {tiling.attrs['read_level']}, "
        f"status {tiling.attrs['status']}) -> {args.out}"
    )
    return 0


def write_tiles(args: argparse.Namespace, slide_path, out, thumbnail=None):
    """Tile ``slide_path`` with the options in ``args`` (those of :func:`add_tissue_arguments`
    plus ``mpp`` and ``tile_size``) and write the coords file ``out`` (and ``thumbnail``);
    returns the :class:`~pathtwt.wsi.tiling.Tiling`. A slide that cannot be opened raises
    :class:`SlideError`; errors after it opened carry ``after_open``."""
    from pathtwt.errors import PathtwtError, SlideError
    from pathtwt.io.h5 import write_coords
    from pathtwt.wsi.slides import open_slide
    from pathtwt.wsi.thumbnail import write_thumbnail
    from pathtwt.wsi.tiling import UPSAMPLE_TOLERANCE, tile_slide
    from pathtwt.wsi.tissue import TissueParams

    if args.tile_size < 1 or args.mpp <= 0 or args.mask_mpp <= 0:
        raise PathtwtError("--tile-size, --mpp and --mask-mpp must be positive")
    channels = args.channels
    if args.modality == "fluorescence" and not channels:
        channels = "0,1,2"
    roi = None
    if args.roi:
        from pathtwt.wsi.roi import read_roi

        roi = read_roi(args.roi)  # a bad file is refused before the slide is read
    slide = open_slide(slide_path, mpp_fallback=args.slide_mpp, reader=args.reader, channel_map=channels)
    try:
        with slide:
            tiling = tile_slide(
                slide, target_mpp=args.mpp, tile_size=args.tile_size, tissue=args.tissue, min_tissue=args.min_tissue,
                params=TissueParams(mask_mpp=args.mask_mpp), modality=args.modality, allow_upsample=args.allow_upsample,
            )
    except SlideError as exc:
        exc.after_open = True  # a tiling error, not an unreadable slide: never recorded as failed
        raise
    if roi is not None:
        from pathtwt.wsi.roi import apply_roi, check_in_slide

        if tiling.attrs["status"] == "ok":
            tiling = apply_roi(tiling, roi, slide_path)
        else:  # no tissue tile to choose from; the file must still belong to this slide
            check_in_slide(roi, tiling.attrs["level0_width"], tiling.attrs["level0_height"], slide_path)
    if tiling.attrs["upsample_factor"] > UPSAMPLE_TOLERANCE:
        print(
            f"pathtwt tile: warning: {slide_path}: tiles upsampled {tiling.attrs['upsample_factor']:.2f}x "
            f"(level 0 is {tiling.attrs['level0_mpp']:.4g} um/px, target {args.mpp:g}); recorded in {out}",
            file=sys.stderr,
        )
    # Thumbnail first: the coords file is the output the workflow waits for, so it
    # appears last, once everything else has succeeded.
    if thumbnail:
        write_thumbnail(thumbnail, tiling, regions=roi.regions if roi is not None else ())
    texts = {"roi": json.dumps(roi.to_geojson())} if roi is not None else None
    write_coords(out, tiling.coords, tiling.tissue_fraction, tiling.attrs, texts=texts)
    return tiling


def _record_failed(args: argparse.Namespace, reason: str) -> int:
    """The coords file of a slide that cannot be read: no tiles, status "failed" and the
    reason, so the workflow goes on (the failures convention of `pathtwt extract`)."""
    import numpy as np

    from pathtwt.io.atomic import atomic_output
    from pathtwt.io.h5 import write_coords

    attrs = {
        "patch_size": int(args.tile_size), "patch_size_level0": 0, "target_mpp": float(args.mpp),
        "level0_mpp": float("nan"), "read_level": 0, "level0_width": 0, "level0_height": 0,
        "target_magnification": 0.0, "status": "failed", "slide_path": str(args.slide), "failure_reason": reason,
    }
    if args.thumbnail:  # a blank grey square: the workflow expects a thumbnail per slide
        from PIL import Image

        with atomic_output(args.thumbnail) as tmp:
            Image.new("RGB", (64, 64), (128, 128, 128)).save(tmp, format="PNG")
    write_coords(args.out, np.zeros((0, 2), np.int64), np.zeros(0, np.float32), attrs)
    print(f"pathtwt tile: warning: {args.slide}: recorded as failed ({reason}) -> {args.out}", file=sys.stderr)
    return 0
