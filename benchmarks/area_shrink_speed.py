"""The CPU shrink of output tiles on one thread: cv2.resize(INTER_AREA) tile by tile against
pathtwt.wsi.area_shrink.shrink on the same batch, whose pixels are checked equal first.

    python benchmarks/area_shrink_speed.py [--batch 32] [--repeat 9] [--sides 267 448 256 300 500]

Each side is shrunk to --size (224) px, --batch tiles at a time; a row reports the median
(and best) microseconds per tile over --repeat runs of the whole batch, the methods
interleaved, and the ratio of the medians. A third column times the same passes written
with numpy ufuncs (:func:`numpy_passes`), to show why the module compiles them with numba. Tiles are cut from the BACH images in
../shared/data/bach/images where present (random pixels otherwise: the time does not depend
on the content). Also prints the CPU, whether its flags include avx2 and avx512f, the shrink's
path (numba or OpenCV) and numba's first-call compile time in this process (0 when its
cache in __pycache__ was already there).

Measures: the CPU shrink of a batch of tiles to 224 px on one thread: microseconds a tile of
cv2.resize(INTER_AREA) tile by tile, of pathtwt.wsi.area_shrink.shrink (same pixels, checked first) and of the
same passes in numpy ufuncs, and the ratio of the medians.
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/area_shrink_speed.py --batch 4 --repeat 1 --sides 267
448 --json out.json` (smallest); `PYTHONPATH=$PWD .venv/bin/python benchmarks/area_shrink_speed.py` (32-tile
batches, 9 repeats, five sides).
JSON keys: `cpu`, `avx2`, `avx512f`, `path` (numba or OpenCV), `first_call_s` (numba compile or cache load);
`rows`: one a side, with `side`, `size`, `tiles`, `source` (BACH or random pixels), `route`, `median_us` and
`best_us` per method (`cv2`, `ours`, `numpy`), `cv2_over_area_shrink`.
"""

from __future__ import annotations

import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[var] = "1"  # before numpy or numba load: one thread throughout

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402

from pathtwt.io.atomic import write_json_atomic  # noqa: E402
from pathtwt.wsi import area_shrink  # noqa: E402

BACH = Path(__file__).resolve().parents[2] / "shared" / "data" / "bach" / "images"


def cpu() -> tuple[str, set[str]]:
    from pathtwt.bench.cpu import cpu_flags, cpu_model

    return cpu_model(), cpu_flags()


def tiles(side: int, n: int) -> tuple[np.ndarray, str]:
    images = sorted(BACH.glob("*.jpeg"))
    if not images:
        return np.random.default_rng(0).integers(0, 256, (n, side, side, 3), dtype=np.uint8), "random"
    out = []
    for path in images:
        image = cv2.imread(str(path))
        for y in range(0, image.shape[0] - side + 1, side):
            for x in range(0, image.shape[1] - side + 1, side):
                out.append(image[y:y + side, x:x + side])
                if len(out) == n:
                    return np.ascontiguousarray(np.stack(out)), "BACH"
    raise SystemExit(f"the BACH images in {BACH} hold fewer than {n} tiles of {side} px")


def numpy_passes(batch: np.ndarray, size: int) -> np.ndarray:
    """area_shrink's passes with numpy ufuncs instead of the numba loops (same pixels): one
    pass over memory for each gather, product and sum."""
    n, h, w, _ = batch.shape
    out = np.empty((n, size, size, 3), np.uint8)
    columns, across = np.empty((w, h, 3), np.uint8), np.empty((size, h, 3), np.float32)
    rows, total = np.empty((h, size, 3), np.float32), np.empty((size, size * 3), np.float32)

    def weighted_rows(src: np.ndarray, taps: tuple[np.ndarray, np.ndarray], dst: np.ndarray) -> None:
        index, weight = taps
        np.multiply(src[index[0]], weight[0][:, None], out=dst, dtype=np.float32)
        for t in range(1, len(index)):
            live = np.flatnonzero(weight[t])  # zero weights pad the shorter cells
            dst[live] += np.multiply(src[index[t, live]], weight[t, live][:, None], dtype=np.float32)

    for tile, dst in zip(batch, out):
        cv2.transpose(tile, dst=columns)
        weighted_rows(columns.reshape(w, -1), area_shrink._taps(w, size), across.reshape(size, -1))
        cv2.transpose(across, dst=rows)
        weighted_rows(rows.reshape(h, -1), area_shrink._taps(h, size), total)
        cv2.convertScaleAbs(total, dst=dst.reshape(size, -1))  # round half to even, saturate
    return out


def per_tile_us(run, batch: np.ndarray) -> float:
    start = time.perf_counter()
    run(batch)
    return (time.perf_counter() - start) / len(batch) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--sides", type=int, nargs="+", default=[267, 448, 256, 300, 500])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()

    cv2.setNumThreads(1)
    name, flags = cpu()
    kernels = area_shrink._kernels()
    path = "numba " + __import__("numba").__version__ if kernels else "OpenCV (numba not installed)"
    print(f"CPU: {name}; avx2: {'avx2' in flags}; avx512f: {'avx512f' in flags}; "
          f"OpenCV {cv2.__version__}, numpy {np.__version__}; area_shrink path: {path}")

    start = time.perf_counter()
    area_shrink.shrink(np.zeros((1, args.size + 43, args.size + 43, 3), np.uint8), args.size)
    first_call = time.perf_counter() - start
    print(f"first call (numba compile or cache load): {first_call:.2f} s\n")

    def opencv(batch: np.ndarray) -> list[np.ndarray]:
        return [cv2.resize(t, (args.size, args.size), interpolation=cv2.INTER_AREA) for t in batch]

    def ours(batch: np.ndarray) -> np.ndarray:
        return area_shrink.shrink(batch, args.size)

    def with_numpy(batch: np.ndarray) -> np.ndarray:
        return numpy_passes(batch, args.size)

    print(f"| {'side -> size':>13} | tiles | path | cv2 us/tile median (best) | area_shrink us/tile median (best) "
          "| cv2 / area_shrink | numpy ufuncs us/tile | cv2 / numpy |")
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    rows = []
    for side in args.sides:
        batch, source = tiles(side, args.batch)
        whole = area_shrink.whole_factor(side, args.size)
        # the numpy passes copy OpenCV's generic path, not its integer one for whole factors
        runs = {"cv2": opencv, "ours": ours, **({} if whole else {"numpy": with_numpy})}
        reference = np.stack(opencv(batch))
        for key in ("ours", "numpy")[:len(runs) - 1]:
            if not np.array_equal(reference, runs[key](batch)):
                label = "area_shrink" if key == "ours" else "the numpy passes"
                raise SystemExit(f"{side} px: {label} gave pixels other than cv2.INTER_AREA's")
        times: dict[str, list[float]] = {key: [] for key in runs}
        for _ in range(args.repeat):
            for key, run in runs.items():
                times[key].append(per_tile_us(run, batch))
        med = {k: statistics.median(v) for k, v in times.items()}
        best = {k: min(v) for k, v in times.items()}
        route = "OpenCV (whole factor)" if whole else "numba" if kernels else "OpenCV (no numba)"
        print(f"| {side:>6} -> {args.size:<4} | {args.batch} {source} | {route} | {med['cv2']:.0f} ({best['cv2']:.0f}) | "
              f"{med['ours']:.0f} ({best['ours']:.0f}) | {med['cv2'] / med['ours']:.2f} | "
              + (f"{med['numpy']:.0f} | {med['cv2'] / med['numpy']:.2f} |" if "numpy" in med else "- | - |"))
        rows.append({"side": side, "size": args.size, "tiles": args.batch, "source": source, "route": route,
                     "median_us": {k: round(v, 1) for k, v in med.items()},
                     "best_us": {k: round(v, 1) for k, v in best.items()},
                     "cv2_over_area_shrink": round(med["cv2"] / med["ours"], 3)})
    if args.json:
        write_json_atomic(args.json, {"cpu": name, "avx2": "avx2" in flags, "avx512f": "avx512f" in flags,
                                      "path": path, "first_call_s": round(first_call, 3), "rows": rows})


if __name__ == "__main__":
    main()
