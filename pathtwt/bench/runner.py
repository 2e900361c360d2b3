"""``pathtwt bench``: how fast each backbone and its students go on this machine.

In order, each row written as soon as it is measured (:class:`pathtwt.bench.results.ResultsFile`):

1. ``model``: tiles/s of each variant alone on uint8 tiles already on the device, in the
   precision a job runs (``--precision``), at each batch size until one does not fit;
2. ``decode``: each JPEG decoder alone on the 20x mosaic's native tiles;
3. ``readers``: the job's readers alone (extraction with a model that costs nothing) at
   20x and 40x;
4. ``end-to-end``: extraction of each variant on the 20x and 40x mosaics of a real slide
   (or a generated one), with the readers and decoder a job would use, in steady state;
   each says whether reading or the model bounds it and, for a student, its speed-up over
   its teacher beside its MAC ratio, and whether it reaches 0.8 of that ratio.

A slide that cannot be read is one line; the model-only rows are measured first, so they
stand whatever the slide does.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pathtwt.errors import PathtwtError

# the project's GPU goal: a student end to end at least this share of its MAC ratio faster than its teacher
GOAL_SHARE = 0.8
# the generated slide's side, in pixels at 0.5 um/px, where no real slide is given or found
GENERATED_SIDE = 2048


@dataclass
class BenchSettings:
    device: str
    backbones: dict[str, list[str]]  # backbone -> its variants, in order
    config_variants: dict[str, Any]
    weights: str | None
    precision: str  # the --precision request
    batches: list[int]
    e2e_batch: int
    e2e_tiles: int | None  # tiles a mosaic copy keeps (None: all)
    mosaics: dict[str, tuple[int, int]]
    mosaic_budget_s: float
    workers: int | None
    decode: str
    min_time_s: float
    timing: dict[str, int]  # seconds_per_call's warmup, rounds, min_calls
    steady: tuple[int, int, bool]  # copies of the small and the large job, and a warm-up job first
    slide: Path | None


def cpu_defaults() -> dict[str, Any]:
    """Small enough to finish within 3 minutes on 2 cores: ViT-S/14 and its 6-layer
    student, one batch size, short timing windows, 24 tiles a mosaic copy (three batches:
    a job of one copy already starts its reading processes, as a long one does)."""
    return dict(backbones={"vit-s14-imgfocus": ["uncompressed", "twt-6"]}, batches=[8], e2e_batch=8, e2e_tiles=24,
                mosaics={"20x": (1, 1), "40x": (1, 1)}, mosaic_budget_s=30.0, min_time_s=0.5,
                timing={"warmup": 1, "rounds": 1, "min_calls": 2}, steady=(1, 2, False))


def gpu_defaults() -> dict[str, Any]:
    return dict(backbones={"h0-mini": ["uncompressed", "twt-6", "twt-4"]}, batches=[64, 128, 256, 512], e2e_batch=256,
                e2e_tiles=None, mosaics={"20x": (5, 4), "40x": (7, 6)}, mosaic_budget_s=30.0, min_time_s=0.5,
                timing={"warmup": 2, "rounds": 2, "min_calls": 3}, steady=(1, 3, True))


@dataclass
class BenchRow:
    backbone: str
    variant: str
    kind: str  # model | decode | readers | end-to-end
    tiles_per_s: float | None = None
    mosaic: str | None = None
    batch: int | None = None
    precision: str | None = None
    gmacs: float | None = None  # per tile (pathtwt.models.flops.count_macs)
    mac_ratio: float | None = None  # the teacher's MACs over this variant's
    speedup: float | None = None  # end to end, over the teacher at the same mosaic
    reaches_goal: bool | None = None  # speedup >= GOAL_SHARE x mac_ratio
    bound: str | None = None  # reading | model
    peak_mem_gib: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Measured:
    """One variant ready to measure: its backbone (shared transform), MACs, and rates so far."""

    variant: Any
    backbone: Any
    macs: int
    model_rate: float | None = None  # at the end-to-end batch (or the largest that fit)
    e2e: dict[str, float] = field(default_factory=dict)  # mosaic -> tiles/s


def _variant_backbone(teacher, depth: int | None):
    """The teacher, or the plain ViT of its architecture at ``depth`` with the teacher's
    transform, device and precision (weights random: throughput does not depend on them)."""
    import torch

    from pathtwt.models.registry import build_timm_model

    if depth is None:
        return teacher
    dtype = next(teacher.model.parameters()).dtype
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_timm_model(teacher.spec, depth=depth).to(device=teacher.device, dtype=dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return dataclasses.replace(teacher, model=model)


def load_variants(s: BenchSettings, backbone: str) -> tuple[Any, list[Measured]]:
    from pathtwt.bench.variants import parse_variant
    from pathtwt.models.flops import count_macs
    from pathtwt.models.registry import create_backbone, get_spec

    depth = get_spec(backbone).depth
    variants = [parse_variant(v, depth, s.config_variants) for v in s.backbones[backbone]]
    teacher = create_backbone(backbone, weights=s.weights, pretrained=s.weights is not None, device=s.device,
                              precision=s.precision)
    measured = []
    for v in variants:
        b = _variant_backbone(teacher, v.depth)
        measured.append(Measured(v, b, count_macs(b.model)))
    return teacher, measured


def precision_label(backbone) -> str:
    return "bf16-autocast" if backbone.bf16_autocast else backbone.precision


def measure_model_only(s: BenchSettings, name: str, m: Measured, teacher_macs: int,
                       add: Callable[[BenchRow], None]) -> None:
    """Model-only rows at each batch size, ascending, until one does not fit the device."""
    from pathtwt.bench.throughput import model_only_rate, peak_memory_gib, reset_peak_memory
    from pathtwt.out_of_memory import is_out_of_memory

    for batch in s.batches:
        row = BenchRow(name, m.variant.name, "model", batch=batch, precision=precision_label(m.backbone),
                       gmacs=round(m.macs / 1e9, 3), mac_ratio=round(teacher_macs / m.macs, 3))
        reset_peak_memory(s.device)
        try:
            row.tiles_per_s = model_only_rate(m.backbone, batch, s.min_time_s, **s.timing)
        except RuntimeError as exc:
            if not is_out_of_memory(exc):
                raise
            row.note = f"batch {batch} does not fit: larger ones not tried"
            add(row)
            break
        row.peak_mem_gib = round(peak_memory_gib(s.device), 3)
        if batch <= s.e2e_batch or m.model_rate is None:
            m.model_rate = row.tiles_per_s
        add(row)


def slide_image(slide: Path | None, log: Callable[[str], None]) -> tuple[np.ndarray | None, str]:
    """The pixels the mosaics repeat: the whole of ``slide`` at level 0, or a generated H&E-like
    image (the demo's renderer) when no slide is given; (None, why) when the slide cannot be read."""
    if slide is None:
        from pathtwt.demo.synthetic import SlideRecipe, SyntheticSlide

        recipe = SlideRecipe(key=61, width=GENERATED_SIDE, height=GENERATED_SIDE, mpp=0.5, coverage=0.9, islands=1)
        return SyntheticSlide(recipe).render(0, 0, GENERATED_SIDE, GENERATED_SIDE), f"generated {GENERATED_SIDE} px H&E-like image"
    try:
        from pathtwt.wsi.slides import open_slide

        with open_slide(slide) as opened:
            return np.asarray(opened.read_region(0, 0, 0, *opened.dimensions)), str(slide)
    except (PathtwtError, OSError, ImportError, ValueError) as exc:
        line = f"{slide}: cannot read the slide ({' '.join(str(exc).split())[:200]}); end-to-end rows skipped, give another with --slide"
        log(line)
        return None, line


def measure_data_path(s: BenchSettings, image: np.ndarray, folder: Path, all_measured: dict[str, list[Measured]],
                      add: Callable[[BenchRow], None], facts: Callable[..., None], log: Callable[[str], None]) -> None:
    from pathtwt.bench.mosaics import build_mosaics
    from pathtwt.bench.throughput import (decoder_rates, extraction_rate, first_tiles, near_free_backbone,
                                          peak_memory_gib, reset_peak_memory)

    mosaics, coords, written = build_mosaics(image, folder, s.mosaics, s.mosaic_budget_s, log=log)
    if s.e2e_tiles:
        coords = {k: first_tiles(c, folder / f"first{k}.h5", s.e2e_tiles) for k, c in coords.items()}
    facts(**written)
    gpu = s.device.startswith("cuda")
    for found in decoder_rates(next(iter(mosaics.values())), s.device, on_gpu=gpu):
        add(BenchRow("-", found["name"], "decode", found["tiles_per_s"], mosaic=next(iter(mosaics)), batch=256,
                     precision="uint8", note=found["note"], extra=found["facts"]))
    options: dict[str, Any] = {"batch_size": s.e2e_batch, "workers": s.workers, "decode": s.decode}
    steady = dict(small=s.steady[0], large=s.steady[1], warmup=s.steady[2])
    readers: dict[str, float] = {}
    free = near_free_backbone(s.device)
    for mosaic in mosaics:
        rate, record = extraction_rate(free, mosaics[mosaic], coords[mosaic], folder, **steady, **options)
        readers[mosaic] = rate
        add(BenchRow("-", "readers alone", "readers", rate, mosaic=mosaic, batch=s.e2e_batch,
                     note=f"extraction with a model that costs nothing ({free.spec.name}); decode: {s.decode}"))
    for name, measured in all_measured.items():
        teacher = next((m for m in measured if m.variant.is_teacher), None)
        for m in measured:
            for mosaic in mosaics:
                reset_peak_memory(s.device)
                rate, record = extraction_rate(m.backbone, mosaics[mosaic], coords[mosaic], folder, **steady,
                                               bf16_autocast=m.backbone.bf16_autocast, **options)
                m.e2e[mosaic] = rate
                row = BenchRow(name, m.variant.name, "end-to-end", rate, mosaic=mosaic, batch=s.e2e_batch,
                               precision=record["precision"], gmacs=round(m.macs / 1e9, 3),
                               peak_mem_gib=round(peak_memory_gib(s.device), 3),
                               extra={"model_only_tiles_per_s": m.model_rate, "readers_tiles_per_s": readers[mosaic],
                                      "natives_device": record["natives_device"], "natives_host": record["natives_host"]})
                judge(row, m, teacher, readers[mosaic], mosaic)
                add(row)


def judge(row: BenchRow, m: Measured, teacher: Measured | None, readers: float, mosaic: str) -> None:
    """What bounds an end-to-end row, and a student's speed-up over its teacher against its MAC ratio."""
    model = m.model_rate or float("inf")
    row.bound = "reading" if readers < model else "model"
    row.note = (f"bound by {row.bound}: readers alone {readers:.1f} tiles/s, model alone {model:.1f} tiles/s; "
                f"end to end {row.tiles_per_s / min(readers, model):.2f} of the slower")
    if teacher is None or m is teacher or mosaic not in teacher.e2e:
        return
    row.mac_ratio = round(teacher.macs / m.macs, 3)
    row.speedup = round(row.tiles_per_s / teacher.e2e[mosaic], 3)
    row.reaches_goal = row.speedup >= GOAL_SHARE * row.mac_ratio
    row.note += (f"; {row.speedup:.2f}x the teacher end to end for {row.mac_ratio:.2f}x fewer MACs: "
                 f"{'reaches' if row.reaches_goal else 'misses'} {GOAL_SHARE} of its MAC ratio")


def run_bench(s: BenchSettings, add: Callable[[BenchRow], None], facts: Callable[..., None],
              log: Callable[[str], None]) -> None:
    """Every row of the module doc, each handed to ``add`` as soon as it is measured."""
    all_measured: dict[str, list[Measured]] = {}
    for name in s.backbones:
        teacher, measured = load_variants(s, name)
        teacher_macs = next((m.macs for m in measured if m.variant.is_teacher), measured[0].macs)
        for m in measured:
            measure_model_only(s, name, m, teacher_macs, add)
        all_measured[name] = measured
        del teacher
    image, source = slide_image(s.slide, log)
    facts(slide=source)
    if image is None:
        return
    with tempfile.TemporaryDirectory(prefix=".bench-") as tmp:
        measure_data_path(s, image, Path(tmp), all_measured, add, facts, log)
