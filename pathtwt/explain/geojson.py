"""QuPath GeoJSON of a slide's tissue, regions and scored tiles.

The format is QuPath's own (qupath-core ``qupath.lib.io.PathObjectTypeAdapters``, what
``File > Import objects from file`` reads and ``exportObjectsToGeoJson`` writes): a
``FeatureCollection`` of ``Feature``s, each with a ``geometry`` (Polygon) and
``properties``: ``objectType`` (``annotation`` for the tissue outline and ROI regions,
``tile`` for tiles), ``classification`` ``{"name", "color": [r, g, b]}``, ``measurements``
as an object of name -> number (QuPath 0.4+; 0.3 wrote a list of {name, value}), and an
``id`` that is a UUID (QuPath 0.4+). Coordinates are level-0 pixels with the origin at the
top left of the full-resolution image (qupath-docs, "Exporting annotations").

Tiles carry the measurements ``attention`` (the head's raw per-tile score) and
``attention_rank`` (its percentile rank within the slide, 0..1), and are classified as the
slide's predicted class (``class K``), coloured by class; the tissue annotations carry the
slide's class probabilities (``p0``, ``p1``, ...).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any, Iterable

import numpy as np

from pathtwt.explain.grid import rank_scores
from pathtwt.io.atomic import atomic_output

TISSUE = ("Tissue", [40, 180, 80])
# tab10, as matplotlib draws it: class K's colour
CLASS_COLOURS = [[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189],
                 [140, 86, 75], [227, 119, 194], [127, 127, 127], [188, 189, 34], [23, 190, 207]]


def class_name(k: int) -> str:
    return f"class {int(k)}"


def classification(name: str, colour: list[int]) -> dict[str, Any]:
    return {"name": name, "color": [int(c) for c in colour]}


def _closed(ring: np.ndarray) -> list[list[float]]:
    points = [[round(float(x), 2), round(float(y), 2)] for x, y in np.asarray(ring).reshape(-1, 2)]
    return points + [points[0]]


def _id(slide_id: str, kind: str, i: int) -> str:
    # stable across reruns, so a re-import replaces rather than duplicates in scripts that match ids
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"pathtwt:{slide_id}:{kind}:{i}"))


def polygon_feature(rings: Iterable[np.ndarray], *, object_type: str, name: str, colour: list[int], fid: str,
                    measurements: dict[str, float] | None = None) -> dict[str, Any]:
    props: dict[str, Any] = {"objectType": object_type, "classification": classification(name, colour)}
    if measurements:
        props["measurements"] = {k: float(v) for k, v in measurements.items()}
    return {"type": "Feature", "id": fid, "geometry": {"type": "Polygon", "coordinates": [_closed(r) for r in rings]},
            "properties": props}


def slide_features(
    slide_id: str, *, coords: np.ndarray, side: int, attention: np.ndarray, probs: np.ndarray,
    tissue: list[list[np.ndarray]] = (), regions: Iterable[Any] = (),
) -> list[dict[str, Any]]:
    """The features of one slide: tissue annotations, ROI region annotations (objects with
    ``rings``, ``classification``), then one tile object per tile."""
    probs = np.asarray(probs, dtype=np.float64)
    predicted = int(np.argmax(probs)) if len(probs) else 0
    slide_measurements = {f"p{c}": p for c, p in enumerate(probs)}
    features = [
        polygon_feature(rings, object_type="annotation", name=TISSUE[0], colour=TISSUE[1], fid=_id(slide_id, "tissue", i),
                        measurements=slide_measurements)
        for i, rings in enumerate(tissue)
    ]
    for i, region in enumerate(regions):
        name = region.classification or "Region*"
        features.append(polygon_feature(region.rings, object_type="annotation", name=name,
                                        colour=[120, 120, 120] if region.excluded else [0, 120, 255], fid=_id(slide_id, "roi", i)))
    ranks = rank_scores(attention)
    colour = CLASS_COLOURS[predicted % len(CLASS_COLOURS)]
    s = float(side)
    for i, ((x, y), a, r) in enumerate(zip(np.asarray(coords, dtype=np.float64), attention, ranks)):
        square = np.array([[x, y], [x + s, y], [x + s, y + s], [x, y + s]])
        features.append(polygon_feature([square], object_type="tile", name=class_name(predicted), colour=colour,
                                        fid=_id(slide_id, "tile", i),
                                        measurements={"attention": float(a), "attention_rank": float(r)}))
    return features


def write_geojson(path: str | os.PathLike, features: list[dict[str, Any]]) -> None:
    with atomic_output(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"type": "FeatureCollection", "features": features}, f, separators=(",", ":"))
