"""Explain one slide with one trained head: its heatmap PNG (and optional pyramidal TIFF),
its top/bottom tiles and its QuPath GeoJSON, from the slide, its coords file and its
features file. Each output is written atomically; inputs are checked first, so a refused
slide leaves nothing behind."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pathtwt.errors import PathtwtError
from pathtwt.explain import geojson, heatmap
from pathtwt.explain.grid import scale_scores
from pathtwt.explain.montage import top_k_note, write_montage
from pathtwt.explain.runs import TrainedHead, check_applicable
from pathtwt.explain.scores import ATTRIBUTION, attention_for_heatmap
from pathtwt.io.h5 import read_coords, read_features
from pathtwt.io.slide_ids import check_slide_ids

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeatmapOptions:
    mpp: float = heatmap.DEFAULT_MPP
    top_k: int = 8
    tiff: bool = False
    smooth_um: float = 0.0
    cmap: str = heatmap.DEFAULT_CMAP
    scale: str = "rank"
    alpha: float = heatmap.DEFAULT_ALPHA
    max_pixels: int = heatmap.MAX_PIXELS
    tissue: bool = True  # tissue outline annotations in the GeoJSON


def output_paths(out_dir: str | os.PathLike, slide_id: str, tiff: bool = False) -> dict[str, Path]:
    out = Path(out_dir)
    paths = {"heatmap": out / f"{slide_id}.heatmap.png", "top_tiles": out / f"{slide_id}.top_tiles.png",
             "geojson": out / f"{slide_id}.geojson"}
    if tiff:
        paths["tiff"] = out / f"{slide_id}.heatmap.tif"
    return paths


def load_checked(coords_path: str | os.PathLike, features_path: str | os.PathLike, head: TrainedHead):
    """(coords, features, coords attrs, features attrs), refusing mismatched or empty inputs."""
    coords, _tissue, coords_attrs = read_coords(coords_path)
    features, feat_coords, feat_attrs = read_features(features_path)
    if str(feat_attrs.get("status", "ok")) != "ok" or len(features) == 0:
        raise PathtwtError(f"{features_path}: no features to explain (status {feat_attrs.get('status', 'ok')}, "
                           f"{len(features)} tiles)")
    if feat_coords.shape != coords.shape or not np.array_equal(feat_coords, coords):
        raise PathtwtError(f"{features_path} and {coords_path} list different tiles ({len(feat_coords)} vs {len(coords)}); "
                           "give the coords file the features were extracted from")
    check_applicable(head, dim=features.shape[1], backbone=str(feat_attrs.get("backbone", "")),
                     weights_sha256=str(feat_attrs.get("weights_sha256", "")),
                     recipe=str(feat_attrs.get("embedding_recipe", "")), where=str(features_path))
    return coords, features, coords_attrs, feat_attrs


def explain_slide(
    slide_path: str | os.PathLike, coords_path: str | os.PathLike, features_path: str | os.PathLike,
    head: TrainedHead, out_dir: str | os.PathLike, options: HeatmapOptions = HeatmapOptions(),
    slide_id: str | None = None,
) -> dict[str, Any]:
    from pathtwt.wsi.coords_tiles import TileGeometry
    from pathtwt.wsi.fingerprint import check_coords_belong_to_slide
    from pathtwt.wsi.roi import mask_contours, recorded_roi
    from pathtwt.wsi.tissue import TissueParams, detect_tissue

    slide_id = slide_id or Path(features_path).stem
    check_slide_ids([slide_id], "--slide-id" if slide_id != Path(features_path).stem else features_path)
    coords, features, coords_attrs, _ = load_checked(coords_path, features_path, head)
    if options.top_k < 1:
        raise PathtwtError(f"--top-k must be >= 1, got {options.top_k}")
    scores = attention_for_heatmap(head, features)
    side = int(coords_attrs["patch_size_level0"])
    geometry = TileGeometry.from_attrs(coords_path, coords_attrs, slide_path=slide_path)
    paths = output_paths(out_dir, slide_id, options.tiff)
    with geometry.open() as slide:
        # the slide must be the one the coords (and so the features) were made from
        check_coords_belong_to_slide(slide, coords_path, coords_attrs)
        canvas = heatmap.canvas_for(slide.dimensions, slide.mpp, options.mpp, options.max_pixels, where=str(slide_path))
        table = heatmap.colour_table(options.cmap)
        image = heatmap.read_background(slide, canvas)
        values = scale_scores(scores.attention, options.scale)
        heatmap.blend(image, heatmap.score_layer(canvas, coords, values, side, options.smooth_um), table, options.alpha)
        tissue = []
        if options.tissue:
            mask = detect_tissue(slide, TissueParams(mask_mpp=float(coords_attrs.get("mask_mpp") or TissueParams.mask_mpp)),
                                 coords_attrs.get("modality") or None)
            tissue = mask_contours(mask.mask, mask.downsample, slide.dimensions)
    if options.tiff:
        from pathtwt.explain.tiff import write_pyramid_tiff

        write_pyramid_tiff(paths["tiff"], image, canvas.mpp)
    lines = [slide_id, f"{head.aggregator} head: predicted class {scores.predicted}",
             *heatmap.probability_lines(scores.probs), f"{len(coords)} tiles, drawn at {canvas.mpp:g} um/px",
             *heatmap.attention_range_lines(scores.attention, options.scale)]
    heatmap.write_png(paths["heatmap"], heatmap.compose(image, lines, options.cmap, options.scale))
    del image
    note = top_k_note(options.top_k, len(coords))
    if note:
        log.info("%s: %s", slide_id, note)
    write_montage(paths["top_tiles"], slide_path=slide_path, coords_file=coords_path, coords_attrs=coords_attrs,
                  coords=coords, scores=scores.attention, k=options.top_k,
                  title=f"{slide_id}: highest (top row) and lowest (bottom row) attention, predicted class "
                  f"{scores.predicted}\n{ATTRIBUTION[head.aggregator]}")
    roi = recorded_roi(coords_path)
    features_out = geojson.slide_features(slide_id, coords=coords, side=side, attention=scores.attention,
                                          probs=scores.probs, tissue=tissue, regions=roi.regions if roi else ())
    geojson.write_geojson(paths["geojson"], features_out)
    return {"slide_id": slide_id, "tiles": int(len(coords)), "predicted": scores.predicted,
            "probs": [float(p) for p in scores.probs], "mpp": canvas.mpp,
            "canvas": [canvas.width, canvas.height], "legend": lines, "top_k_note": note,
            **{k: str(v) for k, v in paths.items()}}
