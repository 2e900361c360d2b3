"""Frozen-backbone tile embeddings of slides, to features HDF5 files.

Tiles are read at the geometry stored in the coords file, a batch at a time
(``Slide.read_tiles``: each native tile under a batch decoded once) by DataLoader worker
processes, each with its own slide handles and one compute thread, so
reading and decoding overlap with the batched forward pass in the main process, which
keeps all the compute threads. One extraction job embeds its slides with one loaded
backbone and one DataLoader over all their tiles (:func:`extract_many`): the workers start
once per job and read the next slide while the last batches of one are embedded. Tiles
travel as uint8 and are normalised on the model's device.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from pathtwt.devices import device_provenance
from pathtwt.models.bf16_guard import BF16_CHECK_TILES, AutoPrecision, check_bf16_on
from pathtwt.models.registry import Backbone
from pathtwt.models.embedding import DEFAULT_RECIPE, check_recipe, embed_tiles, embedding_dim
from pathtwt.errors import NumericsError, PathtwtError, SlideError
from pathtwt.io.h5 import GEOMETRY_ATTRS, FeaturesWriter, read_coords, write_features
from pathtwt.wsi.decoding import resolve_decode, worker_context
from pathtwt.wsi.coords_tiles import CoordsTileReader, TileGeometry, check_geometry, cv2_pool_stopped, reader_worker_init


@dataclass(frozen=True)
class ExtractJob:
    slide: Path
    coords: Path
    out: Path


class TileDataset(torch.utils.data.Dataset):
    """Tile i of a slide -> (i, normalised tensor, error text or "").

    A tile that cannot be read is returned as zeros with the reason, and the main
    process raises one :class:`SlideError` naming the slide and the tile coordinates
    (an exception raised inside a worker would arrive wrapped in a multi-line traceback).
    """

    def __init__(self, slide_path: Path, coords: np.ndarray, geometry: dict[str, Any], transform: Any):
        # the coords file's own reader: the slide reopened exactly as it was tiled (same
        # reader, so read_level indexes its levels; same channel map; level-0 mpp fallback)
        self.reader = CoordsTileReader(TileGeometry.from_attrs(slide_path, geometry, slide_path=slide_path), coords)
        self.slide_path = Path(slide_path)
        self.coords = self.reader.coords
        self.transform = transform

    def __len__(self) -> int:
        return len(self.coords)

    def __getitem__(self, index: int):
        try:
            return index, self.transform(self.reader.read(index)), ""
        except Exception as exc:  # noqa: BLE001 - carried to the main process and raised there
            size = self.transform.input_size
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())
            return index, torch.zeros(3, size, size), reason


def default_workers(device: Any = "cpu") -> int:
    """Tile-reading processes when --workers is not given: the job's cores minus the main
    process; at most 4 on CPU, where the forward passes compute on the same cores, and no
    cap on a GPU, which embeds faster than a few readers read."""
    from pathtwt.devices import available_cores

    spare = available_cores() - 1
    return max(1, spare if str(device).startswith("cuda") else min(4, spare))


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


# on CPU, a job of at most this many batches of tiles is read in the embedding process (see _embed_slides)
IN_PROCESS_BATCHES = 2


def check_bf16(jobs: Sequence[ExtractJob], backbone: Backbone, batch_size: int) -> AutoPrecision:
    """bf16 autocast or fp32 for this run (:func:`pathtwt.models.bf16_guard.check_bf16_on`),
    decided on the first tiles of the first readable slide; the outcome goes to the
    features files' ``precision_check``."""
    from pathtwt.wsi.formats import is_folder_slide

    for job in jobs:
        try:
            xy, _tissue, attrs = read_coords(job.coords)
            if not len(xy) or not (job.slide.is_file() or is_folder_slide(job.slide)):
                continue
            dataset = TileDataset(job.slide, xy[: min(batch_size, BF16_CHECK_TILES)], attrs, backbone.transform)
            items = [dataset[i] for i in range(len(dataset))]
        except Exception:  # noqa: BLE001 - an unreadable slide is reported by its own extraction
            continue
        if any(err for _, _, err in items):
            continue
        x = torch.stack([t for _, t, _ in items]).to(backbone.device)
        return check_bf16_on(backbone.model, x, backbone.spec.num_prefix_tokens, where=job.slide.name, tool="extract")
    return AutoPrecision(bf16=False, note="fp32: no readable tiles to check bf16 autocast on")


def extract_slide(
    slide: str | os.PathLike,
    coords: str | os.PathLike,
    out: str | os.PathLike,
    backbone: Backbone,
    batch_size: int = 32,
    workers: int | None = None,
    progress: bool = True,
    embedding: str = DEFAULT_RECIPE,
    force: bool = False,
    auto_precision: AutoPrecision | None = None,
    decode: str = "cpu",
) -> dict[str, Any]:
    """Embed every tile of ``slide`` listed in ``coords`` into ``out`` (written atomically).
    Returns a summary (tiles, seconds, tiles/s). The slide must be the one the coords were
    made from (its fingerprint, :mod:`pathtwt.wsi.fingerprint`) unless ``force``."""
    job = ExtractJob(Path(slide), Path(coords), Path(out))
    prepared = prepare_slide(job, backbone, embedding, force, auto_precision)
    for _prepared, outcome in _embed_slides([prepared], backbone, batch_size, workers, progress, embedding,
                                             auto_precision, decode):
        if isinstance(outcome, Exception):
            raise outcome
        return outcome
    raise AssertionError("unreachable: one slide in, one outcome out")


@dataclass
class PreparedSlide:
    """A slide whose coords and slide file passed the checks: what its features file holds."""

    job: ExtractJob
    xy: np.ndarray
    coords_attrs: dict[str, Any]
    attrs: dict[str, Any]

    @property
    def n(self) -> int:
        return len(self.xy)


def prepare_slide(job: ExtractJob, backbone: Backbone, embedding: str, force: bool,
                  auto_precision: AutoPrecision | None) -> PreparedSlide:
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
    slide_check = "forced" if force else _check_slide(slide, coords, coords_attrs)
    attrs = features_attrs(backbone, coords_attrs, slide, coords, len(xy), embedding)
    attrs["slide_check"] = slide_check
    if auto_precision is not None:
        attrs.update(auto_precision.attrs())
    return PreparedSlide(job, xy, coords_attrs, attrs)


def _check_slide(slide: Path, coords: Path, coords_attrs: dict[str, Any]) -> str:
    from pathtwt.wsi.fingerprint import check_coords_belong_to_slide

    with TileGeometry.from_attrs(coords, coords_attrs, slide_path=slide).open() as opened:
        return check_coords_belong_to_slide(opened, coords, coords_attrs)


class JobTiles(torch.utils.data.Dataset):
    """Batch b of a job's slides -> (tile numbers (B,), uint8 tiles (B, S, S, 3) at the
    model's input size, error text or "", seconds spent reading). Tiles are numbered
    across the slides (slide j holds ``offsets[j]`` to ``offsets[j+1] - 1``) and a batch
    lies within one slide (:meth:`batches`). One dataset for every slide of a job, so one
    set of reading processes serves them all: a worker keeps the slide it read last open
    and opens the next on first use.

    A batch is read as few regions (:meth:`pathtwt.wsi.slides.Slide.read_tiles`: each
    native tile under it decoded once, the reader messages collected once) and leaves the
    worker as one uint8 array, a quarter of float32's bytes in shared memory and over PCIe;
    the model's normalisation runs on the device
    (:meth:`pathtwt.models.transform.TileTransform.normalise_batch`). A batch that cannot
    be read comes as zeros with the reason, and the main process raises one SlideError
    naming the slide and the region (an exception in a worker would arrive wrapped in a
    multi-line traceback)."""

    def __init__(self, slides: Sequence[PreparedSlide], transform: Any, decode: str = "cpu",
                 decode_device: str | None = None):
        # each slide reopened exactly as it was tiled (the coords file's own reader); with
        # the GPU decoder a reader also shrinks its tiles to the model's input, on the
        # device (INTER_AREA, as transform.resize shrinks: the same tiles); enlarging stays
        # with transform.resize
        self.readers = [
            CoordsTileReader(TileGeometry.from_attrs(p.job.coords, p.coords_attrs, slide_path=p.job.slide,
                                                     decode=decode), p.xy,
                             size=_shrunk_on_the_reader(decode, int(p.coords_attrs["patch_size"]), transform.input_size))
            for p in slides
        ]
        self.offsets = np.cumsum([0] + [len(r) for r in self.readers])
        self.transform = transform
        # where the GPU decoder runs in each reading process: the job's own GPU
        self.decode_device = str(decode_device) if decode == "gpu" and decode_device is not None else None
        self._open: int | None = None  # the reader whose slide this process holds open

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": None}

    def slide_of(self, k: int) -> int:
        return int(np.searchsorted(self.offsets, k, side="right") - 1)

    def batches(self, batch_size: int) -> list[list[int]]:
        """Batches of tile numbers, each within one slide, in order."""
        return [list(range(i, min(i + batch_size, int(end))))
                for start, end in zip(self.offsets[:-1], self.offsets[1:]) for i in range(int(start), int(end), batch_size)]

    def __getitem__(self, ks: Sequence[int]):
        began = time.perf_counter()
        ks = [int(k) for k in ks]
        j = self.slide_of(ks[0])
        if self._open is not None and self._open != j:
            self.readers[self._open].close()
        self._open = j
        index = torch.as_tensor(ks, dtype=torch.int64)
        size = self.transform.input_size
        try:
            tiles = self.readers[j].read_many(np.asarray(ks) - int(self.offsets[j]))
            batch = np.empty((len(ks), size, size, 3), np.uint8)
            for b, tile in enumerate(tiles):
                batch[b] = self.transform.resize(tile)
            return index, torch.from_numpy(batch), "", time.perf_counter() - began
        except Exception as exc:  # noqa: BLE001 - carried to the main process and raised there
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())
            return index, torch.zeros(len(ks), size, size, 3, dtype=torch.uint8), reason, time.perf_counter() - began

    def close(self) -> None:
        for reader in self.readers:
            reader.close()
        self._open = None


def _shrunk_on_the_reader(decode: str, patch_size: int, input_size: int) -> int | None:
    """The size a reading process resizes to itself: the model's input where the GPU
    decoder can shrink there, else None (transform.resize in the dataset)."""
    return int(input_size) if decode == "gpu" and patch_size > int(input_size) else None


@dataclass
class FeedTiming:
    """Who waited for whom in an extraction job.

    ``model_waited``: the share of wall time the embedding process spent blocked on the
    next batch of tiles (in the DataLoader's ``next``). ``readers_waited``: the share of
    the readers' time they were not reading, 1 - (seconds the workers spent reading
    batches, summed) / (workers x wall time): a reader that is not reading has a finished
    batch queued and waits for the model to take it (or is starting up). Read in the
    embedding process (no workers), reading is the model's wait and the readers never wait.
    """

    workers: int
    began: float = 0.0
    waited: float = 0.0  # seconds blocked in next()
    reading: float = 0.0  # seconds the readers spent reading the batches received

    def shares(self) -> dict[str, float]:
        wall = max(time.perf_counter() - self.began, 1e-9)
        model = min(1.0, self.waited / wall)
        readers = 0.0 if not self.workers else max(0.0, 1.0 - self.reading / (self.workers * wall))
        return {"model_waited_share": round(model, 4), "readers_waited_share": round(readers, 4)}

    def line(self) -> str:
        sh = self.shares()
        bound = "reading" if sh["model_waited_share"] > sh["readers_waited_share"] else "the model"
        return (f"extract: the model waited for tiles {sh['model_waited_share']:.0%} of the time, the "
                f"{self.workers or 'in-process'} reader(s) waited for the model {sh['readers_waited_share']:.0%}: "
                f"bound by {bound}")


def _embed_slides(
    prepared: Sequence[PreparedSlide], backbone: Backbone, batch_size: int, workers: int | None, progress: bool,
    embedding: str = DEFAULT_RECIPE, auto_precision: AutoPrecision | None = None, decode: str = "cpu",
):
    """(prepared slide, summary or the SlideError/NumericsError that stopped it) per slide,
    in order. One DataLoader reads the tiles of every slide, so its workers start once per
    job and read the next slide while the last batches of one are embedded."""
    from tqdm import tqdm

    decode = resolve_decode(decode, backbone.device)
    dataset = JobTiles(prepared, backbone.transform, decode, decode_device=backbone.device)
    batch_size = int(batch_size)
    batches = dataset.batches(batch_size)
    on_cuda = str(backbone.device).startswith("cuda")
    workers = default_workers(backbone.device) if workers is None else int(workers)
    if not on_cuda and len(dataset) <= IN_PROCESS_BATCHES * batch_size:
        # a reading process costs about 0.3 s to start (fork, reader set-up, first
        # transfer), more than reading a batch or two here (a few ms a tile) while the CPU
        # has nothing else to do: a job of a biopsy or two is read in this process
        workers = 0
    loader = torch.utils.data.DataLoader(
        dataset,
        sampler=batches,  # in order, each batch within one slide, read by one worker as one item
        batch_size=None,
        num_workers=workers,
        worker_init_fn=reader_worker_init if workers else None,
        multiprocessing_context=worker_context(decode, workers),
        prefetch_factor=4 if workers else None,
        pin_memory=on_cuda,
    )
    timing_job = FeedTiming(workers, began=time.perf_counter())
    model, prefix = backbone.model, backbone.spec.num_prefix_tokens
    per_slide = np.diff(dataset.offsets)
    bar = tqdm(total=len(dataset), unit="tile", disable=not progress, dynamic_ncols=True)
    try:
        with torch.inference_mode(), cv2_pool_stopped(workers > 0):
            stream = iter(loader) if batches else iter(())
            for j, slide in enumerate(prepared):
                bar.set_description(slide.job.slide.name)
                start, first = time.perf_counter(), int(dataset.offsets[j])
                timing = {"embed_seconds": 0.0}
                left = -(-int(per_slide[j]) // batch_size)  # this slide's batches still in the stream
                try:
                    with FeaturesWriter(slide.job.out, n_tiles=slide.n, dim=slide.attrs["embedding_dim"],
                                        attrs=slide.attrs) as writer:
                        writer.coords[...] = slide.xy
                        while left:
                            waited = time.perf_counter()
                            index, images, error, reading = next(stream)
                            timing_job.waited += time.perf_counter() - waited
                            timing_job.reading += reading
                            left -= 1
                            feats = _embed_batch(slide, index - first, images, error, backbone, model, prefix,
                                                 embedding, auto_precision, timing)
                            writer.features[int(index[0]) - first : int(index[-1]) - first + 1] = feats
                            bar.update(len(index))
                        seconds = time.perf_counter() - start
                        # measured throughput, summed per variant by pathtwt.features.throughput
                        writer.h5.attrs["extract_seconds"] = seconds
                        writer.h5.attrs["embed_seconds"] = timing["embed_seconds"]
                        # the CPU threads of the forward passes: a one-thread job (extract.threads
                        # 1, jobs side by side) embeds at a lower tiles/s than one with every core
                        writer.h5.attrs["torch_threads"] = torch.get_num_threads()
                        # who waited for whom, over the job so far (FeedTiming)
                        writer.h5.attrs.update(timing_job.shares())
                        writer.h5.attrs["reading_workers"] = workers
                except (SlideError, NumericsError) as exc:
                    for _ in range(left):  # the failed slide's remaining batches, already on their way
                        next(stream)
                    bar.update(int(per_slide[j]))
                    yield slide, exc
                    continue
                yield slide, {
                    "slide": str(slide.job.slide), "out": str(slide.job.out), "tiles": slide.n, "seconds": seconds,
                    "tiles_per_s": slide.n / max(seconds, 1e-9), "embed_seconds": timing["embed_seconds"],
                }
        if batches:  # the job's one line on who bounds it, beside the progress bar
            print(timing_job.line(), file=sys.stderr, flush=True)
    finally:
        bar.close()
        dataset.close()


def _embed_batch(slide: PreparedSlide, index: torch.Tensor, images: torch.Tensor, error: str,
                 backbone: Backbone, model: torch.nn.Module, prefix: int, embedding: str,
                 auto_precision: AutoPrecision | None, timing: dict[str, float]) -> np.ndarray:
    """Features (B, D) on the host of one batch of a slide's uint8 tiles; ``timing``
    accumulates the backbone's own time (normalisation and forward, without reading)."""
    if error:
        (x0, y0), (x1, y1) = slide.xy[int(index[0])], slide.xy[int(index[-1])]
        where = f"tile at level-0 (x={x0}, y={y0})" if len(index) == 1 else \
            f"tiles {int(index[0])}-{int(index[-1])} (level-0 x={x0}, y={y0} to x={x1}, y={y1})"
        raise SlideError(f"{slide.job.slide}: cannot read {where}: {error}")
    began = time.perf_counter()
    with (auto_precision or AutoPrecision()).context(backbone.device, model):
        inputs = backbone.transform.normalise_batch(images, backbone.device)
        feats = embed_tiles(model, inputs, prefix, embedding)
    finite = torch.isfinite(feats).all(dim=1)
    if not bool(finite.all()):
        x, y = slide.xy[int(index[int((~finite).nonzero()[0])])]
        raise NumericsError(
            f"{slide.job.slide}: NaN/inf features (first at tile x={x}, y={y}) with precision "
            f"{backbone.precision}; retry with --precision fp32 or check the weights"
        )
    host = feats.float().cpu().numpy()  # waits for the device, so the time is the forward's
    timing["embed_seconds"] += time.perf_counter() - began
    return host


def extract_many(
    jobs: Sequence[ExtractJob],
    backbone: Backbone,
    batch_size: int = 32,
    workers: int | None = None,
    progress: bool = True,
    skip_existing: bool = False,
    failures: str | os.PathLike | None = None,
    embedding: str = DEFAULT_RECIPE,
    force: bool = False,
    bf16_autocast: bool = False,
    decode: str = "cpu",
) -> list[dict[str, Any]]:
    """Extract several slides with one loaded backbone and one set of reading processes.

    Without ``failures`` the first slide that fails stops the run (SlideError /
    NumericsError). With it, a failing slide is recorded in that table (this run's own:
    the workflow gives every job its own and merges them per cohort) and gets a features
    file with no tiles, ``status`` "failed" and ``failure_reason``, so the workflow goes
    on and the MIL stage excludes or refuses it as configured; the other slides are
    extracted as usual. The table exists at the end even when nothing failed."""
    summaries: dict[int, dict[str, Any]] = {}
    todo = [i for i, job in enumerate(jobs) if not (skip_existing and job.out.exists())]
    for i in sorted(set(range(len(jobs))) - set(todo)):
        summaries[i] = {"slide": str(jobs[i].slide), "out": str(jobs[i].out), "skipped": True}
    auto = check_bf16([jobs[i] for i in todo], backbone, batch_size) if bf16_autocast else None

    def failed(i: int, exc: PathtwtError) -> None:
        if failures is None:
            raise exc
        summaries[i] = record_failed_slide(jobs[i], backbone, str(exc), failures, embedding)

    prepared, number = [], {}
    for i in todo:
        try:
            prepared.append(prepare_slide(jobs[i], backbone, embedding, force, auto))
            number[id(prepared[-1])] = i
        except (SlideError, NumericsError) as exc:
            failed(i, exc)
    if prepared:
        for slide, outcome in _embed_slides(prepared, backbone, batch_size, workers, progress, embedding, auto,
                                            decode):
            if isinstance(outcome, Exception):
                failed(number[id(slide)], outcome)
            else:
                summaries[number[id(slide)]] = outcome
    if failures is not None and not Path(failures).exists():
        from pathtwt.io.failures import write_failures

        write_failures(failures, [])
    return [summaries[i] for i in sorted(summaries)]


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
