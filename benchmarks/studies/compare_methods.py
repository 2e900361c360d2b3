"""Compare compression methods on the real pretrained ViT-S/14 with real H&E tiles.

Every method compresses the same teacher (../shared/weights/vit_s14_imgfocus.safetensors)
to each depth with the SAME distillation budget (steps x batch size, same fit tiles, same
seed). Fidelity is measured on the calibration set's REPORT split, which nothing chooses
on (auditioning, the subset search and NOSE's layer choice read the SELECT split only), by
the centred numbers of pathtwt.compress.fidelity: embedding R^2 (teacher 1, the constant
teacher fit mean ~0), linear CKA, centred cosine, and the uncentred cosine as a secondary
column. Reference rows on the same tiles: the teacher, the constant fit mean and a
random-init network of the teacher's architecture.

Calibration pool: every tissue tile of the real slide CMU-1-Small-Region.svs (pathtwt's
tiler, 0.5 mpp, 224 px; small.svs holds no tissue tile) and the he-images crops, split
seeded into fit / select / report. No lc25000-lung tile is in it.

Downstream check: a tile probe on lc25000-lung (../shared/data/tiles/lc25000-lung, its
split.csv): a seeded, class-balanced subset of its train and test tiles (sized for this
CPU), standardised embeddings, scikit-learn LogisticRegression (C=1), balanced accuracy
on the test tiles.

Subset search controls: the searched subset (local search, scored on select by R^2 after
a short distillation), the single-deletion ranking's subset and the random-search best at
the same budget, each distilled with the full budget and reported on report.

Depth K means: K layers (twt, truncation, wdpruning, subset), K blocks (linear: a linear
map per multi-layer block; raptor: K shared layers run recurrently to the teacher's 12),
or K layers keeping their attention out of 12 (nose with ``keep_attention=K``; the paper's
NOSE, attention removed from all 12, is ``pathtwt compress --method nose`` without
options); params and MACs say what each costs.
tiles/s: batch 8 forward on this machine after a warm-up (load-dependent).

    python benchmarks/studies/compare_methods.py                      # every method at depths 6 and 4
    python benchmarks/studies/compare_methods.py --methods twt truncation --depths 6
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
METHODS = ["twt", "truncation", "linear", "wdpruning", "subset", "raptor", "nose"]  # cheapest first
SHARED = REPO.parent / "shared"
REAL_SLIDES = ["CMU-1-Small-Region.svs", "small.svs"]  # the other files in data/slides are test fixtures


def tissue_coords(slide_path: Path, out: Path) -> Path:
    """A coords file of the slide's tissue tiles by pathtwt's own tiler (0.5 mpp, 224 px)."""
    from pathtwt.io.h5 import write_coords
    from pathtwt.wsi.slides import open_slide
    from pathtwt.wsi.tiling import tile_slide

    with open_slide(slide_path) as slide:
        tiling = tile_slide(slide, target_mpp=0.5, tile_size=224)
    write_coords(out, tiling.coords, tiling.tissue_fraction, tiling.attrs)
    return out


def tiles_per_second(model: torch.nn.Module, input_size: int, batch: int = 8, repeats: int = 1) -> float:
    x = torch.randn(batch, 3, input_size, input_size)
    with torch.no_grad():
        model.eval().forward_features(x[:2])
        start = time.perf_counter()
        for _ in range(repeats):
            model.forward_features(x)
    return batch * repeats / (time.perf_counter() - start)


class Probe:
    """lc25000-lung tile probe: a class-balanced seeded subset of its train/test split."""

    def __init__(self, root: Path, per_class_train: int, per_class_test: int, seed: int) -> None:
        from PIL import Image

        with open(root / "split.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        rng = np.random.default_rng(seed)
        self.images, self.labels, self.is_test = [], [], []
        classes = sorted({r["path"].split("/")[0] for r in rows})
        for split, n in (("train", per_class_train), ("test", per_class_test)):
            for ci, cls in enumerate(classes):
                pool = sorted(r["path"] for r in rows if r["split"] == split and r["path"].startswith(cls + "/"))
                for rel in sorted(rng.choice(pool, size=min(n, len(pool)), replace=False)):
                    with Image.open(root / rel) as im:
                        self.images.append(np.asarray(im.convert("RGB").resize((224, 224))))
                    self.labels.append(ci)
                    self.is_test.append(split == "test")
        self.labels, self.is_test = np.array(self.labels), np.array(self.is_test)
        self.images = np.stack(self.images)

    @torch.no_grad()
    def embeddings(self, model: torch.nn.Module, transform, num_prefix_tokens: int, batch: int = 16) -> np.ndarray:
        from pathtwt.compress.intermediates import tiles_to_batch
        from pathtwt.models.embedding import embed_tiles

        model.eval()
        return np.concatenate([embed_tiles(model, tiles_to_batch(transform, self.images[i : i + batch], "cpu"),
                                           num_prefix_tokens).numpy() for i in range(0, len(self.images), batch)])

    def balanced_accuracy(self, features: np.ndarray) -> float:
        from sklearn.linear_model import LogisticRegression
        from sklearn.metrics import balanced_accuracy_score
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        clf = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000))
        clf.fit(features[~self.is_test], self.labels[~self.is_test])
        return float(balanced_accuracy_score(self.labels[self.is_test], clf.predict(features[self.is_test])))


def fmt(v, spec=".4f") -> str:
    return "-" if v is None or (isinstance(v, float) and np.isnan(v)) else format(v, spec)


def table_row(r: dict) -> str:
    f = r["fid"]
    return (f"| {r['method']} | {r['depth']} | {fmt(f['r2'])} | {fmt(f['cka'])} | {fmt(f['centred_cosine'])} | {fmt(f['cosine'])} "
            f"| {fmt(r.get('r2_init'))} | {fmt(r['probe'], '.3f')} | {r['params'] / 1e6:.2f} | {r['macs'] / 1e9:.2f} "
            f"| {fmt(r['tiles_s'], '.1f')} |")


def reference_rows(teacher, calib, probe: Probe, seed: int) -> list[dict]:
    """Teacher, constant teacher fit mean and random-init teacher: fidelity on the report
    tiles and probe accuracy (the constant gives every probe tile the same vector)."""
    from pathtwt.compress.fidelity import random_init_model, references
    from pathtwt.models.flops import count_macs, count_params

    ps = teacher.spec.num_prefix_tokens
    refs = references(teacher, calib, seed=seed)
    teacher_params, teacher_macs = count_params(teacher.model), count_macs(teacher.model, 224)
    teacher_feats = probe.embeddings(teacher.model, teacher.transform, ps)
    constant = np.broadcast_to(teacher_feats.mean(0), teacher_feats.shape).copy()
    random_feats = probe.embeddings(random_init_model(teacher.spec, seed), teacher.transform, ps)
    return [
        {"method": "teacher", "depth": 12, "fid": refs["teacher"], "params": teacher_params, "macs": teacher_macs,
         "tiles_s": tiles_per_second(teacher.model, 224), "probe": probe.balanced_accuracy(teacher_feats)},
        {"method": "constant (teacher fit mean)", "depth": "-", "fid": refs["constant"], "params": 0, "macs": 0,
         "tiles_s": float("nan"), "probe": probe.balanced_accuracy(constant)},
        {"method": "random-init teacher", "depth": 12, "fid": refs["random_init"], "params": teacher_params,
         "macs": teacher_macs, "tiles_s": float("nan"), "probe": probe.balanced_accuracy(random_feats)},
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=list(METHODS), help="registry names (pathtwt.compress.registry)")
    p.add_argument("--depths", nargs="+", type=int, default=[6, 4])
    p.add_argument("--steps", type=int, default=16, help="distillation steps per method (the shared budget)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--audition-steps", type=int, default=2)
    p.add_argument("--holdout", type=float, default=0.5, help="share of the pool kept out of fitting (half select, half report)")
    p.add_argument("--subset-budget", type=int, default=15, help="subset search: distinct subsets scored (>= L + 1)")
    p.add_argument("--subset-steps", type=int, default=1, help="subset search: distillation steps per candidate")
    p.add_argument("--no-subset-controls", action="store_true", help="skip the ranking and random-search controls")
    p.add_argument("--probe-train", type=int, default=8, help="lc25000-lung train tiles per class")
    p.add_argument("--probe-test", type=int, default=8, help="lc25000-lung test tiles per class")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--schedule", choices=("on", "off"), default=None,
                   help="TWT loss-weight ramp and branch scalars (default: the backbone's, on for this natural-image ViT)")
    p.add_argument("--progress", action="store_true", help="progress bars of the distillation runs")
    p.add_argument("--work", type=Path, default=None, help="keep the variant folders here (default: a temp dir)")
    p.add_argument("--skip-references", action="store_true",
                   help="no teacher / constant / random-init rows (when another run with the same seed printed them)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    from pathtwt.compress.calibration import load_calibration
    from pathtwt.compress.methods.subset import control_subsets, distill_subset
    from pathtwt.compress.pipeline import CompressOptions, resolve_plan
    from pathtwt.compress.registry import get_method
    from pathtwt.io.atomic import write_json_atomic
    from pathtwt.models.registry import create_backbone

    weights = SHARED / "weights" / "vit_s14_imgfocus.safetensors"
    if not weights.exists():
        print(f"needs {weights} (../shared beside the repository)", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="pathtwt-compare-"))
    (work / "coords").mkdir(parents=True, exist_ok=True)
    teacher = create_backbone("vit-s14-imgfocus", weights=weights)
    ps = teacher.spec.num_prefix_tokens
    sources = [tissue_coords(SHARED / "data" / "slides" / name, work / "coords" / f"{Path(name).stem}.h5") for name in REAL_SLIDES]
    sources.append(SHARED / "data" / "tiles" / "he-images")
    calib = load_calibration(sources, n_tiles=None, seed=args.seed, holdout=args.holdout, resize_to=224)
    splits = calib.splits_record()
    probe = Probe(SHARED / "data" / "tiles" / "lc25000-lung", args.probe_train, args.probe_test, args.seed)
    print(f"teacher vit-s14-imgfocus (real weights); calibration pool {len(calib.all)} tiles from {len(calib.sources)} "
          f"sources: {splits['fit']} fit / {splits['select']} select / {splits['report']} report (seed {args.seed}); "
          f"budget {args.steps} steps x batch {args.batch_size}; probe lc25000-lung {int((~probe.is_test).sum())} train / "
          f"{int(probe.is_test.sum())} test tiles; {torch.get_num_threads()} threads", flush=True)

    ramp = None if args.schedule is None else args.schedule == "on"

    def options(method: str, depth: int, out: str | None = None, **kw) -> CompressOptions:
        return CompressOptions.from_flat(schedule=ramp, layer_scale=ramp, out=work / (out or f"{method}-{depth}"), depth=depth,
                               steps=args.steps, batch_size=args.batch_size, audition_steps=args.audition_steps,
                               augment=False, seed=args.seed, progress=args.progress, **kw)

    def probe_of(model: torch.nn.Module) -> float:
        return probe.balanced_accuracy(probe.embeddings(model, teacher.transform, ps))

    rows = [] if args.skip_references else reference_rows(teacher, calib, probe, args.seed)
    for r in rows:
        print(f"  {table_row(r)}", flush=True)
    print(f"references done ({(time.perf_counter() - started) / 60:.1f} min)", flush=True)
    controls = []

    def add_row(method: str, depth: int, out: Path, t0: float, **more) -> dict:
        meta = json.loads((Path(out) / "model.json").read_text())
        variant = create_backbone(out)
        row = {"method": method, "depth": depth, "fid": meta["fidelity"]["final"], "r2_init": meta["fidelity"]["initial"]["r2"],
               "params": meta["params"], "macs": meta["macs_per_tile"], "tiles_s": tiles_per_second(variant.model, 224),
               "probe": probe_of(variant.model), "minutes": (time.perf_counter() - t0) / 60, **more}
        assert meta["fidelity"]["on"] == "report"
        print(f"  {table_row(row)}  ({row['minutes']:.1f} min, {(time.perf_counter() - started) / 60:.1f} min in all)", flush=True)
        return row

    for depth in args.depths:
        plan = resolve_plan(teacher, calib, options("twt", depth))
        plan_path = work / f"plan-{depth}.json"
        write_json_atomic(plan_path, plan)
        print(f"depth {depth}: blocks {plan['blocks']}", flush=True)
        for method in args.methods:
            t0 = time.perf_counter()
            extra = {}
            if method == "subset":
                extra = {"search_budget": args.subset_budget, "search_steps": args.subset_steps,
                         "random_control": not args.no_subset_controls}
            opts = options(method, depth, plan=plan_path, extra=extra)
            if method == "nose":  # NOSE keeps all 12 layers: K is the number keeping attention
                opts = dataclasses.replace(opts, depth=None, plan=None, extra={"keep_attention": depth})
            out = get_method(method)(teacher, calib, opts)
            rows.append(add_row(method, depth, out, t0))
            if method == "subset":
                record = json.loads((Path(out) / "subset_search.json").read_text())
                rows[-1]["select_r2"] = record["local"]["best_score"]
                rows[-1]["layers"] = record["local"]["best_layers"]
                if args.no_subset_controls:
                    continue
                for name, subset in control_subsets(record).items():
                    t0 = time.perf_counter()
                    if list(subset) == [i - 1 for i in record["local"]["best_layers"]]:  # same choice: same model
                        controls.append({**rows[-1], "method": f"subset control: {name}", "select_r2": rows[-1]["select_r2"]})
                        continue
                    cout = distill_subset(teacher, calib, options("subset", depth, out=f"subset-{name}-{depth}"), subset,
                                          {"subset_control": name})
                    score = record["local"]["start_score"] if name == "ranking" else record["random"]["best_score"]
                    controls.append(add_row(f"subset control: {name}", depth, cout, t0, select_r2=score,
                                            layers=[i + 1 for i in subset]))

    print()
    print("| method | depth | R² (report) | CKA | centred cosine | cosine (uncentred) | R² at init | lc25000 bal. acc. | params (M) | MACs/tile (G) | tiles/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows + controls:
        print(table_row(r))
    subset_rows = [r for r in rows + controls if "layers" in r]
    if subset_rows:
        print()
        print("| subset choice | depth | layers kept | R² on select (short run) | R² on report (full run) |")
        print("|---|---|---|---|---|")
        for r in subset_rows:
            name = "local search" if r["method"] == "subset" else r["method"].split(": ")[1]
            print(f"| {name} | {r['depth']} | {r['layers']} | {fmt(r['select_r2'])} | {fmt(r['fid']['r2'])} |")
    print()
    print("block R² on report (teacher layer matched by each student block):")
    for r in rows + controls:
        if r["fid"].get("block_r2"):
            print(f"  {r['method']}-{r['depth']}: " + " ".join(fmt(v, ".3f") for v in r["fid"]["block_r2"]))
    by = {(r["method"], r["depth"]): r for r in rows}
    if "twt" in args.methods and "truncation" in args.methods:
        for depth in args.depths:
            a, b = by[("twt", depth)], by[("truncation", depth)]
            verdict = "beats" if a["fid"]["r2"] > b["fid"]["r2"] else "does NOT beat"
            print(f"depth {depth}: TWT {verdict} truncation on report R² ({a['fid']['r2']:.4f} vs {b['fid']['r2']:.4f}; "
                  f"probe {a['probe']:.3f} vs {b['probe']:.3f})")
    print(f"total {(time.perf_counter() - started) / 60:.1f} min; variant folders in {work}")
    write_json_atomic(work / "compare_methods.json", {"args": {k: str(v) for k, v in vars(args).items()}, "splits": splits,
                                                      "rows": rows + controls})
    return 0


if __name__ == "__main__":
    sys.exit(main())
