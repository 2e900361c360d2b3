"""Tile-reading throughput per reading core, as shares of the native decode limit measured
in the same run.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/reader_throughput.py [--rows 8] [--jobs 3]

Slides (built in a temporary folder, except the first):
  - ``svs``: the real CMU-1-Small-Region.svs (240 px JPEG tiles, 0.499 um/px), 224 px at 0.5 um/px;
  - ``bach``: a 12,288 px pyramidal JPEG TIFF, an 8 x 8 mosaic of the shared 1536 px BACH
    images (256 px tiles, 0.42 um/px), 224 px tiles at 0.5 um/px (267 level-0 px, shrunk);
  - ``40x``: a 0.25 um/px JPEG TIFF (4 x 4 BACH images, levels 1, 4, 16: no 2x level),
    read at level 0, 448 px -> 224.

Readers, one process, one thread, every whole tile of the first ``--rows`` tile rows:
  - ``new``: ``Slide.read_tiles`` a batch of 32 at a time and the model-input resize (what
    an extraction worker does);
  - ``today``: ``Slide.read_tile`` per tile and the resize (the reader before batches;
    the method is unchanged);
  - ``openslide``: plain ``openslide.read_region`` per tile, nothing else;
  - ``limit``: every native tile under those tiles decoded once (tifffile + imagecodecs).
Extraction end to end with the near-free backbone (``vit-s14-tiny``, random init, one
torch thread) at 1 and 2 reading workers over the whole slide, in steady state: a job of
``--jobs`` copies of the slide minus a job of one, and the model alone on the same
batches. ``--against DIR`` also measures extraction with one reader by the code of another
checkout (say ``git worktree add /tmp/main-ref main``), each code in its own fresh
process, in turn, the best of ``--repeat``: the ratio says whether this code extracts on
the CPU path as fast as that one, in the same run. ``--backbone vit-s14-imgfocus`` runs the same with the real ViT-S architecture
(random weights: the rate does not depend on them), where the question is whether the
reader keeps extraction at the model's own rate.

Measures: tile-reading tiles/s per reading core of each reader (batched, per tile, plain OpenSlide) as shares
of the native decode limit measured in the same run, and extraction's steady-state tiles/s with the near-free
model at 1 and 2 readers.
Command: `OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/reader_throughput.py --rows 1 --jobs 2
--cases svs --json out.json` (smallest); `OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python
benchmarks/reader_throughput.py --json out.json` (the SVS, the BACH mosaic and the 40x slide). Needs
../shared.
JSON keys: `model`, `model_only_tiles_per_s`, `rows`, `cases`: case -> `tiles`, `native_tiles`, tiles/s of
`new`, `today`, `openslide`, `limit`, `share_of_limit` per reader, `extract_tiles_per_s` {1, 2 readers} (null
with --no-extract), and `against` {this, other} with --against.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("PATHTWT_SHARED", REPO.parent / "shared"))
SVS = SHARED / "data" / "slides" / "CMU-1-Small-Region.svs"
BACH = SHARED / "data" / "bach" / "images"
BATCH = 32


def mosaic(n: int) -> np.ndarray:
    """The first n x n shared BACH images (1536 px each) side by side."""
    import cv2

    from pathtwt.bench.mosaics import image_grid

    return image_grid([cv2.imread(str(f))[..., ::-1] for f in sorted(BACH.glob("*.jpeg"))[: n * n]], n)


def write_bach(path: Path, n: int = 8) -> Path:
    """An n x n BACH mosaic at 0.42 um/px, a JPEG TIFF with a halving pyramid."""
    from pathtwt.bench.mosaics import write_mosaic

    return write_mosaic(path, mosaic(n), (1, 1), 0.42)


def write_40x(path: Path, n: int = 4) -> Path:
    import cv2
    import tifffile

    image = mosaic(n)
    h, w = image.shape[:2]
    with tifffile.TiffWriter(path) as tif:
        for i, ds in enumerate((1, 4, 16)):
            level = image if ds == 1 else cv2.resize(image, (w // ds, h // ds), interpolation=cv2.INTER_AREA)
            tif.write(level, tile=(256, 256), compression="jpeg", compressionargs={"level": 90}, photometric="rgb",
                      subfiletype=int(i > 0), resolution=(1e4 / (0.25 * ds),) * 2, resolutionunit="CENTIMETER")
    return path


def coords_file(slide_path: Path, out: Path) -> Path:
    """Every 224 px tile at 0.5 um/px, no tissue filter."""
    from pathtwt.bench.mosaics import mosaic_coords

    return mosaic_coords(slide_path, out)


def first_rows(xy: np.ndarray, rows: int) -> np.ndarray:
    ys = np.unique(xy[:, 1])[:rows]
    return xy[np.isin(xy[:, 1], ys)]


def rates(slide_path: Path, coords: Path, rows: int, profile: bool, repeat: int = 3) -> dict[str, float]:
    """tiles/s of each reader over the first ``rows`` tile rows, best of ``repeat`` (each
    from a freshly opened slide, so no decoded tile is kept between repeats)."""
    import openslide
    import tifffile

    from pathtwt.io.h5 import read_coords
    from pathtwt.models.transform import TileTransform
    from pathtwt.wsi.coords_tiles import TileGeometry
    from pathtwt.wsi.native_tiles import decode_native_tiles, native_page

    xy, _t, attrs = read_coords(coords)
    xy = first_rows(xy, rows)
    geometry = TileGeometry.from_attrs(coords, attrs, slide_path=slide_path)
    resize = TileTransform(224, (0.5,) * 3, (0.5,) * 3).resize
    p0, level, size = geometry.patch_size_level0, geometry.read_level, geometry.patch_size

    def new(slide):
        for i in range(0, len(xy), BATCH):
            for tile in slide.read_tiles(xy[i:i + BATCH], p0, level, size):
                resize(tile)

    def today(slide):
        for x, y in xy:
            resize(slide.read_tile(int(x), int(y), p0, level, size))

    with geometry.open() as slide:
        ds = slide.level_downsamples[level]
        side = max(1, int(round(p0 / ds)))
        native = slide.native_level(level)
        under = [] if native is None else \
            sorted({i for x, y in xy for i in native.tiles_under(int(x / ds), int(y / ds), side, side)})

    def plain(raw):
        for x, y in xy:
            raw.read_region((int(x), int(y)), level, (side, side))

    def limit(tif):
        decode_native_tiles(native_page(tif, level, tif.series[0].levels[level].keyframe.shape[1::-1]), under)

    openers = {"new": (geometry.open, new), "today": (geometry.open, today),
               "openslide": (lambda: openslide.OpenSlide(str(slide_path)), plain)}
    if under:
        openers["limit"] = (lambda: tifffile.TiffFile(slide_path), limit)
    out: dict[str, float] = {"tiles": float(len(xy)), "native_tiles": float(len(under))}
    for name, (opener, read) in openers.items():
        best = float("inf")
        for _ in range(repeat):
            with opener() as handle:
                began = time.perf_counter()
                read(handle)
                best = min(best, time.perf_counter() - began)
        out[name] = len(xy) / best
    if profile:
        profiler = cProfile.Profile()
        with geometry.open() as slide:
            profiler.runcall(new, slide)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
    return out


MODEL = "vit-s14-tiny"  # --backbone


def near_free_backbone():
    import torch

    from pathtwt.models.registry import create_backbone

    torch.set_num_threads(1)
    return create_backbone(MODEL, pretrained=False, precision="fp32")


def model_only(batches: int = 20) -> float:
    """tiles/s of the backbone alone on uint8 batches (normalisation, forward)."""
    import torch

    from pathtwt.models.embedding import embed_tiles

    backbone = near_free_backbone()
    batches = batches if MODEL == "vit-s14-tiny" else 3  # a real ViT on one thread: a few s a batch
    size = backbone.transform.input_size
    x = torch.randint(0, 256, (BATCH, size, size, 3), dtype=torch.uint8)
    with torch.inference_mode():
        embed_tiles(backbone.model, backbone.transform.normalise_batch(x, "cpu"), backbone.spec.num_prefix_tokens)
        began = time.perf_counter()
        for _ in range(batches):
            inputs = backbone.transform.normalise_batch(x, "cpu")
            embed_tiles(backbone.model, inputs, backbone.spec.num_prefix_tokens).float().numpy()
    return batches * BATCH / (time.perf_counter() - began)


def extraction(slide_path: Path, coords: Path, folder: Path, jobs: int, workers: int) -> float:
    """Steady-state tiles/s: a job of ``jobs`` copies minus a job of one."""
    from pathtwt.features import loop
    from pathtwt.features.extract import extract_many
    from pathtwt.features.jobs import ExtractJob
    from pathtwt.io.h5 import read_coords

    loop.IN_PROCESS_BATCHES = 0  # the SVS's 61 tiles would be read in the main process
    backbone = near_free_backbone()
    from pathtwt.bench.timing import steady_state

    n = len(read_coords(coords)[0])

    def job(count: int) -> None:
        todo = [ExtractJob(slide_path, coords, folder / f"f{workers}_{count}_{i}.h5") for i in range(count)]
        extract_many(todo, backbone, batch_size=BATCH, workers=workers, progress=False, decode="cpu")

    return steady_state(job, 1, jobs, warmup=False).rate(n)


def extraction_by(code: Path, slide_path: Path, coords: Path, folder: Path, jobs: int, workers: int) -> float:
    """:func:`extraction` run by the pathtwt of checkout ``code``, in a fresh process."""
    script = "; ".join([
        "import sys", f"sys.path.insert(0, {str(code)!r})", "import pathtwt",
        f"assert pathtwt.__file__.startswith({str(code)!r}), pathtwt.__file__",
        f"sys.path.insert(1, {str(REPO / 'benchmarks')!r})", "import reader_throughput as rt", f"rt.MODEL = {MODEL!r}",
        f"print(rt.extraction(rt.Path({str(slide_path)!r}), rt.Path({str(coords)!r}), rt.Path({str(folder)!r}), "
        f"{jobs}, {workers}))"])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    return float(done.stdout.strip().splitlines()[-1])


def against(code: Path, path: Path, coords: Path, folder: Path, jobs: int, repeat: int) -> tuple[float, float]:
    """(this code's, ``code``'s) steady-state tiles/s with one reader, best of ``repeat``
    each, run in turn."""
    ours = theirs = 0.0
    for _ in range(repeat):
        ours = max(ours, extraction_by(REPO, path, coords, folder, jobs, 1))
        theirs = max(theirs, extraction_by(code, path, coords, folder, jobs, 1))
    return ours, theirs


def _finite(value: float) -> float | None:
    return None if value != value else round(float(value), 3)  # NaN (not measured) is JSON's null


def main() -> int:
    global MODEL
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=12, help="tile rows read by every reader")
    parser.add_argument("--jobs", type=int, default=4, help="slides in the long extraction job")
    parser.add_argument("--cases", default="svs,bach,40x")
    parser.add_argument("--no-extract", action="store_true")
    parser.add_argument("--profile", action="store_true", help="cProfile the new reader on each case")
    parser.add_argument("--backbone", default=MODEL, help="the extraction's model (default the near-free one)")
    parser.add_argument("--against", metavar="DIR", help="also extract with the code of this checkout, in turn")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each code with --against (the best is kept)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    MODEL = args.backbone
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import cv2

    cv2.setNumThreads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        slides = {"svs": lambda: SVS, "bach": lambda: write_bach(tmp / "bach.tiff"), "40x": lambda: write_40x(tmp / "x40.tiff")}
        alone = float("nan")
        if not args.no_extract:
            alone = model_only()
            print(f"{MODEL} alone, one thread: {alone:.1f} tiles/s", flush=True)
        print("| case | tiles | native tiles | limit tiles/s | new | today | openslide.read_region | extract 1 reader | "
              "extract 2 readers | 2 / 1 | 1 reader / model-only |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        result: dict = {"model": MODEL, "model_only_tiles_per_s": _finite(alone), "rows": args.rows, "cases": {}}
        for case in args.cases.split(","):
            began = time.perf_counter()
            path = slides[case]()
            coords = coords_file(path, tmp / f"{case}.h5")
            print(f"# {case}: built in {time.perf_counter() - began:.0f} s", file=sys.stderr)
            r = rates(path, coords, args.rows, args.profile)
            limit = r.get("limit", float("nan"))
            share = {k: r[k] / limit for k in ("new", "today", "openslide")}
            e1 = e2 = float("nan")
            if not args.no_extract:
                e1 = extraction(path, coords, tmp, args.jobs, 1)
                e2 = extraction(path, coords, tmp, args.jobs, 2)
            print(f"| {case} | {int(r['tiles'])} | {int(r.get('native_tiles', 0))} | {limit:.0f} | "
                  f"{share['new']:.2f} ({r['new']:.0f}/s) | {share['today']:.2f} ({r['today']:.0f}/s) | "
                  f"{share['openslide']:.2f} | {e1 / limit:.2f} ({e1:.0f}/s) | {e2 / limit:.2f} ({e2:.0f}/s) | "
                  f"{e2 / e1:.2f} | {e1 / alone:.2f} |", flush=True)
            result["cases"][case] = {**{k: _finite(v) for k, v in r.items()}, "share_of_limit": {k: _finite(v) for k, v in share.items()},
                                     "extract_tiles_per_s": {"1": _finite(e1), "2": _finite(e2)}}
            if args.against:
                ours, theirs = against(Path(args.against).resolve(), path, coords, tmp, args.jobs, args.repeat)
                print(f"# {case}: extraction, 1 reader, fresh processes, best of {args.repeat}: this code "
                      f"{ours:.0f} tiles/s, {args.against}'s {theirs:.0f} tiles/s: {ours / theirs:.3f} of it",
                      flush=True)
                result["cases"][case]["against"] = {"this": ours, "other": theirs}
    if args.json:
        from pathtwt.io.atomic import write_json_atomic

        write_json_atomic(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
