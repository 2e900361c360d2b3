"""Extraction of a cohort against the model alone: is extraction model-bound?

A cohort of small slides (coords files over the real CMU-1-Small-Region, 20-60 tiles
each, as biopsies and PANDA's small slides are) is extracted by one ``extract_many`` call
per backbone variant, as one extraction job of the workflow does: first the 12-layer
teacher architecture, then its 6-layer variant (random weights). Each is compared with
the same number of tiles forwarded in memory at the same batch size by the same model
(the model-only time), measured right after it. Prints one JSON object with the ratios
extract / model-only (1.0: reading costs nothing beside the model).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/extract_variants.py [--backbone vit-s14-imgfocus]
    ... --against main --depths 6     # the extraction of git ref `main` too, interleaved

With ``--against REF`` every round runs REF's ``pathtwt/features/extract.py``, this
checkout's and the model alone back to back, so a load that drifts during the run (a
shared machine) weighs on all three alike.

Measures: a cohort of small slides extracted by one extract_many call per backbone variant (the teacher's
depth, then a student's) against the same tiles forwarded in memory: whether extraction is model-bound.
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/extract_variants.py --backbone vit-s14-tiny --depths
12,6 --rounds 1 --batch-size 8` (smallest); `PYTHONPATH=$PWD .venv/bin/python benchmarks/extract_variants.py`
(ViT-S architecture); `... --against main --depths 6`. Needs ../shared.
JSON keys: printed on stdout: `machine`, `cohort` {slides, tiles}, `batch_size`, `workers`, `variants`
(`first`, `second`: depth, extract_s, model_only_s, ratio = extract / model-only, first_round_*, and with
--against the other code's); `skipped` alone when the slide is absent.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PATHTWT_SHARED", REPO.parent / "shared"))
SLIDE = SHARED / "data" / "slides" / "CMU-1-Small-Region.svs"
SIZES = (20, 40, 60, 30, 50, 25, 45, 50)  # tiles per slide of the cohort


def cohort(folder: Path, tile: int) -> list:
    from pathtwt.features.extract import ExtractJob
    from pathtwt.io import h5 as h5io

    grid = [(x, y) for y in range(0, 2967 - tile + 1, tile) for x in range(0, 2220 - tile + 1, tile)]
    jobs = []
    for i, n in enumerate(SIZES):
        xy = np.array([grid[(i * 7 + k) % len(grid)] for k in range(n)], dtype=np.int64)
        attrs = dict(patch_size=tile, patch_size_level0=tile, target_mpp=0.499, level0_mpp=0.499, read_level=0,
                     level0_width=2220, level0_height=2967, target_magnification=20.0, status="ok",
                     slide_path=str(SLIDE))
        coords = folder / f"slide{i}.coords.h5"
        h5io.write_coords(coords, xy, np.ones(len(xy)), attrs)
        jobs.append(ExtractJob(SLIDE, coords, folder / f"slide{i}.h5"))
    return jobs


def model_only_seconds(backbone, n_tiles: int, batch: int) -> float:
    from pathtwt.models.embedding import embed_tiles

    x = torch.randn(batch, 3, backbone.spec.input_size, backbone.spec.input_size)
    start = time.perf_counter()
    with torch.inference_mode():
        for done in range(0, n_tiles, batch):
            embed_tiles(backbone.model, x[: min(batch, n_tiles - done)], backbone.spec.num_prefix_tokens)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    from pathtwt.devices import reading_workers as default_workers
    from pathtwt.features.extract import extract_many
    from pathtwt.models.registry import create_backbone

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbone", default="vit-s14-imgfocus")
    ap.add_argument("--depths", default="12,6", help="the first and the second variant")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2, help="best of this many (extract, model-only) pairs")
    ap.add_argument("--against", default=None, help="a git ref whose extraction is timed in the same rounds")
    args = ap.parse_args(argv)
    others = {}
    if args.against:
        import importlib.util
        import subprocess

        source = subprocess.run(["git", "show", f"{args.against}:pathtwt/features/extract.py"], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout
        path = Path(tempfile.mkdtemp()) / "extract_before.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("extract_before", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["extract_before"] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        others[args.against] = module.extract_many
    if not SLIDE.is_file():
        print(json.dumps({"skipped": f"{SLIDE} absent"}))
        return 0
    n_tiles = sum(SIZES)
    result = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": len(os.sched_getaffinity(0)),
                          "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                          "load_average": os.getloadavg()[0]},
              "cohort": {"slides": len(SIZES), "tiles": n_tiles}, "batch_size": args.batch_size,
              "workers": args.workers if args.workers is not None else default_workers(), "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for which, depth in zip(("first", "second"), (int(d) for d in args.depths.split(","))):
            torch.manual_seed(0)
            backbone = create_backbone(args.backbone, pretrained=False, device="cpu", precision="fp32")
            backbone.model.blocks = backbone.model.blocks[:depth]  # a variant of that depth (its first layers)
            jobs = cohort(Path(tmp), backbone.spec.input_size)
            best_extract = best_model = float("inf")
            first_extract = None
            best_other = {ref: float("inf") for ref in others}
            for _ in range(args.rounds):
                for ref, other in others.items():
                    other_jobs = [sys.modules["extract_before"].ExtractJob(j.slide, j.coords, j.out) for j in jobs]
                    start = time.perf_counter()
                    other(other_jobs, backbone, batch_size=args.batch_size, workers=args.workers, progress=False)
                    best_other[ref] = min(best_other[ref], time.perf_counter() - start)
                start = time.perf_counter()
                extract_many(jobs, backbone, batch_size=args.batch_size, workers=args.workers, progress=False)
                seconds = time.perf_counter() - start
                first_extract = seconds if first_extract is None else first_extract
                best_extract = min(best_extract, seconds)
                best_model = min(best_model, model_only_seconds(backbone, n_tiles, args.batch_size))
            result["variants"][which] = {
                "depth": depth, "extract_s": round(best_extract, 3), "first_round_extract_s": round(first_extract, 3),
                "model_only_s": round(best_model, 3), "ratio": round(best_extract / best_model, 3),
                "first_round_ratio": round(first_extract / best_model, 3),
                **{f"{ref}_extract_s": round(t, 3) for ref, t in best_other.items()},
                **{f"{ref}_ratio": round(t / best_model, 3) for ref, t in best_other.items()},
            }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
