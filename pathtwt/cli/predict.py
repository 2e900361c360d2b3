"""pathtwt predict: new slides -> class probabilities of trained MIL heads, to one CSV.

Each slide is tiled (the tiling of the heads' training features unless given), embedded
with the backbone variant and scored by every run; the CSV holds per slide the mean of the
runs' probabilities, the predicted class, and each run's own probabilities.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from pathtwt.cli.options import (
    add_decode_argument, add_device_argument, add_extract_batch_argument, add_normalisation_arguments,
    add_precision_argument, add_progress_argument, add_workers_argument, backbone_help, backbone_request, show_progress,
)
# a folder given as SLIDE: its files (and OME-Zarr stores) of every slide format
from pathtwt.models.recipes import DEFAULT_RECIPE, RECIPES
from pathtwt.wsi.formats import SLIDE_SUFFIXES, is_folder_slide

HELP = ("tile, embed and classify new slides with a backbone variant and one or more trained MIL runs; "
        "writes slide_id, p<class> (mean over runs), predicted and each run's probabilities to a CSV")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pathtwt.cli.tiling_options import add_tissue_arguments

    parser.add_argument("slides", nargs="+", metavar="SLIDE", help="slide files, or folders of slides")
    parser.add_argument("--backbone", required=True, help=backbone_help())
    add_normalisation_arguments(parser)
    parser.add_argument("--weights", default=None, help="local weights file (default: the registry's or the variant folder's)")
    parser.add_argument("--random-init", action="store_true", help="the architecture with random weights (tests only)")
    parser.add_argument("--run", required=True, action="append", metavar="RUN_DIR",
                        help="a run folder of pathtwt train-mil (checkpoint.pt); repeat for several runs (seeds, folds)")
    parser.add_argument("--out", required=True, metavar="CSV", help="the predictions table to write")
    parser.add_argument("--features", default=None, metavar="DIR",
                        help="features folder: DIR/<slide_id>.h5 is reused when it exists and written when not "
                        "(default: a temporary folder, removed at the end)")
    parser.add_argument("--coords-dir", default=None, metavar="DIR",
                        help="where the coords files of newly tiled slides go (default: next to the features, in coords/)")
    parser.add_argument("--embedding", default=None, choices=RECIPES,
                        help="tile embedding (default: the one the runs were trained on, else cls+mean)")
    parser.add_argument("--mpp", type=float, default=None,
                        help="tile resolution in um/px (default: the runs' training features', else 0.5)")
    parser.add_argument("--tile-size", type=int, default=None,
                        help="tile side in pixels (default: the runs' training features', else 256)")
    add_tissue_arguments(parser)
    parser.set_defaults(roi=None)
    for action in parser._actions:
        if "--roi" in action.option_strings:  # here it may also name a folder, for several slides
            action.help = ("QuPath GeoJSON of the regions to tile (as pathtwt tile --roi), or a folder of "
                           "<slide_id>.geojson files, one per slide (a slide without one is tiled whole) (default: none)")
    add_extract_batch_argument(parser)
    add_precision_argument(parser)
    add_decode_argument(parser)
    add_device_argument(parser)
    add_workers_argument(parser, "tile-reading processes")
    add_progress_argument(parser)


def slide_list(specs: list[str]) -> dict[str, Path]:
    """slide_id -> file for files and folders (a folder: its files with a slide suffix)."""
    from pathtwt.errors import PathtwtError

    slides: dict[str, Path] = {}
    for spec in specs:
        path = Path(spec)
        if path.is_dir() and not is_folder_slide(path):  # a folder of slides, not one OME-Zarr slide
            found = [p for p in sorted(path.iterdir()) if p.suffix.lower() in SLIDE_SUFFIXES and not p.name.startswith(".")]
            if not found:
                raise PathtwtError(f"{path}: no slide files ({', '.join(SLIDE_SUFFIXES)}) in this folder")
        elif path.exists():
            found = [path]
        else:
            raise PathtwtError(f"{path}: slide file not found")
        for p in found:
            if p.stem in slides and slides[p.stem] != p:
                raise PathtwtError(f"{p} and {slides[p.stem]}: two slides with the id {p.stem!r}; rename one")
            slides[p.stem] = p
    from pathtwt.io.slide_ids import check_slide_ids

    # a slide's id names its features and coords files, and its row of the predictions
    check_slide_ids(list(slides), "the slides given", rows=[str(p) for p in slides.values()])
    return slides


def _common(heads, key: str):
    values = {h.provenance.get(key) for h in heads if h.provenance.get(key) not in (None, "")}
    return next(iter(values)) if len(values) == 1 else None


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import pandas as pd

    from pathtwt.devices import use_device
    from pathtwt.errors import PathtwtError
    from pathtwt.explain.runs import check_applicable, load_head
    from pathtwt.explain.scores import score_bag
    from pathtwt.io.atomic import atomic_output
    from pathtwt.io.h5 import read_features
    from pathtwt.cli.tiling_options import tile_request
    from pathtwt.wsi.tiling import TILING_DEFAULTS

    if Path(args.out).is_dir():
        raise PathtwtError(f"--out {args.out}: is a folder; give the CSV file to write, e.g. {Path(args.out) / 'predictions.csv'}")
    slides = slide_list(args.slides)
    device = use_device(args.device)
    heads = [load_head(r, device=device) for r in args.run]
    classes = {h.n_classes for h in heads}
    if len(classes) > 1:
        raise PathtwtError("--run: the runs predict different numbers of classes ("
                           + ", ".join(f"{h.run_dir}: {h.n_classes}" for h in heads) + "); give runs of one task")
    n_classes = classes.pop()
    # the tiling of the heads' training features unless given
    request = tile_request(args, mpp=args.mpp or _common(heads, "target_mpp") or TILING_DEFAULTS.target_mpp,
                           tile_size=args.tile_size or _common(heads, "patch_size") or TILING_DEFAULTS.tile_size)
    embedding = args.embedding or _common(heads, "embedding_recipe") or DEFAULT_RECIPE
    roi_dir = Path(args.roi) if args.roi and Path(args.roi).is_dir() else None
    if args.roi and roi_dir is None and len(slides) > 1:
        raise PathtwtError(f"--roi {args.roi}: one file for {len(slides)} slides; give a folder of <slide_id>.geojson files")

    with tempfile.TemporaryDirectory(prefix="pathtwt-predict-") as scratch:
        features_dir = Path(args.features) if args.features else Path(scratch) / "features"
        coords_dir = Path(args.coords_dir) if args.coords_dir else features_dir / "coords"
        todo = {s: p for s, p in slides.items() if not (features_dir / f"{s}.h5").is_file()}
        if todo:
            from pathtwt.features.backbone import load_backbone
            from pathtwt.models.recipes import embedding_dim

            backbone, autocast = load_backbone(backbone_request(args), device)
            # refuse a mismatched head before any slide is tiled or embedded
            for head in heads:
                check_applicable(head, dim=embedding_dim(backbone.spec.embed_dim, embedding), backbone=backbone.spec.name,
                                 weights_sha256=backbone.weights_sha256 or "", recipe=embedding,
                                 where=f"--backbone {args.backbone} with --embedding {embedding}")
            _tile_and_extract(args, request, todo, coords_dir, features_dir, backbone, autocast, embedding, roi_dir)
        rows = []
        for slide_id, path in slides.items():
            features_path = features_dir / f"{slide_id}.h5"
            features, _coords, attrs = read_features(features_path)
            if str(attrs.get("status", "ok")) != "ok" or len(features) == 0:
                raise PathtwtError(f"{path}: no tiles to classify ({features_path}: status {attrs.get('status', 'ok')}, "
                                   f"{len(features)} tiles); check its tissue detection (pathtwt tile --thumbnail)")
            per_run = []
            for head in heads:
                check_applicable(head, dim=features.shape[1], backbone=str(attrs.get("backbone", "")),
                                 weights_sha256=str(attrs.get("weights_sha256", "")),
                                 recipe=str(attrs.get("embedding_recipe", "")), where=str(features_path))
                per_run.append(score_bag(head, features).probs)
            mean = np.mean(per_run, axis=0)
            row = {"slide_id": slide_id, **{f"p{c}": mean[c] for c in range(n_classes)},
                   "predicted": int(np.argmax(mean)), "n_tiles": int(len(features))}
            for i, probs in enumerate(per_run, start=1):
                row.update({f"run{i}_p{c}": probs[c] for c in range(n_classes)})
            rows.append(row)
            print(f"{slide_id}: {len(features)} tiles, predicted class {row['predicted']} "
                  f"({', '.join(f'p{c} {mean[c]:.3f}' for c in range(n_classes))})")
    with atomic_output(args.out) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False, float_format="%.6g")
    for i, head in enumerate(heads, start=1):
        print(f"run{i}: {head.run_dir} ({head.aggregator})")
    print(f"{len(rows)} slide(s) -> {args.out}")
    return 0


def _tile_and_extract(args, request, todo, coords_dir, features_dir, backbone, autocast, embedding, roi_dir) -> None:
    """Tile the slides of ``todo`` (slide_id -> file) as ``request`` says (a slide's own
    regions of interest where ``roi_dir`` has them), then embed them together as `pathtwt
    extract` would (one bf16 check for the run, as there)."""
    from dataclasses import replace

    from pathtwt.errors import PathtwtError
    from pathtwt.features.extract import extract_many
    from pathtwt.features.jobs import ExtractJob
    from pathtwt.features.options import ExtractOptions
    from pathtwt.wsi.tile_job import write_tiles

    jobs = []
    for slide_id, slide_path in todo.items():
        slide_request = request
        if roi_dir is not None:
            roi = roi_dir / f"{slide_id}.geojson"
            slide_request = replace(request, roi=str(roi) if roi.is_file() else None)
            if slide_request.roi is None:
                print(f"pathtwt predict: {slide_id}: no {roi.name} in {roi_dir}; the whole slide is tiled", file=sys.stderr)
        coords = coords_dir / f"{slide_id}.h5"
        tiling = write_tiles(slide_request, slide_path, coords)
        if not len(tiling.coords):
            raise PathtwtError(f"{slide_path}: no tissue tile ({tiling.attrs['status']} at {request.mpp:g} um/px, "
                               f"{request.tile_size} px tiles); check it with pathtwt tile --thumbnail")
        jobs.append(ExtractJob(Path(slide_path), coords, features_dir / f"{slide_id}.h5"))
    extract_many(jobs, backbone, ExtractOptions(batch_size=args.batch_size, workers=args.workers, decode=args.decode,
                                                embedding=embedding, progress=show_progress(args),
                                                bf16_autocast=autocast))
