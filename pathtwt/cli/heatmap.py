"""pathtwt heatmap: a trained head's attention over one slide (PNG overlay with a colour
bar, top/bottom-k tile montage, QuPath GeoJSON, optional pyramidal TIFF)."""

from __future__ import annotations

import argparse
import json

from pathtwt.cli.options import add_device_argument

HELP = ("draw a trained MIL head's attention over a slide at a chosen resolution: DIR/<slide_id>.heatmap.png, "
        "DIR/<slide_id>.top_tiles.png and DIR/<slide_id>.geojson (QuPath), optionally a pyramidal TIFF")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pathtwt.explain.heatmap import DEFAULT_ALPHA, DEFAULT_CMAP, DEFAULT_MPP, MAX_PIXELS
    from pathtwt.mil.heads import attention_names

    parser.add_argument("slide", metavar="SLIDE", help="the slide the coords file was made from")
    parser.add_argument("--coords", required=True, metavar="COORDS.h5", help="its coords file (pathtwt tile)")
    parser.add_argument("--features", required=True, metavar="FEATURES.h5", help="its features file (pathtwt extract)")
    parser.add_argument("--run", required=True, metavar="RUN_DIR",
                        help=f"a run folder of pathtwt train-mil (checkpoint.pt); an {' or '.join(attention_names())} head")
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder")
    parser.add_argument("--slide-id", default=None, help="name of the outputs (default: the features file's name)")
    parser.add_argument("--mpp", type=float, default=DEFAULT_MPP, help="resolution of the heatmap in um/px")
    parser.add_argument("--top-k", type=int, default=8, help="tiles of highest and of lowest attention in the montage")
    parser.add_argument("--tiff", action="store_true", help="also write DIR/<slide_id>.heatmap.tif, a tiled pyramidal TIFF of the overlay")
    parser.add_argument("--smooth", type=float, default=0.0, metavar="UM",
                        help="Gaussian smoothing of the scores, sigma in microns (0: one flat square per tile)")
    parser.add_argument("--scale", choices=("rank", "max"), default="rank",
                        help="colour scale: percentile rank of each tile within the slide, or attention / slide maximum")
    parser.add_argument("--cmap", default=DEFAULT_CMAP, help="matplotlib colour map")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="opacity of the overlay")
    parser.add_argument("--max-pixels", type=int, default=MAX_PIXELS, help="largest heatmap canvas accepted (pixels)")
    parser.add_argument("--no-tissue", action="store_true", help="leave the tissue outline out of the GeoJSON")
    add_device_argument(parser, default="cpu")


def run(args: argparse.Namespace) -> int:
    from pathtwt.devices import use_device
    from pathtwt.errors import PathtwtError
    from pathtwt.explain.runs import load_head
    from pathtwt.explain.slide import HeatmapOptions, explain_slide

    if not 0.0 <= args.alpha <= 1.0:
        raise PathtwtError(f"--alpha must lie in [0, 1], got {args.alpha}")
    if args.smooth < 0:
        raise PathtwtError(f"--smooth must be >= 0, got {args.smooth}")
    if args.slide_id is not None:  # it names the outputs: refused before anything is read
        from pathtwt.io.slide_ids import check_slide_ids

        check_slide_ids([args.slide_id], "--slide-id")
    head = load_head(args.run, device=use_device(args.device))
    options = HeatmapOptions(mpp=args.mpp, top_k=args.top_k, tiff=args.tiff, smooth_um=args.smooth, cmap=args.cmap,
                             scale=args.scale, alpha=args.alpha, max_pixels=args.max_pixels, tissue=not args.no_tissue)
    summary = explain_slide(args.slide, args.coords, args.features, head, args.out, options, slide_id=args.slide_id)
    print(json.dumps(summary))
    return 0
