"""Extraction throughput against the machine's arithmetic peak, in one process and one run.

Measures (a) a large float32 matrix multiply's GFLOP/s (the practical peak), (b) tiles/s
of the backbone forward alone on in-memory tensors for the 12-layer H0-mini architecture
(random weights) and the same architecture at depth 6, 5 and 4, (c) tiles/s of the full
``extract`` path from a slide file (coords file -> features file), (d) bf16 throughput
and the cosine between bf16 and fp32 tile embeddings on real slide tiles when the CPU
(or GPU) supports bf16. Prints one JSON object.

    .venv/bin/python benchmarks/extract_throughput.py [--device cpu] [--batch-sizes 4,8,16]

Timings are the best of repeated runs (the least-disturbed one on a shared machine); the
ratios compare numbers measured in this same run. FLOPs = 2 x MACs (see
pathtwt.models.flops for what the MACs count).

Measures: a float32 matmul's GFLOP/s (the practical peak), tiles/s of the H0-mini architecture's forward at
each depth and batch size as a fraction of it, full extraction from a slide against the forward alone, and
bf16 speed and cosine where the hardware has bf16.
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/extract_throughput.py --backbone vit-s14-tiny --batch-sizes 2 --depths 12,5
--rounds 1 --matmul-n 256 --extract-tiles 8 --workers 0` (smallest); `PYTHONPATH=$PWD .venv/bin/python
benchmarks/extract_throughput.py` (batches 4, 8, 16; depths 12, 6, 5, 4). Needs ../shared for the extraction
and real-tile rows.
JSON keys: printed on stdout: `machine`, `backbone`, `matmul` {n, peak_gflops}, `forward`
(`batch_sweep_tiles_per_s`, `batch_size`, `depths` -> tiles_per_s, macs_per_tile, gflops, fraction_of_peak),
`extract` (tiles, tiles_per_s, forward_alone_same_rounds, ...), `bf16` (a dict, or why not), `ratios`
(forward_fraction_of_peak_12, speedup_5_vs_12, mac_ratio_12_over_5, speedup_fraction_of_mac_ratio,
extract_over_forward), `targets_met`, and where bf16 runs `bf16_default_ok (cosine >= 0.999)`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from pathtwt.bench import timing
from pathtwt.bench.throughput import synchronizer
from pathtwt.io import h5 as h5io
from pathtwt.models.registry import Backbone, build_timm_model, create_backbone, get_spec
from pathtwt.models.flops import count_macs
from pathtwt.models.embedding import embed_tiles
from pathtwt.devices import reading_workers as default_workers
from pathtwt.features.extract import extract_slide

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PATHTWT_SHARED", REPO.parent / "shared"))
SLIDE = SHARED / "data" / "slides" / "CMU-1-Small-Region.svs"
VIT_S = SHARED / "weights" / "vit_s14_imgfocus.safetensors"


def interleaved_best(calls: dict[Any, Callable[[], Any]], device: str, rounds: int) -> dict[Any, float]:
    """Best wall time of each call, interleaved round by round (pathtwt.bench.timing)."""
    return timing.interleaved_best(calls, rounds, sync=synchronizer(device))


def matmul_call(device: str, n: int) -> Callable[[], Any]:
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    return lambda: torch.mm(a, b)


def forward_call(model: torch.nn.Module, batch: int, prefix: int, device: str, dtype: torch.dtype) -> Callable[[], Any]:
    side = model.patch_embed.img_size[0]  # timm's ViT: the input size it was built for (224 but the tiny one)
    x = torch.randn(batch, 3, side, side, device=device, dtype=dtype).contiguous()

    def call():
        with torch.inference_mode():
            return embed_tiles(model, x, prefix)

    return call


def _slide_coords(path: Path, n_tiles: int) -> Path:
    # a grid over CMU-1-Small-Region (2220 x 2967 px at 0.499 um/px), 224 px tiles at 0.5 um/px,
    # cycled to n_tiles so the extraction runs long enough to be timed
    grid = [(x, y) for y in range(0, 2967 - 224, 224) for x in range(0, 2220 - 224, 224)]
    xy = np.array([grid[i % len(grid)] for i in range(n_tiles)], dtype=np.int64)
    attrs = dict(patch_size=224, patch_size_level0=224, target_mpp=0.5, level0_mpp=0.499, read_level=0,
                 level0_width=2220, level0_height=2967, target_magnification=20, status="ok",
                 slide_path=str(SLIDE))
    h5io.write_coords(path, xy, np.ones(len(xy)), attrs)
    return path


def real_tiles(n: int) -> torch.Tensor:
    from pathtwt.wsi.slides import open_slide

    with open_slide(SLIDE) as slide:
        xs = [(x, y) for y in range(300, 2600, 448) for x in range(100, 2000, 448)][:n]
        return np.stack([slide.read_tile(x, y, 224, 0, 224) for x, y in xs])


def bf16_check(backbone: Backbone, tiles: np.ndarray, device: str) -> float:
    """Smallest cosine between fp32 and bf16 embeddings of the same real tiles."""
    x = backbone.transform.batch(tiles).to(device)
    with torch.inference_mode():
        ref = embed_tiles(backbone.model, x, backbone.spec.num_prefix_tokens)
        low = embed_tiles(backbone.model.to(torch.bfloat16), x, backbone.spec.num_prefix_tokens)
    backbone.model.float()
    return float(torch.nn.functional.cosine_similarity(ref, low.float(), dim=1).min())


def cpu_has_bf16() -> bool:
    from pathtwt.bench.cpu import cpu_flags

    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch-sizes", default=None, help="batch sizes to sweep (default cpu 4,8,16; cuda 64,128,256)")
    parser.add_argument("--depths", default="12,6,5,4")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (best of)")
    parser.add_argument("--matmul-n", type=int, default=None)
    parser.add_argument("--extract-tiles", type=int, default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--backbone", default="h0-mini",
                        help="the architecture measured (default %(default)s; vit-s14-tiny: a check that it runs)")
    args = parser.parse_args(argv)

    device = args.device
    cuda = device == "cuda"
    batches = [int(b) for b in (args.batch_sizes or ("64,128,256" if cuda else "4,8,16")).split(",")]
    n = args.matmul_n or (8192 if cuda else 2048)
    torch.manual_seed(0)
    spec = get_spec(args.backbone)
    result: dict[str, Any] = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        },
        "backbone": f"{args.backbone} architecture, random weights, fp32",
    }
    depths = [int(d) for d in args.depths.split(",")]
    prefix = spec.num_prefix_tokens
    models = {d: build_timm_model(spec, depth=d).to(device) for d in depths}
    macs = {d: count_macs(models[d]) for d in depths}
    # batch size: the fastest 12-layer forward
    sweep_t = interleaved_best({b: forward_call(models[12], b, prefix, device, torch.float32) for b in batches},
                               device, rounds=1)
    sweep = {b: b / t for b, t in sweep_t.items()}
    batch = max(sweep, key=sweep.get)

    # (a) + (b): matmul peak and forward alone at every depth, interleaved
    calls: dict[Any, Callable[[], Any]] = {"matmul": matmul_call(device, n)}
    calls.update({d: forward_call(models[d], batch, prefix, device, torch.float32) for d in depths})
    best = interleaved_best(calls, device, rounds=args.rounds)
    peak = 2 * n**3 / best["matmul"] / 1e9
    forward = {d: batch / best[d] for d in depths}
    result["matmul"] = {"n": n, "peak_gflops": round(peak, 1)}
    result["forward"] = {
        "batch_sweep_tiles_per_s": {str(b): round(v, 3) for b, v in sweep.items()},
        "batch_size": batch,
        "depths": {
            str(d): {
                "tiles_per_s": round(forward[d], 3),
                "macs_per_tile": macs[d],
                "gflops": round(2 * macs[d] * forward[d] / 1e9, 1),
                "fraction_of_peak": round(2 * macs[d] * forward[d] / 1e9 / peak, 3),
            }
            for d in depths
        },
    }

    # (c) the full extract path with the 12-layer model, interleaved with the forward alone
    backbone = Backbone(
        model=models[12], transform=_transform(spec), precision="fp32", spec=spec, weights_sha256=None,
        source="random-init", device=device,
    )
    n_batches = max(1, (args.extract_tiles or (4 * batch if not cuda else 16 * batch)) // batch)
    n_tiles = n_batches * batch
    one_batch = calls[12]

    def forward_same_tiles() -> None:
        # as many batches as the extraction, back to back: both timings span the same
        # stretch of time, so a best-of over a noisy machine favours neither
        for _ in range(n_batches):
            one_batch()

    with tempfile.TemporaryDirectory() as tmp:
        coords = _slide_coords(Path(tmp) / "coords.h5", n_tiles)
        pair = interleaved_best(
            {
                "extract": lambda: extract_slide(SLIDE, coords, Path(tmp) / "features.h5", backbone,
                                                 batch_size=batch, workers=args.workers, progress=False),
                "forward": forward_same_tiles,
            },
            device,
            rounds=2,
        )
    extract_tps, forward_pair = n_tiles / pair["extract"], n_tiles / pair["forward"]
    result["extract"] = {
        "tiles": n_tiles, "tiles_per_s": round(extract_tps, 3), "forward_alone_same_rounds": round(forward_pair, 3),
        "batch_size": batch, "workers": args.workers if args.workers is not None else default_workers(),
    }

    # (d) bf16
    if cuda or cpu_has_bf16():
        model16 = build_timm_model(spec, depth=12).to(device=device, dtype=torch.bfloat16)
        pair16 = interleaved_best(
            {"bf16": forward_call(model16, batch, prefix, device, torch.bfloat16), "fp32": calls[12]}, device, rounds=2
        )
        del model16
        tiles = real_tiles(16)
        bf16: dict[str, Any] = {
            "tiles_per_s": round(batch / pair16["bf16"], 3),
            "speedup_vs_fp32": round(pair16["fp32"] / pair16["bf16"], 3),
            "min_cosine_h0_mini_random": round(bf16_check(backbone, tiles, device), 6),
        }
        if VIT_S.exists():
            vit_s = create_backbone("vit-s14-imgfocus", weights=VIT_S, device=device)
            bf16["min_cosine_vit_s_real"] = round(bf16_check(vit_s, tiles, device), 6)
        result["bf16"] = bf16
    else:
        result["bf16"] = "not supported by this CPU (no avx512_bf16/amx_bf16)"

    speedup5 = forward[5] / forward[12] if 5 in forward else None
    mac_ratio5 = macs[12] / macs[5] if 5 in macs else None
    result["ratios"] = {
        "forward_fraction_of_peak_12": result["forward"]["depths"]["12"]["fraction_of_peak"],
        "speedup_5_vs_12": round(speedup5, 3) if speedup5 else None,
        "mac_ratio_12_over_5": round(mac_ratio5, 3) if mac_ratio5 else None,
        "speedup_fraction_of_mac_ratio": round(speedup5 / mac_ratio5, 3) if speedup5 else None,
        "extract_over_forward": round(extract_tps / forward_pair, 3),
    }
    r = result["ratios"]
    result["targets_met"] = {
        "forward >= 0.60 of matmul peak": r["forward_fraction_of_peak_12"] >= 0.60,
        "5-layer speed-up >= 0.90 of MAC ratio": bool(speedup5 and r["speedup_fraction_of_mac_ratio"] >= 0.90),
        "extract >= 0.85 of forward": r["extract_over_forward"] >= 0.85,
    }
    if isinstance(result["bf16"], dict):
        cos = result["bf16"].get("min_cosine_vit_s_real", result["bf16"]["min_cosine_h0_mini_random"])
        result["bf16_default_ok (cosine >= 0.999)"] = cos >= 0.999
    print(json.dumps(result, indent=2))
    return 0


def _transform(spec):
    from pathtwt.models.transform import TileTransform

    return TileTransform(input_size=spec.input_size, mean=spec.mean, std=spec.std)


if __name__ == "__main__":
    sys.exit(main())
