"""How far two correct decodes of the same JPEG stream differ: the tolerance of the GPU
decoders' per-slide pixel check (``pathtwt.features.gpu_decoders``), measured.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/decode_tolerance.py [--bach 200] [--json F]

Two libjpeg-turbo builds decode every stream here (simplejpeg, whose TurboJPEG calls
switch chroma upsampling and the IDCT independently, and imagecodecs, the host decoder
of the device path), each way:

- ``fancy``: libjpeg's default, ISLOW integer IDCT and "fancy" (triangle-filter) chroma
  upsampling: the reference of a decoder that upsamples fancily;
- ``plain``: ISLOW, chroma replicated (``do_fancy_upsampling = FALSE``), what nvJPEG
  does without ``NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION`` (torchvision's GPU decode);
- ``ifast``: the fast integer IDCT, fancy or plain upsampling: a second IDCT standing in
  for a GPU's (nvJPEG's CUDA kernels and the hardware engines have their own).

Streams: every native tile of the real CMU-1-Small-Region.svs (Aperio: RGB JPEG, no chroma
subsampling, made complete with an Adobe transform-0 marker as the device path ships
them), ``--bach`` of the BACH H&E JPEGs (YCbCr 4:2:0, 1536 px) and a 4:2:0 mosaic (the
SVS's pixels cut into 256 px tiles, each encoded YCbCr 4:2:0 at quality 90, as a scanner
writing YCbCr JPEG tiles stores them). Where installed, nvImageCodec's own CPU backend
(its libjpeg-turbo extension, ``:fancy_upsampling=0|1``) and OpenCV (what nvImageCodec's
tests compare against, allowing 6 grey levels) are compared with the references too.

Printed: the largest absolute difference (grey levels, any channel) of each pair per
stream set, and the share of pixel values that differ by more than 2.

Measures: how far two correct decodes of the same JPEG stream differ (the GPU decoders' pixel-check
tolerance): the largest absolute difference and the share of values off by more than 2 of each decoder pair,
per stream set (the real SVS's tiles, BACH images, a 4:2:0 mosaic).
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/decode_tolerance.py --bach 2 --json out.json`
(smallest); `PYTHONPATH=$PWD .venv/bin/python benchmarks/decode_tolerance.py --json out.json` (200 BACH
images). Needs ../shared.
JSON keys: `decoders` (the decodes compared), `sets`: stream set -> `streams` and, per pair, `max` (grey
levels) and `share_over_2`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("PATHTWT_SHARED", REPO.parent / "shared"))
SVS = SHARED / "data" / "slides" / "CMU-1-Small-Region.svs"
BACH = SHARED / "data" / "bach" / "images"

Decode = Callable[[bytes], np.ndarray]


def svs_streams() -> list[bytes]:
    """Every native tile of the SVS's level 0, as the device path ships it."""
    import tifffile

    from pathtwt.wsi.jpeg_streams import tile_streams

    with tifffile.TiffFile(SVS) as tif:
        page = tif.pages[0]
        return [s for s in tile_streams(page, range(len(page.dataoffsets))) if s]


def bach_streams(n: int) -> list[bytes]:
    return [p.read_bytes() for p in sorted(BACH.glob("*.jpeg"))[:n]]


def mosaic_420_streams(tile: int = 256, quality: int = 90) -> list[bytes]:
    """The SVS's level-0 pixels in ``tile`` px tiles, each a YCbCr 4:2:0 JPEG."""
    import imagecodecs
    import tifffile

    image = tifffile.imread(SVS, key=0)
    h, w = image.shape[:2]
    return [bytes(imagecodecs.jpeg8_encode(np.ascontiguousarray(image[y:y + tile, x:x + tile]), level=quality,
                                           colorspace="RGB", outcolorspace="YCbCr", subsampling="420"))
            for y in range(0, h - tile + 1, tile) for x in range(0, w - tile + 1, tile)]


def decoders() -> dict[str, Decode]:
    import imagecodecs
    import simplejpeg

    def turbo(fastdct: bool, fastupsample: bool) -> Decode:
        return lambda s: simplejpeg.decode_jpeg(s, colorspace="RGB", fastdct=fastdct, fastupsample=fastupsample)

    out: dict[str, Decode] = {
        "fancy": turbo(False, False),
        "plain": turbo(False, True),
        "ifast-fancy": turbo(True, False),
        "ifast-plain": turbo(True, True),
        "imagecodecs": lambda s: np.asarray(imagecodecs.jpeg8_decode(s)),
    }
    try:
        import cv2

        out["opencv"] = lambda s: cv2.imdecode(np.frombuffer(s, np.uint8), cv2.IMREAD_COLOR)[..., ::-1]
    except ImportError:
        pass
    out.update(_nvimgcodec_cpu())
    return out


def _nvimgcodec_cpu() -> dict[str, Decode]:
    """nvImageCodec's libjpeg-turbo extension (its CPU backend), fancy upsampling on and off."""
    try:
        from nvidia import nvimgcodec
    except ImportError:
        return {}
    from pathtwt.features.gpu_decoders import nvimgcodec_params

    out: dict[str, Decode] = {}
    for fancy in (True, False):
        decoder = nvimgcodec.Decoder(device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY,
                                     backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)],
                                     options=f":fancy_upsampling={int(fancy)}")
        params = nvimgcodec_params(nvimgcodec)

        def decode(s: bytes, decoder=decoder, params=params) -> np.ndarray:
            image = decoder.decode(nvimgcodec.CodeStream(s), params=params)
            if image is None:
                raise ValueError("nvImageCodec's CPU backend refused the stream")
            return np.asarray(image.cpu())

        out[f"nvimgcodec-cpu-{'fancy' if fancy else 'plain'}"] = decode
    return out


# (what is compared, with what, why)
PAIRS = [
    ("plain", "fancy", "chroma upsampling alone: the bound for a decoder that cannot upsample fancily"),
    ("ifast-fancy", "fancy", "a second IDCT, fancy upsampling in both"),
    ("ifast-plain", "plain", "a second IDCT, plain upsampling in both"),
    ("imagecodecs", "fancy", "the device path's host decoder against the fancy reference"),
    ("opencv", "fancy", "OpenCV, what nvImageCodec's own tests compare with (they allow 6)"),
    ("nvimgcodec-cpu-fancy", "fancy", "nvImageCodec's CPU backend, :fancy_upsampling=1"),
    ("nvimgcodec-cpu-plain", "plain", "nvImageCodec's CPU backend, :fancy_upsampling=0"),
]


def compare(streams: Iterable[bytes], decode: dict[str, Decode]) -> dict[str, dict[str, float]]:
    """Per pair: the largest absolute difference and the share of values off by more than 2."""
    worst = {a: 0 for a, b, _ in PAIRS if a in decode}
    over, values = dict.fromkeys(worst, 0), 0
    for s in streams:
        images = {name: fn(s).astype(np.int16) for name, fn in decode.items()}
        values += images["fancy"].size
        for a, b, _ in PAIRS:
            if a in images:
                diff = np.abs(images[a] - images[b])
                worst[a] = max(worst[a], int(diff.max()))
                over[a] += int((diff > 2).sum())
    return {a: {"max": worst[a], "share_over_2": over[a] / max(values, 1)} for a in worst}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bach", type=int, default=200, help="BACH images to decode (default all 200)")
    ap.add_argument("--json", default=None, help="also write the table as JSON here")
    args = ap.parse_args(argv)
    if not SVS.is_file():
        print(f"decode_tolerance: {SVS} not found; run it where ../shared is checked out", file=sys.stderr)
        return 1
    decode = decoders()
    sets = {"cmu-svs (RGB, Adobe 0, 4:4:4)": svs_streams(), f"bach x{args.bach} (YCbCr 4:2:0)": bach_streams(args.bach),
            "mosaic (YCbCr 4:2:0, q90)": mosaic_420_streams()}
    results: dict = {"decoders": sorted(decode), "sets": {}}
    print(f"{'pair':44s}" + "".join(f"{name[:30]:>32s}" for name in sets))
    began = time.perf_counter()
    for name, streams in sets.items():
        results["sets"][name] = {"streams": len(streams), **compare(streams, decode)}
    for a, b, why in PAIRS:
        if a not in decode:
            continue
        cells = [results["sets"][n][a] for n in sets]
        print(f"{a + ' vs ' + b:44s}" + "".join(f"{c['max']:>20d} ({c['share_over_2']:8.2e})" for c in cells)
              + f"   {why}")
    counts = ", ".join(f"{n} {results['sets'][n]['streams']}" for n in sets)
    print(f"streams: {counts}; {time.perf_counter() - began:.0f} s")
    if args.json:
        from pathtwt.io.atomic import write_json_atomic

        write_json_atomic(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
