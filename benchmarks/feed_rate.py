"""Can extraction's data path feed a GPU at a compressed model's rate? The host's costs per
tile, measured on any machine, in one run, as one JSON object.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/feed_rate.py SLIDE20 SLIDE40 [--json]
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/feed_rate.py --make DIR   # builds both

SLIDE20 and SLIDE40 are pyramidal JPEG-tiled TIFFs of real tissue, tiled here at 0.5 um/px
with 224 px tiles (every tile of the slide). ``--make DIR`` writes the two this project
measures with, from the shared BACH images: two 8 x 8 mosaics, one at 0.42 um/px (267 level
pixels a tile, shrunk to 224), one at 0.25 um/px (a 40x scan: 448 -> 224).

The keys (the issue's targets in brackets):

- ``reader_us_per_tile`` {20x, 40x} [<= 60]: a reading process's own CPU time per output
  tile to ship the GPU path's batches (the compressed native tiles under each batch, read
  into a ring slot, and its cut plan), one thread, batches of the GPU batch (256);
- ``host_us_per_tile`` [<= 40]: the embedding process's own CPU time per tile (all its
  threads) over the real loop at the GPU batch, with a stub decoder and a null model, the
  device being PyTorch's ``meta`` device (every tensor operation is dispatched and shaped,
  nothing computed: what a GPU's asynchronous launches cost the host): receiving,
  planning the gather, normalising, the forward call, the outputs and the HDF5 writes.
  Steady state: a job of 4 copies of the slide less a job of one, the least of three.
  ``torch_ops_per_batch`` [<= 64 at the GPU batch] counts the tensor operations the
  embedding process dispatches per batch (each a kernel launch or a view on a GPU, some
  microseconds of host time; the meta device spends tens to hundreds of microseconds on
  some, its shape rules being Python). The stub decoder allocates its batch's tiles once
  per call, as a real decoder's outputs are wrapped without an operation each;
- ``decode_amplification`` [<= 1.05]: native tiles the CPU path's 4 reading processes
  decoded over the native tiles under the tiles (SLIDE20);
- ``cpu_reader_share_of_limit`` {20x, 40x} [>= 0.6 at 20x]: the CPU path's reader (one
  process, one thread: decode, cut, resize into the ring) in tiles/s over the native decode
  limit (every native tile under the tiles decoded once, tifffile/imagecodecs) of the same
  tiles, measured in this run.

The CPU (model name, and whether it has AVX2 / AVX512 / AMX) is in the object too.

Measures: whether extraction's data path can feed a GPU at a compressed model's rate: the host's costs per
tile on any machine (reader CPU time, the embedding process's time on the meta device, tensor operations per
batch, decode amplification, the CPU reader against the decode limit).
Command: `OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/feed_rate.py --make DIR --quick
--json` (smallest: 2 x 2 BACH mosaics); `OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python
benchmarks/feed_rate.py --make DIR --json` (the 8 x 8 mosaics the targets are stated on). Needs ../shared for
--make.
JSON keys: printed on stdout: `cpu`, `gpu_batch`, `reader_us_per_tile` {20x, 40x}, `cpu_reader_share_of_limit`
{20x, 40x}, `cpu_reader_tiles_per_s`, `native_decode_limit_tiles_per_s`, `host_us_per_tile`,
`torch_ops_per_batch`, `decode_amplification`, `native_tiles_decoded_needed`, `tiles` {20x, 40x}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
GPU_BATCH = 256


def cpu_name() -> dict[str, object]:
    from pathtwt.bench.cpu import cpu_units

    return cpu_units()


def make(folder: Path, n: int = 8) -> tuple[Path, Path]:
    """The two n x n BACH mosaics (8: the slides this project measures with)."""
    from reader_throughput import write_40x, write_bach

    folder.mkdir(parents=True, exist_ok=True)
    return write_bach(folder / "bach20x.tiff", n), write_40x(folder / "bach40x.tiff", n=n)


def coords_of(slide: Path, folder: Path) -> Path:
    from pathtwt.bench.mosaics import mosaic_coords

    return mosaic_coords(slide, folder / f"{slide.stem}.h5")


def _read(slide: Path, coords: Path):
    from pathtwt.features.reading import SlideRead
    from pathtwt.io.h5 import read_coords
    from pathtwt.wsi.coords_tiles import TileGeometry

    xy, _t, attrs = read_coords(coords)
    return SlideRead(0, TileGeometry.from_attrs(coords, attrs, slide_path=slide), xy), attrs


def reader_us_per_tile(slide: Path, coords: Path) -> float:
    """The GPU path's reading process: process CPU time per tile, best of 3."""
    from pathtwt.features.reading import Band, BatchReader, band_batches
    from pathtwt.features.ring import Ring, RingSize
    from pathtwt.features.loop import STREAM_BYTES_PER_TILE

    read, _attrs = _read(slide, coords)
    ring = Ring(RingSize.for_job(1, GPU_BATCH, 224 * 224 * 3, GPU_BATCH * STREAM_BYTES_PER_TILE))
    band = Band(0, 0, tuple(band_batches(len(read.xy), GPU_BATCH)))
    best = float("inf")
    for _ in range(3):
        reader = BatchReader(ring, 224, lambda t: t, ship_bytes=True)
        slots = iter(int(k) % ring.size.slots for k in range(10**9))
        began = time.process_time()
        kinds = {m.kind for m in reader.band(read, band, slots)}
        best = min(best, time.process_time() - began)
        reader.close()
        assert kinds == {"bytes"}, kinds
    return 1e6 * best / len(read.xy)


def cpu_reader_share(slide: Path, coords: Path) -> tuple[float, float, float]:
    """(share, reader tiles/s, limit tiles/s): the CPU path's reader, one thread, against
    decoding each native tile under the tiles once; best of 3 each."""
    import tifffile

    from pathtwt.features.reading import Band, BatchReader, band_batches
    from pathtwt.features.ring import Ring, RingSize
    from pathtwt.models.transform import TileTransform
    from pathtwt.wsi.cut_plan import LevelGrid, natives_under
    from pathtwt.wsi.native_tiles import decode_native_tiles, native_page

    read, _attrs = _read(slide, coords)
    resize = TileTransform(224, (0.5,) * 3, (0.5,) * 3).resize
    ring = Ring(RingSize.for_job(1, GPU_BATCH, 224 * 224 * 3))
    band = Band(0, 0, tuple(band_batches(len(read.xy), GPU_BATCH)))
    level = read.geometry.read_level
    with read.geometry.open() as opened:
        ds = opened.level_downsamples[level]
        page = opened.native_level(level).page
        side = max(1, int(round(read.geometry.patch_size_level0 / ds)))
        origins = (read.xy / ds).astype(np.int64)
    natives = natives_under(LevelGrid.of_page(page), origins, side)
    reader_s = limit_s = float("inf")
    for _ in range(3):
        reader = BatchReader(ring, 224, resize, ship_bytes=False)
        slots = iter(int(k) % ring.size.slots for k in range(10**9))
        began = time.perf_counter()
        for _msg in reader.band(read, band, slots):
            pass
        reader_s = min(reader_s, time.perf_counter() - began)
        reader.close()
        with tifffile.TiffFile(slide) as tif:
            page = native_page(tif, level, tif.series[0].levels[level].keyframe.shape[1::-1])
            began = time.perf_counter()
            decode_native_tiles(page, natives)
            limit_s = min(limit_s, time.perf_counter() - began)
    reader_rate, limit_rate = len(read.xy) / reader_s, len(read.xy) / limit_s
    return reader_rate / limit_rate, reader_rate, limit_rate


def _null_backbone(device: str):
    """h0-mini's spec and transform (224 px, 1536-d cls+mean) with a model that computes
    nothing: its tokens are zeros on the host."""
    import torch

    from pathtwt.models.registry import create_backbone

    backbone = create_backbone("h0-mini", pretrained=False, precision="fp32", device="cpu")
    spec = backbone.spec

    class NullModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))

        def forward_features(self, x):  # the class token, the registers and one patch token: zeros
            return torch.zeros(len(x), 1 + spec.num_prefix_tokens + 1, 768)

    return dataclasses.replace(backbone, model=NullModel(), device=device)


def _stub_decoders():
    """A GPU decoder that decodes nothing: per stream, a view of one meta tensor of the
    batch's tiles. Its outputs cost one allocation a call, as a real decoder's are wrapped
    without a dispatched operation each (nvImageCodec's by ``__cuda_array_interface__``)."""
    import torch

    from pathtwt.features import gpu_decoders

    def make_stub(device):
        def decode(streams):
            return list(torch.empty((len(streams), 256, 256, 3), dtype=torch.uint8, device=device).unbind(0))

        return gpu_decoders.BatchDecoder("stub", decode, is_host=True)  # nothing to check it against

    gpu_decoders.GPU_DECODERS["stub"] = gpu_decoders.Entry(lambda: True, make_stub, False)


def host_us_per_tile(slide: Path, coords: Path, folder: Path) -> float:
    from pathtwt.features.extract import extract_many
    from pathtwt.features.jobs import ExtractJob
    from pathtwt.io.h5 import read_coords

    _stub_decoders()
    backbone = _null_backbone("meta")
    n = len(read_coords(coords)[0])

    def cpu_seconds(count: int) -> float:
        jobs = [ExtractJob(slide, coords, folder / f"host{count}_{i}.h5") for i in range(count)]
        began = time.process_time()
        extract_many(jobs, backbone, batch_size=GPU_BATCH, workers=1, progress=False, gpu_decoder="stub")
        return time.process_time() - began

    # the least of three: other work on the machine only ever adds time
    return min(1e6 * (cpu_seconds(4) - cpu_seconds(1)) / (3 * n) for _ in range(3))


def torch_ops_per_batch(slide: Path, coords: Path, folder: Path) -> float:
    """Tensor operations the embedding process dispatches per GPU batch (the same loop as
    host_us_per_tile): on a GPU, each is a kernel launch of some microseconds of host time,
    where the meta device spends about a hundred (its shape rules are Python)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from pathtwt.features.extract import extract_many
    from pathtwt.features.jobs import ExtractJob
    from pathtwt.io.h5 import read_coords

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    _stub_decoders()
    backbone = _null_backbone("meta")
    n = len(read_coords(coords)[0])
    with Count():
        extract_many([ExtractJob(slide, coords, folder / "ops.h5")], backbone, batch_size=GPU_BATCH, workers=1,
                     progress=False, gpu_decoder="stub")
    return Count.ops / -(-n // GPU_BATCH)


def decode_amplification(slide: Path, coords: Path, folder: Path) -> tuple[float, int, int]:
    import h5py

    from pathtwt.features.extract import extract_many
    from pathtwt.features.jobs import ExtractJob
    from pathtwt.wsi.cut_plan import LevelGrid, natives_under

    read, _attrs = _read(slide, coords)
    level = read.geometry.read_level
    with read.geometry.open() as opened:
        ds = opened.level_downsamples[level]
        grid = LevelGrid.of_page(opened.native_level(level).page)
    side = max(1, int(round(read.geometry.patch_size_level0 / ds)))
    needed = len(natives_under(grid, (read.xy / ds).astype(np.int64), side))
    backbone = _null_backbone("cpu")
    out = folder / "amplification.h5"
    extract_many([ExtractJob(slide, coords, out)], backbone, batch_size=32, workers=4, progress=False, decode="cpu")
    with h5py.File(out, "r") as f:
        decoded = int(f.attrs["natives_decoded_host"])
    return decoded / needed, decoded, needed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slides", nargs="*", metavar="SLIDE", help="SLIDE20 SLIDE40")
    parser.add_argument("--make", metavar="DIR", help="write the two BACH mosaics into DIR and measure them")
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--quick", action="store_true",
                        help="with --make: 2 x 2 mosaics instead of 8 x 8 (a check that it runs, in seconds)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import cv2
    import torch

    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    if args.make:
        slide20, slide40 = make(Path(args.make), 2 if args.quick else 8)
    elif len(args.slides) == 2:
        slide20, slide40 = map(Path, args.slides)
    else:
        parser.error("give SLIDE20 SLIDE40, or --make DIR")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        coords = {"20x": coords_of(slide20, tmp), "40x": coords_of(slide40, tmp)}
        slides = {"20x": slide20, "40x": slide40}
        result: dict[str, object] = {"cpu": cpu_name(), "gpu_batch": GPU_BATCH}
        result["reader_us_per_tile"] = {k: round(reader_us_per_tile(slides[k], coords[k]), 1) for k in slides}
        shares = {k: cpu_reader_share(slides[k], coords[k]) for k in slides}
        result["cpu_reader_share_of_limit"] = {k: round(v[0], 3) for k, v in shares.items()}
        result["cpu_reader_tiles_per_s"] = {k: round(v[1]) for k, v in shares.items()}
        result["native_decode_limit_tiles_per_s"] = {k: round(v[2]) for k, v in shares.items()}
        result["host_us_per_tile"] = round(host_us_per_tile(slide20, coords["20x"], tmp), 1)
        result["torch_ops_per_batch"] = round(torch_ops_per_batch(slide20, coords["20x"], tmp))
        amp, decoded, needed = decode_amplification(slide20, coords["20x"], tmp)
        result["decode_amplification"] = round(amp, 4)
        result["native_tiles_decoded_needed"] = [decoded, needed]
        result["tiles"] = {k: int(_read(slides[k], coords[k])[0].xy.shape[0]) for k in slides}
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
