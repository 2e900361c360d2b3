"""The slides of an extraction job: what each is paired with, the checks before any of its
tiles is read, and what its features file says about it.

A job is a list of :class:`ExtractJob` (a slide, its coords file, the features file to
write), from the command line or a manifest. :func:`prepare_slide` checks a slide when the
job reaches it (coords geometry, the slide file, its fingerprint against the coords) and
works out its attributes and how its tiles are banded for the reading processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from pathtwt.devices import device_provenance
from pathtwt.errors import PathtwtError, SlideError
from pathtwt.io.h5 import GEOMETRY_ATTRS, read_coords, write_features
from pathtwt.models.embedding import DEFAULT_RECIPE, check_recipe, embedding_dim
from pathtwt.models.registry import Backbone
from pathtwt.wsi.coords_tiles import TileGeometry, check_geometry


@dataclass(frozen=True)
class ExtractJob:
    slide: Path
    coords: Path
    out: Path


@dataclass
class PreparedSlide:
    """A slide whose coords and slide file passed the checks: what its features file holds,
    and where its tiles lie for banding (:func:`pathtwt.features.reading.plan_bands`)."""

    job: ExtractJob
    xy: np.ndarray
    coords_attrs: dict[str, Any]
    attrs: dict[str, Any]
    geometry: TileGeometry
    band_rows: int = 0  # level pixels a band of batches spans (0: not a native level)
    level_ys: np.ndarray | None = None  # each tile's top row in read-level pixels

    @property
    def n(self) -> int:
        return len(self.xy)


def features_attrs(
    backbone: Backbone, coords_attrs: dict[str, Any], slide: Path, coords: Path, n: int,
    embedding: str = DEFAULT_RECIPE,
) -> dict[str, Any]:
    spec = backbone.spec
    # the tile geometry copied from the coords file into the features file
    attrs: dict[str, Any] = {k: coords_attrs[k] for k in GEOMETRY_ATTRS if k in coords_attrs}
    attrs.update(
        backbone=spec.name,
        encoder=spec.name,  # TRIDENT's and STAMP's word for the same thing
        base_backbone=spec.base_backbone or spec.name,
        weights_sha256=backbone.weights_sha256 or "",
        weights_source=backbone.source,
        embedding_recipe=check_recipe(embedding),
        embedding_dim=embedding_dim(spec.embed_dim, embedding),
        input_size=spec.input_size,
        **transform_attrs(backbone.transform),
        precision=backbone.precision,
        slide_path=str(slide),
        coords_path=str(coords),
        coords_status=str(coords_attrs.get("status", "")),
        n_tiles=int(n),
        status="ok",
    )
    # the device the forward passes ran on (a GPU claimed among several: which one), its
    # name and the torch build: device, gpu_name, torch_version, cuda_version, hip_version
    attrs.update(device_provenance(backbone.device))
    return attrs


def transform_attrs(transform: Any) -> dict[str, Any]:
    """The tile preprocessing, so a reader can reproduce the inputs the features came from."""
    describe = getattr(transform, "describe", None)
    return {f"transform_{k}": v for k, v in describe().items()} if describe else {}


def prepare_slide(job: ExtractJob, backbone: Backbone, embedding: str, force: bool,
                  precision_attrs: dict[str, Any] | None = None) -> PreparedSlide:
    """The checks before any tile is read (coords geometry, slide file, fingerprint) and
    the features file's attributes; a SlideError names what is wrong."""
    from pathtwt.wsi.formats import is_folder_slide

    slide, coords = job.slide, job.coords
    xy, _tissue, coords_attrs = read_coords(coords)
    check_geometry(coords, coords_attrs)
    folder_slide = is_folder_slide(slide)  # an OME-Zarr store is a folder that is one slide
    if slide.is_dir() and not folder_slide:
        raise SlideError(f"{slide}: is a folder, not a slide file (paired with {coords}); give the slide file itself")
    if not (slide.is_file() or folder_slide):
        raise SlideError(f"{slide}: slide file not found (named by {coords})")
    geometry = TileGeometry.from_attrs(coords, coords_attrs, slide_path=slide)
    attrs = features_attrs(backbone, coords_attrs, slide, coords, len(xy), embedding)
    prepared = PreparedSlide(job, xy, coords_attrs, attrs, geometry)
    if force:
        attrs["slide_check"] = "forced"
    else:
        with geometry.open() as opened:
            attrs["slide_check"] = _check_slide(opened, coords, coords_attrs)
            _band_geometry(prepared, opened)
    if precision_attrs:
        attrs.update(precision_attrs)
    return prepared


def _check_slide(opened: Any, coords: Path, coords_attrs: dict[str, Any]) -> str:
    from pathtwt.wsi.fingerprint import check_coords_belong_to_slide

    return check_coords_belong_to_slide(opened, coords, coords_attrs)


def _band_geometry(prepared: PreparedSlide, opened: Any) -> None:
    """How tall a band of the slide's batches is: BAND_NATIVE_ROWS rows of its read level's
    native tiles (:mod:`pathtwt.features.reading`)."""
    from pathtwt.features.reading import BAND_NATIVE_ROWS

    level = prepared.geometry.read_level
    native = opened.native_level(level) if level < opened.level_count else None
    if native is None or not len(prepared.xy):
        return
    prepared.band_rows = BAND_NATIVE_ROWS * int(native.tl)
    prepared.level_ys = (prepared.xy[:, 1] / float(opened.level_downsamples[level])).astype(np.int64)


def record_failed_slide(
    job: ExtractJob, backbone: Backbone, reason: str, failures: str | os.PathLike, embedding: str = DEFAULT_RECIPE
) -> dict[str, Any]:
    """Publish a features file that says the slide failed, and log it in ``failures``."""
    from pathtwt.io.failures import record_failure

    try:
        _xy, _tissue, coords_attrs = read_coords(job.coords)
    except PathtwtError:
        coords_attrs = {}
    attrs = features_attrs(backbone, coords_attrs, job.slide, job.coords, 0, embedding)
    attrs.update(status="failed", failure_reason=reason)
    dim = attrs["embedding_dim"]
    write_features(job.out, np.zeros((0, dim), np.float32), np.zeros((0, 2), np.int64), attrs)
    record_failure(failures, slide=job.slide.stem, stage="extract", reason=reason)
    return {"slide": str(job.slide), "out": str(job.out), "tiles": 0, "failed": reason}


def read_manifest(path: str | os.PathLike) -> list[ExtractJob]:
    """Tab-separated ``slide<TAB>coords<TAB>out`` lines; a header line and lines starting
    with '#' are ignored; relative paths are taken from the current directory."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise PathtwtError(f"{path}: cannot read the manifest ({exc.strerror})") from None
    jobs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if [f.strip().lower() for f in fields] == ["slide", "coords", "out"]:
            continue
        if len(fields) != 3:
            raise PathtwtError(f"{path}:{number}: expected 3 tab-separated fields slide, coords, out; got {len(fields)}")
        jobs.append(ExtractJob(*(Path(f.strip()) for f in fields)))
    return jobs


def jobs_from_lists(slides: Iterable[str], coords: Iterable[str], outs: Iterable[str]) -> list[ExtractJob]:
    slides, coords, outs = list(slides), list(coords), list(outs)
    if not (len(slides) == len(coords) == len(outs)):
        raise PathtwtError(
            f"give as many --coords ({len(coords)}) and --out ({len(outs)}) as slides ({len(slides)})"
        )
    return [ExtractJob(Path(s), Path(c), Path(o)) for s, c, o in zip(slides, coords, outs)]
