"""Frozen-backbone tile embeddings of slides, to features HDF5 files.

One extraction job embeds its slides with one loaded backbone. Its pieces, each a module:

- :mod:`pathtwt.features.jobs`: the slides (slide, coords file, features file), the checks
  before a slide's tiles are read, the features files' attributes;
- :mod:`pathtwt.features.reading`: forked reading processes that take bands of batches and
  ship each batch through a shared ring (:mod:`pathtwt.features.ring`), as finished tiles
  (the CPU path) or as the compressed native tiles under it and a cut plan (the GPU path);
- :mod:`pathtwt.features.device_tiles`: the tiles made on the model's device;
- :mod:`pathtwt.features.loop`: the embedding loop, and :mod:`pathtwt.features.sink` the
  writer thread.

How a job runs is one :class:`~pathtwt.features.options.ExtractOptions`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pathtwt.errors import NumericsError, PathtwtError, SlideError
from pathtwt.features.jobs import ExtractJob, prepare_slide, record_failed_slide
from pathtwt.features.options import ExtractOptions
from pathtwt.io.h5 import read_coords
from pathtwt.models.bf16_guard import BF16_CHECK_TILES, AutoPrecision, check_bf16_on
from pathtwt.models.registry import Backbone


def check_bf16(jobs: Sequence[ExtractJob], backbone: Backbone, batch_size: int) -> AutoPrecision:
    """bf16 autocast or fp32 for this run (:func:`pathtwt.models.bf16_guard.check_bf16_on`),
    decided on the first tiles of the first readable slide; the outcome goes to the
    features files' ``precision_check``."""
    from pathtwt.wsi.coords_tiles import CoordsTileReader, TileGeometry
    from pathtwt.wsi.formats import is_folder_slide

    for job in jobs:
        try:
            xy, _tissue, attrs = read_coords(job.coords)
            if not len(xy) or not (job.slide.is_file() or is_folder_slide(job.slide)):
                continue
            geometry = TileGeometry.from_attrs(job.coords, attrs, slide_path=job.slide)
            with CoordsTileReader(geometry, xy[: min(batch_size, BF16_CHECK_TILES)]) as reader:
                tiles = reader.read_many(np.arange(len(reader)))
        except Exception:  # noqa: BLE001 - an unreadable slide is reported by its own extraction
            continue
        x = backbone.transform.batch(tiles).to(backbone.device)
        return check_bf16_on(backbone.model, x, backbone.spec.num_prefix_tokens, where=job.slide.name, tool="extract")
    return AutoPrecision(bf16=False, note="fp32: no readable tiles to check bf16 autocast on")


def extract_many(jobs: Sequence[ExtractJob], backbone: Backbone, options: ExtractOptions | None = None,
                 **overrides: Any) -> list[dict[str, Any]]:
    """Extract several slides with one loaded backbone and one set of reading processes
    (``options``, or its fields given as keywords).

    Without ``options.failures`` the first slide that fails stops the run (SlideError /
    NumericsError). With it, a failing slide is recorded in that table (this run's own:
    the workflow gives every job its own and merges them per cohort) and gets a features
    file with no tiles, ``status`` "failed" and ``failure_reason``, so the workflow goes
    on and the MIL stage excludes or refuses it as configured; the other slides are
    extracted as usual. The table exists at the end even when nothing failed."""
    from pathtwt.features.decoding import Decoding, resolve_decode
    from pathtwt.features.loop import EmbedJob

    options = ExtractOptions.of(options, **overrides)
    summaries: dict[int, dict[str, Any]] = {}
    todo = [i for i, job in enumerate(jobs) if not (options.skip_existing and job.out.exists())]
    for i in sorted(set(range(len(jobs))) - set(todo)):
        summaries[i] = {"slide": str(jobs[i].slide), "out": str(jobs[i].out), "skipped": True}
    batch = options.resolved_batch_size(backbone.device)
    precision = check_bf16([jobs[i] for i in todo], backbone, batch) if options.bf16_autocast else AutoPrecision()
    precision_attrs = precision.attrs() if options.bf16_autocast else None
    # a decoder named in the options takes the device path on any device ("host": the stand-in)
    decoding = Decoding("gpu", options.gpu_decoder) if options.gpu_decoder else \
        resolve_decode(options.decode, backbone.device)

    def prepare(job: ExtractJob) -> Any:
        return prepare_slide(job, backbone, options.embedding, options.force, precision_attrs)

    def failed(i: int, exc: PathtwtError) -> None:
        if options.failures is None:
            raise exc
        summaries[i] = record_failed_slide(jobs[i], backbone, str(exc), options.failures, options.embedding)

    if todo:
        for k, outcome in EmbedJob([jobs[i] for i in todo], prepare, backbone, options, decoding, precision):
            if isinstance(outcome, (SlideError, NumericsError)):
                failed(todo[k], outcome)
            else:
                summaries[todo[k]] = outcome
    if options.failures is not None and not Path(options.failures).exists():
        from pathtwt.io.failures import write_failures

        write_failures(options.failures, [])
    return [summaries[i] for i in sorted(summaries)]


def extract_slide(slide: str | os.PathLike, coords: str | os.PathLike, out: str | os.PathLike, backbone: Backbone,
                  options: ExtractOptions | None = None, **overrides: Any) -> dict[str, Any]:
    """Embed every tile of ``slide`` listed in ``coords`` into ``out`` (written atomically).
    Returns a summary (tiles, seconds, tiles/s). The slide must be the one the coords were
    made from (its fingerprint, :mod:`pathtwt.wsi.fingerprint`) unless ``force``."""
    return extract_many([ExtractJob(Path(slide), Path(coords), Path(out))], backbone, options, **overrides)[0]
