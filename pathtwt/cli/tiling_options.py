"""The tiling options shared by ``pathtwt tile`` and ``pathtwt predict``: how tiles are
chosen and the slide is opened, and the :class:`~pathtwt.wsi.tile_job.TileRequest` they
make."""

from __future__ import annotations

import argparse
from typing import Any


def add_tissue_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of how tiles are chosen and the slide is opened (all but --mpp and
    --tile-size)."""
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


def tile_request(args: argparse.Namespace, **given: Any):
    """The :class:`~pathtwt.wsi.tile_job.TileRequest` of the parsed options; ``given``
    replaces some of them (``pathtwt predict``: the tiling of the heads' training features,
    a slide's own regions of interest)."""
    from pathtwt.wsi.tile_job import TileRequest

    options = dict(mpp=args.mpp, tile_size=args.tile_size, tissue=args.tissue, min_tissue=args.min_tissue,
                   slide_mpp=args.slide_mpp, mask_mpp=args.mask_mpp, reader=args.reader, channels=args.channels,
                   modality=args.modality, allow_upsample=args.allow_upsample, roi=args.roi)
    return TileRequest(**{**options, **given})
