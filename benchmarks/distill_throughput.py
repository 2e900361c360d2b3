"""Distillation throughput and memory: tiles streamed from slides vs the same tiles in
memory, peak RSS as the streamed tile count grows, and bf16 vs fp32 autocast.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/distill_throughput.py [--steps 120 --batch-size 16]

Tiles: a grid over the real shared slide CMU-1-Small-Region.svs (several coords files,
so the stream is shuffled across "slides"), read at --tile px and resized to the model's
input. Model: a TWT-style student (--depth blocks) of the --backbone teacher, random
weights unless --weights. Printed numbers:
  1. tiles/s of distillation streamed (DataLoader workers reading the slides) vs in
     memory (the same tiles as one uint8 array); target: streaming >= 90 % of in-memory.
  2. peak RSS (main process + its workers) after 1,000 and after 10,000 streamed tiles;
     target: flat within 10 %.
  3. tiles/s and the final R^2 of the student's tile embedding (concat CLS, mean patch)
     against the teacher's on held-out tiles, centred on the teacher's mean, with fp32 and
     with bf16 autocast.

Measures: distillation tiles/s streamed from slides against the same tiles in memory, peak RSS as the streamed
tile count grows, and tiles/s and the final embedding R^2 with fp32 and with bf16 autocast.
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/distill_throughput.py --steps 4 --batch-size 4
--rss-tiles 64 --files 2 --workers 1 --threads 1 --json out.json` (smallest); `PYTHONPATH=$PWD
.venv/bin/python benchmarks/distill_throughput.py --threads 1 --json out.json`. Needs ../shared.
JSON keys: `tiles`, `files`, `backbone`, `depth`, `batch_size`, `steps`, `workers`, `threads`,
`in_memory_tiles_per_s`, `streamed_tiles_per_s`, `streamed_share_of_in_memory` (target >= 0.9), `peak_rss_mib`
(streamed tiles -> MiB, target flat within 10 %), `r2_before`, `fp32` and `bf16` (`tiles_per_s`, `r2`,
`held_out_tiles`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SLIDE = Path(os.environ.get("PATHTWT_SHARED", REPO.parent / "shared")) / "data" / "slides" / "CMU-1-Small-Region.svs"


def write_coords(folder: Path, tile: int, n_files: int) -> list[Path]:
    """``n_files`` coords files whose grids together tile the slide (interleaved rows)."""
    from pathtwt.io.h5 import write_coords as write

    xs, ys = range(0, 2220 - tile + 1, tile), range(0, 2967 - tile + 1, tile)
    grid = np.array([(x, y) for y in ys for x in xs], dtype=np.int64)
    attrs = dict(patch_size=tile, patch_size_level0=tile, target_mpp=0.499, level0_mpp=0.499, read_level=0,
                 level0_width=2220, level0_height=2967, target_magnification=20.0, status="ok", slide_path=str(SLIDE))
    paths = []
    for k in range(n_files):
        path = folder / f"slide{k}.h5"
        write(path, grid[k::n_files], np.ones(len(grid[k::n_files])), attrs)
        paths.append(path)
    return paths


def rss_mb() -> float:
    """Resident memory of this process and its descendants (the DataLoader workers), from
    /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    pids, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo += children.get(pid, [])
    total_kb = 0
    for pid in pids:
        try:
            line = next(l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("VmRSS:"))
            total_kb += int(line.split()[1])
        except (OSError, StopIteration):
            pass
    return total_kb / 1024


class Recording:
    """Wraps an objective: samples RSS at every step (peak so far after each)."""

    def __init__(self, inner, batch: int) -> None:
        self.inner, self.batch, self.peaks, self.peak = inner, batch, [], 0.0

    def targets(self, teacher, x):
        return self.inner.targets(teacher, x)

    def loss(self, student, x, targets, step):
        self.peak = max(self.peak, rss_mb())
        self.peaks.append(((step + 1) * self.batch, self.peak))
        return self.inner.loss(student, x, targets, step)


def make_student(teacher, depth: int):
    from pathtwt.compress.student import clone_layers, stitch_student

    n = len(teacher.model.blocks)
    ends = [round((j + 1) * n / depth) for j in range(depth)]
    return stitch_student(teacher.model, clone_layers(teacher.model, [e - 1 for e in ends]), spec=teacher.spec), ends


def run(teacher, depth, tiles, *, steps, batch, precision="fp32", workers=0, objective=None):
    from pathtwt.compress.distill import DeepSupervision, DistillOptions, distill

    student, ends = make_student(teacher, depth)
    objective = objective or DeepSupervision(ends)
    opts = DistillOptions(steps=steps, batch_size=batch, precision=precision, workers=workers, progress=False, seed=0,
                          loss_norm="none")  # the loop alone, as measured before
    start = time.perf_counter()
    distill(student, teacher.model, tiles, transform=teacher.transform, objective=objective, options=opts)
    return student, steps * batch / (time.perf_counter() - start)


@torch.no_grad()
def r2(student, teacher, tiles) -> float:
    from pathtwt.compress.intermediates import tiles_to_batch
    from pathtwt.models.embedding import embed_tiles

    prefix = teacher.spec.num_prefix_tokens
    s, t = [], []
    for i in range(0, len(tiles), 32):
        x = tiles_to_batch(teacher.transform, tiles[i : i + 32], "cpu")
        s.append(embed_tiles(student, x, prefix).float())
        t.append(embed_tiles(teacher.model, x, prefix).float())
    s, t = torch.cat(s), torch.cat(t)
    return float(1 - ((s - t) ** 2).sum() / ((t - t.mean(0)) ** 2).sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backbone", default="vit-s14-tiny")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--tile", type=int, default=224, help="tile side read from the slide (level 0)")
    ap.add_argument("--files", type=int, default=8, help="coords files the slide's grid is split over")
    ap.add_argument("--steps", type=int, default=120, help="optimiser steps of the throughput runs")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=None, help="streaming workers (default: cores - 1, at most 4)")
    ap.add_argument("--rss-tiles", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=None,
                    help="compute threads (1 on a loaded machine: oversubscribed threads slow torch down ~50x)")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from pathtwt.compress.distill import DeepSupervision
    from pathtwt.compress.training_tiles import SlideTiles
    from pathtwt.devices import reading_workers as default_workers
    from pathtwt.models.registry import create_backbone

    workers = default_workers() if args.workers is None else args.workers
    teacher = create_backbone(args.backbone, weights=args.weights, pretrained=args.weights is not None, precision="fp32")
    if args.weights is None:
        # random weights: timm's tiny LayerScale init makes every layer nearly the identity
        # (any student then matches); gains of 0.5 give the layers something to do
        with torch.no_grad():
            for blk in teacher.model.blocks:
                for ls in (getattr(blk, "ls1", None), getattr(blk, "ls2", None)):
                    if hasattr(ls, "gamma"):
                        ls.gamma.fill_(0.5)
    with tempfile.TemporaryDirectory() as tmp:
        files = write_coords(Path(tmp), args.tile, args.files)
        streamed = SlideTiles(files)
        in_memory = np.stack([streamed.read(i) for i in range(len(streamed))])
        print(f"{len(streamed)} tiles of {args.tile} px in {len(files)} coords files over {SLIDE.name}; model "
              f"{args.backbone} ({teacher.spec.input_size} px input), student depth {args.depth}, batch {args.batch_size}, "
              f"{args.steps} steps, {workers} streaming workers, {torch.get_num_threads()} compute threads, "
              f"{os.cpu_count()} cores")

        run(teacher, args.depth, in_memory, steps=5, batch=args.batch_size)  # warm-up
        _, mem_rate = run(teacher, args.depth, in_memory, steps=args.steps, batch=args.batch_size)
        _, stream_rate = run(teacher, args.depth, streamed, steps=args.steps, batch=args.batch_size, workers=workers)
        result: dict = {"tiles": len(streamed), "files": len(files), "backbone": args.backbone, "depth": args.depth,
                        "batch_size": args.batch_size, "steps": args.steps, "workers": workers,
                        "threads": torch.get_num_threads(), "in_memory_tiles_per_s": round(mem_rate, 2),
                        "streamed_tiles_per_s": round(stream_rate, 2),
                        "streamed_share_of_in_memory": round(stream_rate / mem_rate, 4)}
        print(f"1. throughput: in memory {mem_rate:.1f} tiles/s, streamed {stream_rate:.1f} tiles/s "
              f"= {100 * stream_rate / mem_rate:.1f} % of in-memory (target >= 90 %)")

        rec = Recording(DeepSupervision(make_student(teacher, args.depth)[1]), args.batch_size)
        steps = -(-args.rss_tiles // args.batch_size)
        run(teacher, args.depth, streamed, steps=steps, batch=args.batch_size, workers=workers, objective=rec)
        at = lambda n: next(p for t, p in rec.peaks if t >= n)  # noqa: E731
        first = min(1_000, args.rss_tiles // 10)  # 1,000 unless a short run asks for fewer tiles in all
        small, large = at(first), at(args.rss_tiles)
        result["peak_rss_mib"] = {str(first): round(small, 1), str(args.rss_tiles): round(large, 1)}
        print(f"2. peak RSS (main + workers): {small:.0f} MiB after {first:,} streamed tiles, {large:.0f} MiB after "
              f"{args.rss_tiles:,} ({100 * (large - small) / small:+.1f} %, target within 10 %)")

        held, fit = in_memory[::5], np.delete(in_memory, np.s_[::5], axis=0)
        result["r2_before"] = round(r2(make_student(teacher, args.depth)[0], teacher, held), 4)
        print(f"3. before distillation: embedding R^2 {result['r2_before']:.4f}")
        for precision in ("fp32", "bf16"):
            student, rate = run(teacher, args.depth, fit, steps=args.steps, batch=args.batch_size, precision=precision)
            fit_r2 = r2(student, teacher, held)
            result[precision] = {"tiles_per_s": round(rate, 2), "r2": round(fit_r2, 4), "held_out_tiles": len(held)}
            print(f"3. {precision}: {rate:.1f} tiles/s, final embedding R^2 {fit_r2:.4f} "
                  f"on {len(held)} held-out tiles")
    if args.json:
        from pathtwt.io.atomic import write_json_atomic

        write_json_atomic(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
