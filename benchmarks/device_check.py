"""One-command GPU measurement: forward, extraction and distillation throughput of H0-mini
and its TWT students, with peak memory and the fraction of the GPU's dense bf16 peak.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/device_check.py             # GPU: <= 8 min
    PYTHONPATH=$PWD .venv/bin/python benchmarks/device_check.py --cpu       # tiny models, < 3 min
    ... --json device_check.json                                            # the rows as JSON too

Needs nothing beyond the repository: the real slide CMU-1-Small-Region.svs comes from
.smoke_data/ (``benchmarks/gpu_smoke --prepare``) or ../shared; without either, or
without OpenSlide, the extraction rows say why and the run goes on. The budget
(``--budget-s``) stops new measurements; a measurement still running at
``--hard-limit-s`` (default: the budget + 90 s, at most 570 s) is stopped, so the run
fits a 10-minute slot. The JSON is rewritten after every phase. All weights are random: throughput does not
depend on them. Printed as one table, one row per measurement:

- ``forward``: tiles/s of the backbone forward alone (in-memory tensors, the tile
  embedding concat(CLS, mean patch) included) of H0-mini (12 layers) and of TWT-6 and
  TWT-4 students, each built as an exported student is: the plain timm ViT of the
  teacher's architecture at that depth. Every precision (fp32, bf16, fp16 on GPU; the
  model's weights cast, no autocast) and batch size, eager and under ``torch.compile``
  (compiled at one batch size, since each shape compiles anew; measured last, with what
  the time budget leaves).
- ``decode``: native tiles/s of each JPEG decoder alone over every native tile of the 20x
  mosaic: nvImageCodec (the hardware engines) and torchvision's nvJPEG (CUDA kernels)
  where they decode on this GPU (each checks itself when made: a row says why one
  cannot), on a CPU the host decoder, then libjpeg-turbo on one core for scale.
- ``extract``: steady-state tiles/s of pathtwt's own extraction (``extract_many``: a job
  of three copies of a slide less a job of one, after a warm-up; bf16 autocast with the
  weights cast once, as ``--precision auto`` runs it) on two mosaics of the real SVS
  written here (20x: copies side by side at 0.5 um/px; 40x: the same pixels at 0.25
  um/px, read as 448 px squares shrunk to 224), for the teacher and its TWT-6 student,
  with a GPU job's readers (the cores minus one) and CPU and GPU decode
  (``--decode cpu|gpu``), the GPU decode rows first; each row says what share of its own
  model-only rate (normalise and embed uint8 tiles already on the device, same precision)
  it reaches, the GPU's peak memory, the largest reading process's peak RSS, the
  precision the features files record (what ran), and the native tiles they record as
  decoded on the device and on the host and why any fell back ("not recorded" where a
  file says nothing). A device-path row that fell back is marked so and gives no rate.
  The mosaics are written within ``--mosaic-budget-s`` (fewer copies where a copy takes
  longer to write than planned).
- ``distill``: optimiser steps/s of TWT-5 against the H0-mini teacher in bf16 through
  ``pathtwt.compress.distill.distill`` (teacher forward + student forward and backward
  each step): with augmentation in the loader workers as a compress job runs it, and
  without (the compute alone; no target cache).

Columns: tiles/s, achieved TFLOP/s (2 x MACs of ``pathtwt.models.flops``; a training step
counts the teacher's forward and 3x the student's forward), the fraction of the GPU's
dense bf16 peak from :data:`DENSE_BF16_TFLOPS` ("unknown" for a GPU not listed, and on
CPU), the fraction of the bf16 matrix-multiply peak measured in this same run, and peak
memory (GPU: ``torch.cuda.max_memory_allocated`` of that measurement; CPU: the process's
peak RSS so far). A phase that fails (e.g. no compiler for ``torch.compile``) is a row
with its error, and the run goes on; phases that would overrun ``--budget-s`` are
skipped and say so. On a GPU the extraction phase runs first (its GPU decode rows before
its CPU ones), then matrix multiply, forward, distillation and compile; on a CPU as listed.
``--dry-run`` prints the rows it would measure, in order, as JSON, and touches no device.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import resource
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from pathtwt.bench.throughput import NOT_RECORDED, decode_record  # noqa: E402 - what the features files record
SHARED = Path(os.environ.get("PATHTWT_SHARED", REPO.parent / "shared"))
# the copy carried with the repository (benchmarks/gpu_smoke --prepare), else ../shared's
SMOKE_DATA = Path(os.environ.get("PATHTWT_SMOKE_DATA", REPO / ".smoke_data"))
SLIDE = next((p for p in (SMOKE_DATA / "slides" / "CMU-1-Small-Region.svs",
                          SHARED / "data" / "slides" / "CMU-1-Small-Region.svs") if p.is_file()),
             SHARED / "data" / "slides" / "CMU-1-Small-Region.svs")
# a 10-minute slot: the run stops a measurement that overruns the budget by this much
HARD_LIMIT_S = 570.0
# CMU-1-Small-Region: 2220 x 2967 px at 0.499 um/px, one level
SLIDE_W, SLIDE_H, SLIDE_MPP = 2220, 2967, 0.499

# Dense (no 2:4 sparsity) bf16 tensor throughput per torch device, TFLOP/s, from the
# vendors' datasheets at boost clock. Matched in order against torch's device name, so a
# more specific name comes first. An MI250X is two devices (GCDs) to torch; the figure
# is one GCD's, half the package's 383.
DENSE_BF16_TFLOPS: list[tuple[str, str, float]] = [
    ("h200 nvl", "H200 NVL", 835.0),
    ("h200", "H200 SXM", 989.4),
    ("h100 nvl", "H100 NVL", 835.0),
    ("h100 pcie", "H100 PCIe", 756.0),
    ("h100", "H100 SXM", 989.4),
    ("a100", "A100", 312.0),
    ("mi300x", "MI300X", 1307.4),
    ("mi250x", "MI250X (one GCD)", 191.5),
]


def known_peak(device_name: str) -> tuple[str, float | None]:
    """(label, dense bf16 TFLOP/s) of a torch device name; ("unknown", None) if not listed."""
    name = device_name.lower()
    for key, label, tflops in DENSE_BF16_TFLOPS:
        if key in name:
            return label, tflops
    return "unknown", None


@dataclass
class Settings:
    device: str
    backbone: str
    depths: list[int]
    precisions: list[str]
    batches: list[int]
    compile_batch: int | None  # None: no compiled rows
    compile_precisions: list[str]
    compile_depths: list[int]
    compile_backend: str
    workers: list[int]
    extract_depths: list[int]  # the teacher and the student the end-to-end rows compare
    decodes: list[str]  # cpu, gpu (pathtwt extract --decode), or host (the device path's stand-in on a CPU)
    mosaics: dict[str, tuple[int, int]]  # copies of the real slide, columns and rows, per mosaic
    extract_batch: int
    distill_batch: int
    distill_steps: tuple[int, int]  # steps of the short and the long run; rate from the difference
    distill_workers: int
    min_time_s: float  # each forward figure times at least this long
    mm_n: int
    budget_s: float
    mosaic_budget_s: float  # writing the mosaics: fewer copies where they would take longer


def settings_for(device: str, args: argparse.Namespace) -> Settings:
    gpu = device.startswith("cuda")
    cores = os.cpu_count() or 1
    s = Settings(
        device=device,
        backbone="h0-mini" if gpu else "h0-mini-tiny",
        depths=[12, 6, 4],
        precisions=["fp32", "bf16", "fp16"] if gpu else ["fp32", "bf16"],
        batches=[64, 128, 256, 512] if gpu else [8, 32],
        compile_batch=256 if gpu else 32,
        compile_precisions=["bf16", "fp16", "fp32"] if gpu else ["fp32"],
        # an inductor compile of the tiny 12-layer model takes over a minute on 2 busy cores
        compile_depths=[12, 6, 4] if gpu else [4],
        compile_backend=args.compile_backend,
        # a GPU job's default readers (the job's cores minus one), and one
        workers=[max(1, cores - 1)] if gpu else [1],
        extract_depths=[12, 6],
        # the device path first: its rows are what a short budget must not lose
        decodes=["gpu", "cpu"] if gpu else ["host", "cpu"],
        mosaics=dict(MOSAICS_GPU if gpu else MOSAICS_CPU),
        extract_batch=256 if gpu else 32,
        distill_batch=128 if gpu else 8,
        distill_steps=(3, 23) if gpu else (1, 3),
        distill_workers=min(8, max(1, cores - 1)) if gpu else 1,
        min_time_s=0.5 if gpu else 0.2,
        mm_n=8192 if gpu else 1024,
        budget_s=480.0 if gpu else 170.0,
        mosaic_budget_s=30.0 if gpu else 60.0,
    )
    for name in ("backbone", "budget_s", "mosaic_budget_s"):
        if getattr(args, name) is not None:
            setattr(s, name, getattr(args, name))
    if args.batch_sizes:
        s.batches = [int(b) for b in args.batch_sizes.split(",")]
    if args.precisions:
        s.precisions = args.precisions.split(",")
    if args.workers:
        s.workers = [int(w) for w in args.workers.split(",")]
    if args.decodes:
        s.decodes = args.decodes.split(",")
    if args.no_compile:
        s.compile_batch = None
    elif args.compile_batch is not None:
        s.compile_batch = args.compile_batch
    if args.compile_precisions:
        s.compile_precisions = args.compile_precisions.split(",")
    if args.mosaics:
        s.mosaics = {k: tuple(int(v) for v in c.split("x")) for k, c in (m.split("=") for m in args.mosaics.split(","))}
    return s


@dataclass
class Row:
    kind: str  # forward | decode | extract | distill | mm
    model: str
    precision: str
    batch: int | None
    compiled: bool = False
    workers: int | None = None
    tiles_per_s: float | None = None
    steps_per_s: float | None = None
    tflops: float | None = None
    frac_gpu_peak: float | str | None = None  # fraction of the listed dense bf16 peak, or "unknown"
    frac_mm_peak: float | None = None  # fraction of this run's measured bf16 matmul peak
    peak_mem_gib: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Run:
    """Holds the device, the clock budget and the rows measured so far."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.start = time.perf_counter()
        self.rows: list[Row] = []
        self.gpu = s.device.startswith("cuda")
        self.peak_label, self.peak_tflops = known_peak(torch.cuda.get_device_name(s.device) if self.gpu else "cpu")
        self.mm_bf16_tflops: float | None = None
        self.info: dict[str, Any] = {}  # what the JSON says besides the rows (the mosaics written)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def out_of_time(self, reserve_s: float = 0.0) -> bool:
        """Whether the budget stops the next measurement. The first one always runs: a
        run on a busy machine still measures something, whatever its budget."""
        if not any(r.note is None or not str(r.note).startswith("skipped") for r in self.rows):
            return False
        return self.elapsed() + reserve_s > self.s.budget_s

    def skipped(self, row: Row, reserve_s: float = 0.0) -> bool:
        """Add ``row`` as skipped when the budget stops it; whether it did."""
        if not self.out_of_time(reserve_s):
            return False
        row.note = f"{row.note}; skipped: time budget" if row.note else "skipped: time budget"
        self.add(row)
        return True

    def sync(self) -> None:
        if self.gpu:
            torch.cuda.synchronize(self.s.device)

    @contextlib.contextmanager
    def memory(self, row: Row):
        if self.gpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.s.device)
        try:
            yield
        finally:
            if self.gpu:
                row.peak_mem_gib = torch.cuda.max_memory_allocated(self.s.device) / 2**30
            else:
                row.peak_mem_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB

    def rate(self, row: Row, flops_per_tile: float | None) -> None:
        """Fill the FLOP columns of a row from its tiles/s."""
        if row.tiles_per_s is None or not flops_per_tile:
            return
        row.tflops = row.tiles_per_s * flops_per_tile / 1e12
        row.frac_gpu_peak = row.tflops / self.peak_tflops if self.peak_tflops else "unknown"
        if self.mm_bf16_tflops:
            row.frac_mm_peak = row.tflops / self.mm_bf16_tflops

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        print(format_row(row), flush=True)
        return row

    def timed(self, fn: Callable[[], Any], min_time_s: float | None = None) -> float:
        """Seconds per call (:func:`pathtwt.bench.timing.seconds_per_call`, the device synchronised)."""
        from pathtwt.bench.timing import seconds_per_call

        return seconds_per_call(fn, self.s.min_time_s if min_time_s is None else min_time_s, sync=self.sync)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def model_label(depth: int, full: int) -> str:
    return "teacher-12" if depth == full else f"twt-{depth}"


# the precisions of the matmul rows, in the order measured
MM_PRECISIONS = ("fp32", "bf16")


def measure_mm(run: Run) -> None:
    n = run.s.mm_n
    for precision in MM_PRECISIONS:
        dtype = DTYPES[precision]
        row = Row(kind="mm", model=f"torch.mm {n}x{n}", precision=precision, batch=None)
        try:
            with run.memory(row):
                a = torch.randn(n, n, device=run.s.device, dtype=dtype)
                b = torch.randn(n, n, device=run.s.device, dtype=dtype)
                sec = run.timed(lambda: torch.mm(a, b))
            row.tflops = 2 * n**3 / sec / 1e12
            row.frac_gpu_peak = row.tflops / run.peak_tflops if run.peak_tflops else "unknown"
            if precision == "bf16":
                run.mm_bf16_tflops = row.tflops
                row.frac_mm_peak = 1.0
        except Exception as exc:  # noqa: BLE001 - reported as a row, the run goes on
            row.note = _error(exc)
        run.add(row)


def forward_cases(s: Settings):
    """(depth, precision, batch) of each forward row, in the order measured."""
    for depth in s.depths:
        for precision in s.precisions:
            for batch in s.batches:
                yield depth, precision, batch


def measure_forward(run: Run) -> None:
    from pathtwt.models.embedding import embed_tiles
    from pathtwt.models.flops import count_macs
    from pathtwt.models.registry import build_timm_model, get_spec

    s = run.s
    spec = get_spec(s.backbone)
    size = spec.input_size
    made: dict = {}  # (depth, precision) -> (model, flops): the last one only
    for depth, precision, batch in forward_cases(s):
        if (depth, precision) not in made:
            made.clear()
            _free(run)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                base = build_timm_model(spec, depth=depth)
            made[(depth, precision)] = (_copy_to(base, s.device, DTYPES[precision]), 2.0 * count_macs(base))
        model, flops = made[(depth, precision)]
        row = Row(kind="forward", model=model_label(depth, spec.depth), precision=precision, batch=batch)
        if run.skipped(row):
            continue
        try:
            with run.memory(row):
                x = torch.randn(batch, 3, size, size, device=s.device, dtype=DTYPES[precision])

                def call(model=model, x=x):
                    with torch.inference_mode():
                        return embed_tiles(model, x, spec.num_prefix_tokens)

                row.tiles_per_s = batch / run.timed(call)
            run.rate(row, flops)
        except Exception as exc:  # noqa: BLE001
            row.note = _error(exc)
            _free(run)
        run.add(row)
    made.clear()
    _free(run)


def measure_compiled(run: Run) -> None:
    """The compiled rows, last: a compile takes a minute, so they take what the budget leaves
    after the eager, extraction and distillation rows."""
    from pathtwt.models.flops import count_macs
    from pathtwt.models.registry import build_timm_model, get_spec

    s = run.s
    if not s.compile_batch:
        return
    if not hasattr(torch, "compile"):
        run.add(Row(kind="forward", model="-", precision="-", batch=s.compile_batch, compiled=True,
                    note=f"skipped: torch {torch.__version__} has no torch.compile"))
        return
    spec = get_spec(s.backbone)
    for precision in s.compile_precisions:
        for depth in s.compile_depths:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                base = build_timm_model(spec, depth=depth)
            model = _copy_to(base, s.device, DTYPES[precision])
            run.add(_compiled_row(run, model, spec, model_label(depth, spec.depth), precision,
                                  2.0 * count_macs(base)))
            del model, base
            _free(run)


def _compiled_row(run: Run, model, spec, label: str, precision: str, flops: float) -> Row:
    from pathtwt.models.embedding import embed_tiles

    s = run.s
    batch = s.compile_batch
    row = Row(kind="forward", model=label, precision=precision, batch=batch, compiled=True)
    # an inductor compile of the 12-layer model takes a minute or more on a GPU host: keep
    # that in reserve so the last one still ends inside the budget
    if run.out_of_time(reserve_s=90.0 if run.gpu else 20.0):
        row.note = "skipped: time budget"
        return row
    try:
        torch._dynamo.reset()
        prefix = spec.num_prefix_tokens

        # the whole tile embedding is compiled (embed_tiles calls forward_features, which a
        # compiled module's __call__ would not cover)
        compiled = torch.compile(lambda x: embed_tiles(model, x, prefix), dynamic=False, backend=s.compile_backend)
        with run.memory(row):
            x = torch.randn(batch, 3, spec.input_size, spec.input_size, device=s.device, dtype=DTYPES[precision])

            def call():
                with torch.inference_mode():
                    return compiled(x)

            t0 = time.perf_counter()
            call()
            run.sync()
            row.extra["compile_s"] = round(time.perf_counter() - t0, 1)
            row.tiles_per_s = batch / run.timed(call)
        run.rate(row, flops)
        row.note = f"compile {row.extra['compile_s']} s ({s.compile_backend})"
    except Exception as exc:  # noqa: BLE001
        row.note = _error(exc)
    finally:
        torch._dynamo.reset()
        _free(run)
    return row


def _copy_to(model, device: str, dtype: torch.dtype):
    import copy

    out = copy.deepcopy(model).to(device=device, dtype=dtype).eval()
    for p in out.parameters():
        p.requires_grad_(False)
    return out


# the mosaics of the extraction rows: copies of the real slide side by side (columns, rows),
# written as pyramidal JPEG TIFFs on the machine that measures, so only the slide travels
MOSAICS_GPU = {"20x": (5, 4), "40x": (7, 6)}
MOSAICS_CPU = {"20x": (2, 1), "40x": (2, 2)}


def build_mosaics(run: Run, image: np.ndarray, folder: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """The mosaics and their coordinates within the mosaic budget (:func:`pathtwt.bench.mosaics.build_mosaics`)."""
    from pathtwt.bench.mosaics import build_mosaics as build

    mosaics, coords, facts = build(image, folder, run.s.mosaics, run.s.mosaic_budget_s,
                                   log=lambda line: print(f"device check: {line}", flush=True))
    run.info.update(facts)
    return mosaics, coords


def extract_cases(s: Settings):
    """(decode, depth, mosaic, workers) of each extraction row, in the order measured:
    every row of the device path (GPU decode) before any of the CPU path."""
    for decode in s.decodes:
        for depth in s.extract_depths:
            for mosaic in s.mosaics:
                for workers in s.workers:
                    yield decode, depth, mosaic, workers


def measure_extract(run: Run) -> None:
    """The data path on this machine, in steady state, on a 20x and a 40x mosaic of the
    real slide: each decoder alone, then the teacher and its TWT-6 student end to end (the
    job's readers, GPU and CPU decode) as shares of their own model-only rate in the same
    precision (bf16 autocast, weights cast once, as extraction runs)."""
    import dataclasses

    from pathtwt.models.flops import count_macs
    from pathtwt.models.registry import build_timm_model, create_backbone
    from pathtwt.wsi.slides import open_slide

    s = run.s
    if not SLIDE.is_file():
        run.add(Row(kind="extract", model="teacher-12", precision="bf16-autocast", batch=s.extract_batch,
                    note=f"skipped: {SLIDE} absent"))
        return
    with open_slide(SLIDE) as opened:
        image = opened.read_region(0, 0, 0, *opened.dimensions)
    teacher = create_backbone(s.backbone, pretrained=False, device=s.device, precision="fp32")
    models: dict[int, tuple] = {}  # depth -> (backbone, flops, model-only tiles/s)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        mosaics, coords = build_mosaics(run, image, tmp)
        measure_decoders(run, next(iter(mosaics.values())))
        for decode, depth, mosaic, workers in extract_cases(s):
            if depth not in models:
                # a student costs what the plain timm ViT of its depth costs: weights do not matter
                backbone = teacher if depth == teacher.spec.depth else dataclasses.replace(
                    teacher, model=build_timm_model(teacher.spec, depth=depth).to(s.device).eval())
                models[depth] = (backbone, 2.0 * count_macs(backbone.model),
                                 _model_only_rate(run, backbone, s.extract_batch))
            backbone, flops, model_only = models[depth]
            row = Row(kind="extract", model=model_label(depth, teacher.spec.depth), precision="bf16-autocast",
                      batch=s.extract_batch, workers=workers,
                      extra={"decode": decode, "mosaic": mosaic, "model_only_tiles_per_s": round(model_only, 3)})
            if run.skipped(row):
                continue
            try:
                with run.memory(row):
                    rate, record = _steady_rate(backbone, mosaics[mosaic], coords[mosaic], tmp, s, workers, decode)
                row.extra["readers_max_rss_gib"] = round(
                    resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 3)
                record_row(row, rate, record, model_only)
                run.rate(row, flops)
            except Exception as exc:  # noqa: BLE001
                row.note = _error(exc)
            run.add(row)
    del teacher, models
    _free(run)


def record_row(row: Row, rate: float, record: dict[str, Any], model_only: float) -> None:
    """Fill an extraction row from its steady rate and its features files' record: the
    precision that ran, the natives decoded where, and for a device-path row that fell
    back (a fallback reason, or natives decoded on the host) no rate, only the mark."""
    mosaic, decode = row.extra["mosaic"], row.extra["decode"]
    row.precision = record["precision"]
    row.extra.update(natives_device=record["natives_device"], natives_host=record["natives_host"],
                     fallback=record["fallback"])
    where = f"natives on device {record['natives_device']}, on host {record['natives_host']}"
    host = record["natives_host"]
    fell_back = decode != "cpu" and (record["fallback"] not in ("", NOT_RECORDED) or (isinstance(host, int) and host))
    if fell_back:
        row.extra["fell_back"] = True
        row.note = f"{mosaic}, decode {decode}: FELL BACK ({record['fallback'] or 'natives on the host'}); {where}"
        return
    row.tiles_per_s = rate
    row.extra["of_model_only"] = round(rate / model_only, 4)
    row.note = f"{mosaic}, decode {decode}, {row.extra['of_model_only']:.2f} of model-only; {where}"


def measure_decoders(run: Run, slide: Path) -> None:
    """Native tiles/s of each decoder alone over every native tile of the mosaic's level 0
    (:func:`pathtwt.bench.throughput.decoder_rates`): the GPU decoders installed here, or on
    a CPU the host decoder the device path falls back to; then libjpeg-turbo on one core."""
    from pathtwt.bench.throughput import decoder_rates

    if run.skipped(Row(kind="decode", model="decoders", precision="uint8", batch=256)):
        return
    with run.memory(Row(kind="decode", model="-", precision="uint8", batch=256)):
        found = decoder_rates(slide, run.s.device, on_gpu=run.gpu)
    for found_row in found:
        row = Row(kind="decode", model=found_row["name"], precision="uint8", batch=256,
                  tiles_per_s=found_row["tiles_per_s"], note=found_row["note"], extra=found_row["facts"])
        run.add(row)


def _model_only_rate(run: Run, backbone, batch: int) -> float:
    """tiles/s of the model alone in extraction's precision (bf16 autocast, weights cast once)."""
    from pathtwt.bench.throughput import model_only_rate

    return model_only_rate(backbone, batch, run.s.min_time_s, bf16_autocast=True)


def _steady_rate(backbone, slide: Path, coords: Path, tmp: Path, s: Settings, workers: int,
                 decode: str) -> tuple[float, dict[str, Any]]:
    """Steady-state tiles/s of extraction, a job of three copies less a job of one after a
    warm-up (:func:`pathtwt.bench.throughput.extraction_rate`), and its record."""
    from pathtwt.bench.throughput import extraction_rate

    options = dict(batch_size=s.extract_batch, workers=workers, bf16_autocast=True)
    if decode in ("cpu", "gpu"):
        options["decode"] = decode
    else:  # a decoder by name: the device path on any device (host: its stand-in on a CPU)
        options["gpu_decoder"] = decode
    return extraction_rate(backbone, slide, coords, tmp, **options)


def distill_cases(s: Settings):
    """(augment, loader workers, label) of each distillation row, in the order measured."""
    yield True, s.distill_workers, "augment in loader"
    yield False, 0, "no augment, compute"


def measure_distill(run: Run) -> None:
    from pathtwt.bench.timing import steady_state
    from pathtwt.compress.distill import DeepSupervision, DistillOptions, distill
    from pathtwt.compress.student import clone_layers, stitch_student
    from pathtwt.models.flops import count_macs
    from pathtwt.models.registry import create_backbone

    s = run.s
    teacher = create_backbone(s.backbone, pretrained=False, device=s.device, precision="fp32")
    size = teacher.spec.input_size
    tiles = _training_tiles(size, 256 if run.gpu else 32)
    n = len(teacher.model.blocks)
    depth = 5
    ends = [round((j + 1) * n / depth) for j in range(depth)]
    t_flops = 2.0 * count_macs(teacher.model)
    for augment, workers, label in distill_cases(s):
        row = Row(kind="distill", model="twt-5 vs teacher-12", precision="bf16-autocast", batch=s.distill_batch,
                  workers=workers, note=label)
        if run.skipped(row, reserve_s=30.0 if run.gpu else 5.0):
            continue
        try:
            made = {}

            def job(steps: int, augment=augment, workers=workers, row=row):
                made["student"] = stitch_student(teacher.model, clone_layers(teacher.model, [e - 1 for e in ends]),
                                                 spec=teacher.spec)
                opts = DistillOptions(steps=steps, batch_size=s.distill_batch, precision="bf16", device=s.device,
                                      workers=workers, augment=augment, progress=False, seed=0, loss_norm="none",
                                      cache_limit_bytes=0)  # the teacher runs every step, as with augmentation
                done = distill(made["student"], teacher.model, tiles, transform=teacher.transform,
                               objective=DeepSupervision(ends), options=opts)
                # what it trained in: bf16 asked for falls back to fp32 where its first step disagrees
                row.precision = "bf16-autocast" if done.precision == "bf16" else done.precision

            with run.memory(row):
                # the difference of two runs cancels the fixed cost (optimiser, loader start-up)
                steady = steady_state(job, *s.distill_steps, warmup=False, sync=run.sync)
            student = made["student"]
            row.steps_per_s = steady.rate()
            row.tiles_per_s = row.steps_per_s * s.distill_batch
            s_flops = 2.0 * count_macs(student)
            run.rate(row, t_flops + 3 * s_flops)
            row.extra["fixed_s"] = round(steady.fixed_s, 2)
        except Exception as exc:  # noqa: BLE001
            row.note = f"{label}; {_error(exc)}"
        run.add(row)
    del teacher
    _free(run)


def _training_tiles(size: int, n: int) -> np.ndarray:
    """uint8 tiles of the real slide at the model's input size (random ones without it)."""
    from pathtwt.errors import PathtwtError

    try:
        from pathtwt.wsi.slides import open_slide

        with open_slide(SLIDE) as slide:
            grid = [(x, y) for y in range(0, SLIDE_H - size + 1, size) for x in range(0, SLIDE_W - size + 1, size)]
            tiles = [slide.read_tile(x, y, size, 0, size) for x, y in grid[:n]]
        reps = -(-n // len(tiles))
        return np.stack((tiles * reps)[:n])
    except (ImportError, OSError, PathtwtError):  # no slide or no OpenSlide here: random tiles time the same
        return np.random.default_rng(0).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def _free(run: Run) -> None:
    import gc

    gc.collect()
    if run.gpu:
        torch.cuda.empty_cache()


def _error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"error: {type(exc).__name__}: {text[:160]}"


COLUMNS = [("kind", 8), ("model", 19), ("precision", 13), ("batch", 5), ("compiled", 8), ("workers", 7),
           ("tiles_per_s", 11), ("steps_per_s", 11), ("tflops", 8), ("frac_gpu_peak", 13), ("frac_mm_peak", 12),
           ("peak_mem_gib", 12), ("note", 0)]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def format_row(row: Row) -> str:
    d = asdict(row)
    return "  ".join(_cell(d[k]).ljust(w) if w else _cell(d[k]) for k, w in COLUMNS).rstrip()


def header() -> str:
    return "  ".join(k.ljust(w) if w else k for k, w in COLUMNS)


def machine(run: Run) -> dict[str, Any]:
    info: dict[str, Any] = {
        "device": torch.cuda.get_device_name(run.s.device) if run.gpu else (platform.processor() or platform.machine()),
        "gpu_peak_label": run.peak_label,
        "gpu_dense_bf16_tflops": run.peak_tflops,
        "torch": torch.__version__,
        "timm": _version("timm"),
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "driver": _driver(),
        "dev_shm": _shm(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "slide": str(SLIDE) if SLIDE.is_file() else "absent",
    }
    return info


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception as exc:  # noqa: BLE001
        return f"missing ({type(exc).__name__})"


def _driver() -> str:
    from pathtwt.devices import nvidia_driver_version

    return nvidia_driver_version() or "unknown"


def _shm() -> str:
    import shutil

    try:
        usage = shutil.disk_usage("/dev/shm")
        return f"{usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.1f}"
    except OSError as exc:
        return f"unavailable ({exc.strerror})"


class OutOfTime(Exception):
    """The hard limit passed: the measurement running then is stopped."""


def hard_limit(args: argparse.Namespace, s: Settings) -> float:
    """Seconds after which a measurement still running is stopped: --hard-limit-s, else the
    budget + 90 s, at most HARD_LIMIT_S."""
    return min(args.hard_limit_s or s.budget_s + 90.0, HARD_LIMIT_S)


def _arm_hard_limit(seconds: float) -> None:
    import signal

    def stop(_signum, _frame):
        raise OutOfTime(f"hard limit of {seconds:.0f} s passed")

    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, stop)
        signal.alarm(max(1, int(seconds)))


# the phases in the order they run. On a GPU the data path comes first, its GPU decode rows
# before its CPU ones (extract_cases): a short budget still measures what the GPU does
PHASES = {"mm": "measure_mm", "forward": "measure_forward", "extract": "measure_extract",
          "distill": "measure_distill", "compile": "measure_compiled"}  # looked up when run (tests replace them)
ORDER_GPU = ("extract", "mm", "forward", "distill", "compile")
ORDER_CPU = ("mm", "forward", "extract", "distill", "compile")


def plan(s: Settings, gpu: bool, skip: set[str] = frozenset()) -> list[dict[str, Any]]:
    """The rows a run of ``s`` measures, in order, as far as they are known before it
    runs (which GPU decoders can decode there is found when they are made)."""
    from pathtwt.models.registry import get_spec

    full = get_spec(s.backbone).depth
    rows: list[dict[str, Any]] = []
    for phase in (p for p in (ORDER_GPU if gpu else ORDER_CPU) if p not in skip):
        if phase == "mm":
            rows += [{"kind": "mm", "precision": p} for p in MM_PRECISIONS]
        elif phase == "forward":
            rows += [{"kind": "forward", "model": model_label(d, full), "precision": p, "batch": b}
                     for d, p, b in forward_cases(s)]
        elif phase == "extract":
            rows += [{"kind": "decode", "model": "each GPU decoder installed" if gpu else "host"},
                     {"kind": "decode", "model": "libjpeg-turbo, one core"}]
            rows += [{"kind": "extract", "model": model_label(d, full), "decode": dec, "mosaic": m, "workers": w,
                      "device_path": dec != "cpu"} for dec, d, m, w in extract_cases(s)]
        elif phase == "distill":
            rows += [{"kind": "distill", "model": "twt-5 vs teacher-12", "note": label}
                     for _augment, _workers, label in distill_cases(s)]
        elif phase == "compile" and s.compile_batch:
            rows += [{"kind": "forward", "compiled": True, "model": model_label(d, full), "precision": p}
                     for p in s.compile_precisions for d in s.compile_depths]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="CPU mode: tiny models, small settings (< 3 min)")
    ap.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    ap.add_argument("--backbone", default=None, help="registry name (default h0-mini; CPU mode h0-mini-tiny)")
    ap.add_argument("--batch-sizes", default=None)
    ap.add_argument("--precisions", default=None, help="comma list of fp32,bf16,fp16 (fp16 on GPU only)")
    ap.add_argument("--workers", default=None, help="extraction loader workers to try, comma list")
    ap.add_argument("--decodes", default=None, help="extraction decoders to try, comma list of cpu,gpu (host: the "
                    "device path with the host decoder, on a CPU)")
    ap.add_argument("--mosaics", default=None, help="copies of the slide per mosaic, e.g. 20x=2x1,40x=2x2")
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    ap.add_argument("--compile-batch", type=int, default=None)
    ap.add_argument("--compile-precisions", default=None)
    ap.add_argument("--compile-backend", default="inductor", help="torch.compile backend (eager: tracing only)")
    ap.add_argument("--threads", type=int, default=None, help="torch compute threads (default: torch's own)")
    ap.add_argument("--skip", default="", help="phases to leave out: comma list of mm,forward,extract,distill,compile")
    ap.add_argument("--budget-s", type=float, default=None, help="stop starting new measurements after this long")
    ap.add_argument("--hard-limit-s", type=float, default=None,
                    help=f"stop a measurement still running after this long (default budget + 90 s, at most {HARD_LIMIT_S:.0f})")
    ap.add_argument("--mosaic-budget-s", type=float, default=None,
                    help="seconds for writing the mosaics (default 30 on GPU, 60 on CPU): fewer copies where needed")
    ap.add_argument("--json", default=None, help="also write the rows and the machine as JSON to this file")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the rows the run would measure, in order, as JSON, and stop (touches no device)")
    args = ap.parse_args(argv)
    skip = {p for p in args.skip.split(",") if p}
    if args.dry_run:
        import json

        device = args.device or ("cpu" if args.cpu else "cuda")
        s = settings_for(device, args)
        print(json.dumps({"device": device, "settings": asdict(s), "hard_limit_s": hard_limit(args, s),
                          "rows": plan(s, device.startswith("cuda"), skip)}))
        return 0

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cpu" if args.cpu or not torch.cuda.is_available() else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {device}: torch sees no GPU (torch {torch.__version__}); use --cpu")
    s = settings_for(device, args)
    if "fp16" in s.precisions and not device.startswith("cuda"):
        ap.error("--precisions fp16 needs a GPU; on CPU use fp32,bf16")
    if device.startswith("cuda"):
        from pathtwt.models.precision import pin_fp32_matmul

        pin_fp32_matmul("ieee")  # fp32 rows measure fp32, not TF32, also after create_backbone
    run = Run(s)
    info = machine(run)
    # where it ran, first: a run that dies later still says so
    print(f"device check: {info['device']} (dense bf16 peak: {run.peak_label}"
          f"{'' if run.peak_tflops is None else f', {run.peak_tflops} TFLOP/s'}), torch {info['torch']}, "
          f"timm {info['timm']}, CUDA {info['cuda']}, ROCm {info['hip']}, driver {info['driver']}, "
          f"/dev/shm {info['dev_shm']}, slide {info['slide']}; backbone {s.backbone}, budget {s.budget_s:.0f} s",
          flush=True)
    print(header(), flush=True)
    _arm_hard_limit(hard_limit(args, s) - run.elapsed())
    try:
        for name in ORDER_GPU if run.gpu else ORDER_CPU:
            phase = globals()[PHASES[name]]
            if name in skip:
                continue
            try:
                phase(run)
            except Exception as exc:  # noqa: BLE001 - one phase failing (no OpenSlide, an old torch) ends only itself
                run.add(Row(kind=name, model="-", precision="-", batch=None, note=f"phase {_error(exc)}"))
                _free(run)
                if isinstance(exc, OutOfTime):
                    run.s.budget_s = 0.0  # every later measurement says "skipped: time budget"
            _write(args.json, info, s, run)
    finally:
        if hasattr(__import__("signal"), "SIGALRM"):
            __import__("signal").alarm(0)
    total = run.elapsed()
    print(f"device check done in {total:.0f} s", flush=True)
    _write(args.json, info, s, run)
    return 0


def _write(path: str | None, info: dict[str, Any], s: Settings, run: Run) -> None:
    if path:
        from pathtwt.io.atomic import write_json_atomic

        write_json_atomic(path, {"machine": info, "settings": asdict(s), "seconds": round(run.elapsed(), 1),
                                 **run.info, "rows": [asdict(r) for r in run.rows]})


if __name__ == "__main__":
    raise SystemExit(main())
