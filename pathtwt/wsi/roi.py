"""Regions of interest drawn in QuPath (or any GeoJSON in level-0 pixels), and the tiles
they keep.

A ROI file is a GeoJSON FeatureCollection, a bare list of Features (QuPath's
``exportObjectsToGeoJson(objects, path)`` without "FEATURE_COLLECTION"), one Feature, or one
geometry. Coordinates are level-0 pixels with the origin at the top left of the
full-resolution image, QuPath's convention (qupath-docs, "Exporting annotations": "Units
and origin"). Only areas count: Polygon and MultiPolygon geometries (a GeometryCollection is
opened); points, lines and QuPath's non-annotation objects (``objectType`` tile, detection,
cell, tmaCore) are ignored, so a GeoJSON of ``pathtwt heatmap`` serves as a ROI through its
tissue annotations.

Each area is an *include* region unless its classification marks it *excluded*: the
QuPath class names ``Ignore*``, ``Exclude``, ``Excluded``, ``Exclusion`` and ``Background``
(case-insensitive; QuPath's trailing ``*`` is ignored, so ``Ignore`` matches too). Other
classes, ``Region*`` included (QuPath's class for "analyse inside this"), and unclassified
areas are include regions. The classification is read from ``properties.classification``
(``{"name": ...}`` since QuPath 0.2, or a plain string) or, failing that, ``properties.name``.

A tile is kept when its centre lies inside an include region (holes excluded) and not
inside an excluded region; a file with only excluded regions keeps every tile outside
them. The centre rule, not "whole tile inside", so that a region drawn around tissue at
a coarse zoom still keeps the tiles along its border that are mostly inside.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from pathtwt.errors import PathtwtError

# QuPath object types that are results, not drawn regions: left out of a ROI
OBJECTS_NOT_REGIONS = ("tile", "detection", "cell", "tmaCore")
EXCLUDED_CLASSES = ("ignore", "exclude", "excluded", "exclusion", "background")
POINTS_PER_CHUNK = 4096  # point-in-polygon tests per vectorised chunk: bounded memory


def is_excluded_class(name: str | None) -> bool:
    return bool(name) and name.strip().rstrip("*").strip().lower() in EXCLUDED_CLASSES


@dataclass(frozen=True)
class Region:
    """One polygon: ``rings[0]`` the exterior, the others holes, each (K, 2) float level-0 (x, y)."""

    rings: tuple[np.ndarray, ...]
    classification: str = ""
    excluded: bool = False

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        ring = self.rings[0]
        return float(ring[:, 0].min()), float(ring[:, 1].min()), float(ring[:, 0].max()), float(ring[:, 1].max())


@dataclass(frozen=True)
class Roi:
    path: Path
    regions: tuple[Region, ...]
    sha256: str = ""
    ignored: int = 0  # features that are not areas (points, lines)

    @property
    def include(self) -> list[Region]:
        return [r for r in self.regions if not r.excluded]

    @property
    def exclude(self) -> list[Region]:
        return [r for r in self.regions if r.excluded]

    def attrs(self, n_before: int) -> dict[str, Any]:
        """What the coords file records about the ROI that chose its tiles."""
        classes = sorted({r.classification or "(none)" for r in self.regions})
        return {
            "roi_path": os.fspath(self.path),
            "roi_sha256": self.sha256,
            "roi_include_regions": len(self.include),
            "roi_exclude_regions": len(self.exclude),
            "roi_classes": classes,
            "roi_rule": "tile centre inside an include region and outside every excluded region",
            "roi_tiles_before": int(n_before),
        }

    def to_geojson(self) -> dict[str, Any]:
        """The regions as a FeatureCollection (stored in the coords file)."""
        return {"type": "FeatureCollection", "features": [_region_feature(r) for r in self.regions]}


def _region_feature(region: Region) -> dict[str, Any]:
    props: dict[str, Any] = {"objectType": "annotation"}
    if region.classification:
        props["classification"] = {"name": region.classification}
    rings = [[[float(x), float(y)] for x, y in ring] + [[float(ring[0, 0]), float(ring[0, 1])]] for ring in region.rings]
    return {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": rings}, "properties": props}


def _classification(props: Any) -> str:
    if not isinstance(props, dict):
        return ""
    value = props.get("classification")
    if isinstance(value, dict):
        value = value.get("name")
    if not value:
        value = props.get("name")
    return str(value) if value else ""


def _ring(coords: Any, where: str) -> np.ndarray:
    try:
        ring = np.asarray(coords, dtype=np.float64)
    except (TypeError, ValueError):
        raise PathtwtError(f"{where}: a polygon ring is not a list of [x, y] points") from None
    if ring.ndim != 2 or ring.shape[1] < 2 or not np.isfinite(ring[:, :2]).all():
        raise PathtwtError(f"{where}: a polygon ring is not a list of finite [x, y] points")
    ring = ring[:, :2]
    if len(ring) > 1 and np.array_equal(ring[0], ring[-1]):
        ring = ring[:-1]
    if len(ring) < 3:
        raise PathtwtError(f"{where}: a polygon ring has fewer than 3 distinct points")
    return ring


def _polygons(geometry: Any, where: str) -> tuple[list[list[np.ndarray]], int]:
    """(polygons as lists of rings, count of non-area geometries) of one geometry."""
    if not isinstance(geometry, dict) or "type" not in geometry:
        raise PathtwtError(f"{where}: a feature has no geometry object with a 'type'")
    kind = geometry["type"]
    if kind == "Polygon":
        return [[_ring(r, where) for r in geometry.get("coordinates") or []]], 0
    if kind == "MultiPolygon":
        return [[_ring(r, where) for r in poly] for poly in geometry.get("coordinates") or []], 0
    if kind == "GeometryCollection":
        polys, other = [], 0
        for g in geometry.get("geometries") or []:
            p, o = _polygons(g, where)
            polys += p
            other += o
        return polys, other
    if kind in ("Point", "MultiPoint", "LineString", "MultiLineString"):
        return [], 1
    raise PathtwtError(f"{where}: unknown GeoJSON geometry type {kind!r}")


def _features(data: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        kind = data.get("type")
        if kind == "FeatureCollection":
            features = data.get("features")
            if not isinstance(features, list):
                raise PathtwtError(f"{where}: a FeatureCollection without a 'features' list")
            return features
        if kind == "Feature":
            return [data]
        if "coordinates" in data or kind == "GeometryCollection":
            return [{"type": "Feature", "geometry": data, "properties": {}}]
    raise PathtwtError(f"{where}: not GeoJSON (expected a FeatureCollection, a list of Features, a Feature or a geometry)")


def read_roi(path: str | os.PathLike) -> Roi:
    """The areas of a GeoJSON file; one-line errors for an unreadable, invalid or empty file."""
    from pathtwt.io.atomic import sha256_file

    path = Path(path)
    where = f"--roi {path}"
    if path.is_dir():
        raise PathtwtError(f"{where}: is a folder; give the slide's GeoJSON file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PathtwtError(f"{where}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PathtwtError(f"{where}: cannot read the file ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PathtwtError(f"{where}: invalid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); export it again from QuPath (File > Export objects as GeoJSON)") from None
    return parse_roi(data, path, sha256=sha256_file(path))


def parse_roi(data: Any, path: str | os.PathLike, sha256: str = "") -> Roi:
    """The areas of parsed GeoJSON ``data`` (``path`` names it in errors)."""
    where = f"--roi {path}"
    regions: list[Region] = []
    ignored = 0
    for feature in _features(data, where):
        if not isinstance(feature, dict):
            raise PathtwtError(f"{where}: a feature is not a JSON object")
        props = feature.get("properties") or {}
        if isinstance(props, dict) and props.get("objectType", "annotation") in OBJECTS_NOT_REGIONS:
            ignored += 1  # QuPath's detections and tiles (e.g. a `pathtwt heatmap` GeoJSON's tiles)
            continue
        name = _classification(props)
        polygons, other = _polygons(feature.get("geometry"), where)
        ignored += other
        for rings in polygons:
            if rings:
                regions.append(Region(rings=tuple(rings), classification=name, excluded=is_excluded_class(name)))
    if not regions:
        what = f" ({ignored} point/line/detection/tile objects only)" if ignored else ""
        raise PathtwtError(f"{where}: no polygon in the file{what}; draw or export area annotations (Polygon/MultiPolygon)")
    return Roi(path=Path(path), regions=tuple(regions), sha256=sha256, ignored=ignored)


def recorded_roi(coords_file: str | os.PathLike) -> Roi | None:
    """The ROI a coords file was tiled with (its ``roi`` dataset), or None."""
    import h5py

    with h5py.File(coords_file, "r") as h5:
        if "roi" not in h5:
            return None
        text = h5["roi"][()]
        path = h5.attrs.get("roi_path", "roi")
    text = text.decode() if isinstance(text, bytes) else str(text)
    path = path.decode() if isinstance(path, bytes) else str(path)
    return parse_roi(json.loads(text), path)


def check_in_slide(roi: Roi, width: int, height: int, slide: str | os.PathLike) -> None:
    """Refuse a ROI none of whose regions overlaps the slide's level-0 frame: it was drawn
    on another slide, or in another frame (e.g. a thumbnail's pixels)."""
    inside = [r for r in roi.regions if _overlaps(r.bounds, width, height)]
    if inside:
        return
    x0 = min(r.bounds[0] for r in roi.regions)
    y0 = min(r.bounds[1] for r in roi.regions)
    x1 = max(r.bounds[2] for r in roi.regions)
    y1 = max(r.bounds[3] for r in roi.regions)
    raise PathtwtError(
        f"--roi {roi.path}: all {len(roi.regions)} shapes lie outside slide {slide} ({width} x {height} level-0 px; "
        f"shapes span x {x0:.0f}..{x1:.0f}, y {y0:.0f}..{y1:.0f}): is it another slide's file, or not in level-0 pixels?"
    )


def _overlaps(bounds: tuple[float, float, float, float], width: int, height: int) -> bool:
    x0, y0, x1, y1 = bounds
    return x1 > 0 and y1 > 0 and x0 < width and y0 < height


def points_in_region(points: np.ndarray, region: Region) -> np.ndarray:
    """bool (N,): each (x, y) inside ``region`` (even-odd rule over its exterior and holes,
    so a point in a hole is outside). Vectorised ray casting in chunks of points."""
    points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    inside = np.zeros(len(points), dtype=bool)
    x0, y0, x1, y1 = region.bounds
    candidates = np.flatnonzero((points[:, 0] >= x0) & (points[:, 0] <= x1) & (points[:, 1] >= y0) & (points[:, 1] <= y1))
    for start in range(0, len(candidates), POINTS_PER_CHUNK):
        index = candidates[start : start + POINTS_PER_CHUNK]
        px, py = points[index, 0:1], points[index, 1:2]
        odd = np.zeros(len(index), dtype=bool)
        for ring in region.rings:
            ax, ay = ring[:, 0], ring[:, 1]
            bx, by = np.roll(ax, -1), np.roll(ay, -1)
            crosses = (ay > py) != (by > py)
            with np.errstate(divide="ignore", invalid="ignore"):
                x_at = ax + (py - ay) * (bx - ax) / (by - ay)
            odd ^= (crosses & (px < x_at)).sum(axis=1) % 2 == 1
        inside[index] = odd
    return inside


def points_in_roi(points: np.ndarray, roi: Roi) -> np.ndarray:
    """bool (N,): inside some include region (every point, when there is none) and outside
    every excluded region."""
    points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    keep = np.zeros(len(points), bool) if roi.include else np.ones(len(points), bool)
    for region in roi.include:
        keep |= points_in_region(points, region)
    for region in roi.exclude:
        keep &= ~points_in_region(points, region)
    return keep


def tiles_in_roi(coords: np.ndarray, patch_size_level0: int, roi: Roi) -> np.ndarray:
    """bool (N,): the tiles (level-0 top-left ``coords``) whose centre the ROI keeps."""
    centres = np.asarray(coords, dtype=np.float64).reshape(-1, 2) + patch_size_level0 / 2.0
    return points_in_roi(centres, roi)


def apply_roi(tiling: Any, roi: Roi, slide: str | os.PathLike) -> Any:
    """``tiling`` (:class:`pathtwt.wsi.tiling.Tiling`) with only the tiles the ROI keeps and
    the ROI recorded in its attrs; refuses a ROI outside the slide or one that keeps no tile."""
    attrs = tiling.attrs
    check_in_slide(roi, int(attrs["level0_width"]), int(attrs["level0_height"]), slide)
    keep = tiles_in_roi(tiling.coords, int(attrs["patch_size_level0"]), roi)
    if not keep.any():
        raise PathtwtError(
            f"--roi {roi.path}: keeps none of the {len(tiling.coords)} tissue tiles of {slide} (tile side "
            f"{attrs['patch_size_level0']} level-0 px; a tile is kept when its centre lies in an include region); "
            "draw larger regions, or check their classes (excluded: " + ", ".join(EXCLUDED_CLASSES) + ")"
        )
    new_attrs = {**attrs, **roi.attrs(len(tiling.coords))}
    return replace(tiling, coords=tiling.coords[keep], tissue_fraction=tiling.tissue_fraction[keep], attrs=new_attrs)


def mask_contours(mask: np.ndarray, downsample: tuple[float, float], level0_size: tuple[int, int],
                  min_points: int = 3) -> list[list[np.ndarray]]:
    """The outlines of a boolean mask as polygons in level-0 pixels, inside the slide's
    ``level0_size`` (the mask's last pixels may cover a padded edge): per connected region
    its exterior and its holes ((K, 2) float arrays), mask pixel (i, j) covering the level-0
    box from (j * downsample[0], i * downsample[1])."""
    contours, hierarchy = cv2.findContours(np.ascontiguousarray(mask, dtype=np.uint8), cv2.RETR_CCOMP, cv2.CHAIN_APPROX_SIMPLE)
    if hierarchy is None:
        return []
    scale = np.array(downsample, dtype=np.float64)
    outers: dict[int, list[np.ndarray]] = {}
    holes: list[tuple[int, np.ndarray]] = []
    for i, (contour, (_next, _prev, _child, parent)) in enumerate(zip(contours, hierarchy[0])):
        if len(contour) < min_points:
            continue
        # pixel centres to level-0 coordinates (half a mask pixel in from the box edge)
        ring = np.clip((contour[:, 0, :].astype(np.float64) + 0.5) * scale, 0, level0_size)
        if parent < 0:
            outers[i] = [ring]
        else:
            holes.append((int(parent), ring))
    for parent, ring in holes:
        if parent in outers:
            outers[parent].append(ring)
    return list(outers.values())
