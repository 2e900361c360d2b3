"""Compare compression methods on the real pretrained ViT-S/14 with real H&E tiles.

Every method compresses the same teacher (../shared/weights/vit_s14_imgfocus.safetensors)
to each depth with the SAME distillation budget (steps x batch size, same calibration
tiles, same seed) and is scored on the same held-out tiles by the cosine between its tile
embedding (concat CLS, mean patch token) and the teacher's, before and after distillation.
Tiles: a tissue grid of CMU-1-Small-Region.svs (real slide, 20x), crops of the he-images
PNGs, and the labelled Kather / NCT-CRC-HE tiles, drawn together by the calibration
sampler with a seeded held-out split. Discovery (the merge plan) runs once per depth and is
shared by the methods that use one.

Also printed: the starting fidelity of the TWT student with auditioned versus random
surrogate layers, parameters and MACs per tile (pathtwt.models.flops) and tiles/s
measured here (batch 16, this machine, after one warm-up batch). Depth K means: K layers
(twt, truncation, wdpruning, subset), K blocks (linear: a linear map per multi-layer block;
raptor: K shared layers run recurrently to the teacher's 12), or K layers keeping their
attention out of 12 (nose with ``keep_attention=K``; the paper's NOSE, attention removed
from all 12, is ``pathtwt compress --method nose`` without options); params and MACs say
what each costs.

    python benchmarks/compare_methods.py                      # every method at depths 6 and 4
    python benchmarks/compare_methods.py --methods twt truncation raptor --depths 6 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
METHODS = ["twt", "truncation", "raptor", "wdpruning", "nose", "linear", "subset"]
# method-specific settings (CompressOptions.extra) sized for a CPU run: the subset search
# scores L + 4 candidates with 3 distillation steps each before its full-budget run
METHOD_EXTRA = {"subset": {"search_budget": 16, "search_steps": 3}}
SHARED = REPO.parent / "shared"


def tissue_coords(slide_path: Path, out: Path, patch: int = 224) -> Path:
    """A coords file of the non-background 224 px level-0 squares of a slide."""
    from pathtwt.io.h5 import write_coords
    from pathtwt.wsi.slides import open_slide

    with open_slide(slide_path) as slide:
        w, h = slide.dimensions
        keep = []
        for y in range(0, h - patch + 1, patch):
            for x in range(0, w - patch + 1, patch):
                if slide.read_region(x, y, 0, patch, patch).mean() < 215:  # not white background
                    keep.append((x, y))
        attrs = dict(patch_size=patch, patch_size_level0=patch, target_mpp=slide.mpp, level0_mpp=slide.mpp, read_level=0,
                     level0_width=w, level0_height=h, target_magnification=10.0 / slide.mpp, status="ok",
                     slide_path=str(slide_path))
    write_coords(out, np.array(keep), np.ones(len(keep)), attrs)
    return out


def tiles_per_second(model: torch.nn.Module, input_size: int, batch: int = 16, repeats: int = 2) -> float:
    x = torch.randn(batch, 3, input_size, input_size)
    with torch.no_grad():
        model.eval().forward_features(x[:2])
        start = time.perf_counter()
        for _ in range(repeats):
            model.forward_features(x)
    return batch * repeats / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=list(METHODS), help="registry names (pathtwt.compress.registry)")
    p.add_argument("--depths", nargs="+", type=int, default=[6, 4])
    p.add_argument("--steps", type=int, default=100, help="distillation steps per method (the shared budget)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--audition-steps", type=int, default=5)
    p.add_argument("--n-tiles", type=int, default=72, help="calibration tiles drawn (fit + holdout)")
    p.add_argument("--holdout", type=float, default=1 / 3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--schedule", choices=("on", "off"), default=None,
                   help="TWT loss-weight ramp and branch scalars (default: the backbone's, on for this natural-image ViT)")
    p.add_argument("--progress", action="store_true", help="progress bars of the distillation runs")
    p.add_argument("--work", type=Path, default=None, help="keep the variant folders here (default: a temp dir)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from pathtwt.models.registry import create_backbone
    from pathtwt.compress.calibration import load_calibration
    from pathtwt.compress.fidelity import evaluate_fidelity
    from pathtwt.models.flops import count_macs, count_params
    from pathtwt.compress.pipeline import CompressOptions, resolve_plan
    from pathtwt.compress.registry import get_method
    from pathtwt.compress.twt import build_twt_student
    from pathtwt.io.atomic import write_json_atomic

    weights = SHARED / "weights" / "vit_s14_imgfocus.safetensors"
    if not weights.exists():
        print(f"needs {weights} (../shared beside the repository)", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="pathtwt-compare-"))
    teacher = create_backbone("vit-s14-imgfocus", weights=weights)
    tiles_dir = SHARED / "data" / "tiles"
    sources = [tissue_coords(SHARED / "data" / "slides" / "CMU-1-Small-Region.svs", work / "coords" / "CMU-1-Small-Region.h5"),
               tiles_dir / "he-images", tiles_dir / "kather2016", tiles_dir / "nct-crc-he"]
    calib = load_calibration(sources, n_tiles=args.n_tiles, seed=args.seed, holdout=args.holdout, patch_size=224)
    print(f"teacher vit-s14-imgfocus (real weights), {len(calib.fit)} fit + {len(calib.holdout)} held-out tiles, "
          f"budget {args.steps} steps x batch {args.batch_size}, {torch.get_num_threads()} threads", flush=True)

    ramp = None if args.schedule is None else args.schedule == "on"

    def options(method: str, depth: int, **kw) -> CompressOptions:
        return CompressOptions(schedule=ramp, layer_scale=ramp, out=work / f"{method}-{depth}", depth=depth, steps=args.steps, batch_size=args.batch_size,
                               audition_steps=args.audition_steps, augment=False, seed=args.seed, progress=args.progress, **kw)

    ps = teacher.spec.num_prefix_tokens
    rows = [{"method": "teacher", "depth": 12, "cos_init": 1.0, "cos_final": 1.0, "params": count_params(teacher.model),
             "macs": count_macs(teacher.model, 224), "tiles_s": tiles_per_second(teacher.model, 224)}]
    starts = []
    for depth in args.depths:
        plan = resolve_plan(teacher, calib, options("twt", depth))
        plan_path = work / f"plan-{depth}.json"
        write_json_atomic(plan_path, plan)
        print(f"depth {depth}: blocks {plan['blocks']}", flush=True)
        # the auditioned start is the TWT run's own initial fidelity; random surrogates here
        student, _ = build_twt_student(teacher, calib, plan, options("twt", depth, init="random"))
        fid = evaluate_fidelity(student, teacher.model, calib.holdout, transform=teacher.transform, num_prefix_tokens=ps)
        starts.append((depth, "random", fid["embedding_cosine_mean"]))
        for method in args.methods:
            t0 = time.perf_counter()
            opts = options(method, depth, plan=plan_path, extra=METHOD_EXTRA.get(method, {}))
            if method == "nose":  # NOSE keeps all 12 layers: K is the number keeping attention
                opts = dataclasses.replace(opts, depth=None, plan=None, extra={"keep_attention": depth})
            out = get_method(method)(teacher, calib, opts)
            meta = json.loads((Path(out) / "model.json").read_text())
            variant = create_backbone(out)
            rows.append({"method": method, "depth": depth,
                         "cos_init": meta["fidelity"]["initial"]["embedding_cosine_mean"],
                         "cos_final": meta["fidelity"]["final"]["embedding_cosine_mean"],
                         "params": meta["params"], "macs": meta["macs_per_tile"],
                         "tiles_s": tiles_per_second(variant.model, 224), "minutes": (time.perf_counter() - t0) / 60})
            print(f"  {method}-{depth} done in {rows[-1]['minutes']:.1f} min", flush=True)
            if method == "twt":
                starts.append((depth, "audition", rows[-1]["cos_init"]))

    print()
    print("| method | depth | held-out cosine at init | after distillation | params (M) | MACs/tile (G) | tiles/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['depth']} | {r['cos_init']:.4f} | {r['cos_final']:.4f} | {r['params'] / 1e6:.2f} "
              f"| {r['macs'] / 1e9:.2f} | {r['tiles_s']:.1f} |")
    print()
    print("| depth | TWT start: random surrogates | TWT start: auditioned |")
    print("|---|---|---|")
    for depth in args.depths:
        got = {init: f"{c:.4f}" for d, init, c in starts if d == depth}
        print(f"| {depth} | {got['random']} | {got.get('audition', 'n/a (twt not run)')} |")
    by = {(r["method"], r["depth"]): r["cos_final"] for r in rows}
    if "twt" in args.methods and "truncation" in args.methods:
        for depth in args.depths:
            verdict = "beats" if by[("twt", depth)] > by[("truncation", depth)] else "does NOT beat"
            print(f"depth {depth}: TWT {verdict} truncation ({by[('twt', depth)]:.4f} vs {by[('truncation', depth)]:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
