"""Budget curve on real tissue (BACH): fidelity and a slide-level probe of distilled
ViT-S students as functions of the distillation budget (steps) and of the number of
training tiles, for twt-6 and truncation-6, with teacher / constant / random-init rows.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/studies/bach_budget_curve.py --out benchmarks/studies/results/bach_curve \\
        [--speed] [--runs twt:variance:600:150 twt:none:600:150 truncation:variance:600:150 ...] [--checkpoints 25,50,100,150]

Images: ``../shared/data/bach`` (200 JPEGs, 1536 px at 0.42 um/px, 4 classes). One fixed,
seeded, class-stratified split of the images (30 / 10 / 10 per class): train images give
the distillation tiles, the fidelity centre (the teacher's mean over train tiles) and the
probe's fit; validation images are where anything is chosen (the loss norm, the probe's
C, the recipe); test images are reported, with a bootstrap 95 % interval over images.
Tiles: a 5 x 5 grid of 267 px crops per image (112 um, i.e. 224 px at 0.5 um/px), resized
to 224 px with PIL; the probe and the fidelity use the 9 central tiles of every image, the
distillation draws from all 25 tiles of the train images. ``--probe-tiles`` 1 | 4 | 9
central tiles per image (default 9; fewer when the CPU is busy: every scored model embeds
them all).

A run ``METHOD:NORM:TILES:STEPS[:C1/C2...]`` distils METHOD (twt | truncation) at depth 6 with loss
norm NORM on TILES training tiles for STEPS optimiser steps of --batch-size tiles
(augmentation off, so the teacher's targets are computed once per tile), and is scored at
every --checkpoints step (or its own C1/C2...) < STEPS and at STEPS, by resuming the same run (same cosine schedule to
STEPS, so an early checkpoint is the state of the long run, not of a short run: a lower
bound for a run of that length). ``--speed`` measures steps/s of twt-6 at --batch-size in
fp32 and bf16 with the teacher's targets cached and recomputed every step.
Prints tables and writes ``TAG.csv``, ``TAG.json`` (--tag, default curve) (and ``speed.json``) under --out.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
SHARED = Path(os.environ.get("PATHTWT_SHARED", REPO.parent / "shared"))
BACH = SHARED / "data" / "bach"
CROP, GRID, TILE = 267, 5, 224  # 267 px at 0.42 um/px = 112 um = 224 px at 0.5 um/px
CENTRE_TILE = 12  # the grid's middle tile
PROBE_TILES = {1: [12], 4: [6, 7, 11, 12], 9: [r * GRID + c for r in (1, 2, 3) for c in (1, 2, 3)]}  # central tiles
PER_CLASS = (30, 10, 10)  # train / val / test images per class
C_GRID = (0.01, 0.1, 1.0, 10.0)  # the probe's inverse regularisation, chosen on validation


def image_tiles(path: Path) -> np.ndarray:
    """The 25 grid tiles of one BACH image, (25, 224, 224, 3) uint8."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB")
        off = (im.width - GRID * CROP) // 2, (im.height - GRID * CROP) // 2
        out = [np.asarray(im.crop((off[0] + c * CROP, off[1] + r * CROP, off[0] + (c + 1) * CROP, off[1] + (r + 1) * CROP))
                          .resize((TILE, TILE), Image.BILINEAR)) for r in range(GRID) for c in range(GRID)]
    return np.stack(out)


def split_images(seed: int, holdout: float | None = None, folds: int = 5) -> dict[str, list[tuple[str, int]]]:
    """train / val / test images (30 / 10 / 10 per class), or with ``holdout`` the
    study's compression-only hold-out (``pathtwt.mil.folds.assign_folds`` with the study's
    folds, seed and hold-out fraction: the images no fold reports on) split 3 : 1 per
    class into train and val, and no test images."""
    rows = list(csv.DictReader(open(BACH / "labels.csv")))
    rng = np.random.default_rng(seed)
    out: dict[str, list[tuple[str, int]]] = {"train": [], "val": [], "test": []}
    if holdout is not None:
        from pathtwt.mil.folds import HOLDOUT, assign_folds

        ids, labels = [r["slide_id"] for r in rows], [int(r["label"]) for r in rows]
        fold = assign_folds(ids, labels, folds, seed, None, holdout)
        rows = [r for r, f in zip(rows, fold) if f == HOLDOUT]
    for label in sorted({int(r["label"]) for r in rows}):
        ids = sorted(r["slide_id"] for r in rows if int(r["label"]) == label)
        ids = [ids[i] for i in rng.permutation(len(ids))]
        if holdout is not None:
            n_val = max(1, -(-len(ids) // 4))  # a quarter, rounded up
            parts = (("train", ids[n_val:]), ("val", ids[:n_val]))
        else:
            a, b = PER_CLASS[0], PER_CLASS[0] + PER_CLASS[1]
            parts = (("train", ids[:a]), ("val", ids[a:b]), ("test", ids[b:b + PER_CLASS[2]]))
        for name, part in parts:
            out[name] += [(i, label) for i in part]
    return out


def image_path(slide_id: str) -> Path:
    for ext in (".jpeg", ".jpg", ".png", ".tif"):
        p = BACH / "images" / f"{slide_id}{ext}"
        if p.exists():
            return p
    raise SystemExit(f"{BACH / 'images'}: no image for {slide_id} listed in labels.csv")


class Data:
    """Tiles of the split: train tiles for distillation, 9 central tiles per image for the
    probe and the fidelity."""

    def __init__(self, seed: int, probe_tiles: int = 9, holdout: float | None = None, folds: int = 5) -> None:
        self.central, self.holdout = PROBE_TILES[probe_tiles], holdout
        self.split = split_images(seed, holdout, folds)
        self.train_tiles, probe, self.image_split, self.labels = [], [], [], []
        for name in ("train", "val", "test"):
            for sid, label in self.split[name]:
                tiles = image_tiles(image_path(sid))
                if name == "train":
                    self.train_tiles.append(tiles)
                probe.append(tiles[self.central])
                self.image_split.append(name)
                self.labels.append(label)
        self.train_tiles = np.concatenate(self.train_tiles)  # image-major
        self.probe = np.concatenate(probe)
        self.image_split, self.labels = np.array(self.image_split), np.array(self.labels)
        self.tile_split = np.repeat(self.image_split, len(self.central))
        # the middle tile of every validation image (block R^2, audition choices)
        middle = np.tile(np.array(self.central) == CENTRE_TILE, len(self.labels))
        self.val_middle = self.probe[(self.tile_split == "val") & middle]

    def training(self, n: int, seed: int) -> np.ndarray:
        """``n`` training tiles drawn without replacement (seeded) across the train images."""
        idx = np.random.default_rng(seed).permutation(len(self.train_tiles))[:n]
        return self.train_tiles[np.sort(idx)]


def fidelity(student_emb: torch.Tensor, teacher_emb: torch.Tensor, centre: torch.Tensor) -> dict:
    from pathtwt.compress.fidelity import TeacherCentre, _Scores

    scores = _Scores(TeacherCentre(embedding=centre, layers=torch.zeros(1), n_tiles=0), [])
    scores.add(student_emb, teacher_emb, [], [])
    r = scores.result()
    return {"r2": r["r2"], "cka": r["cka"]}


def probe(emb: np.ndarray, data: Data, seed: int) -> dict:
    """Logistic probe on each image's mean tile embedding: fit on train images, C chosen on
    validation images, balanced accuracy on val and on test (with a bootstrap interval)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from pathtwt.mil.metrics import balanced_accuracy
    from pathtwt.probe.fit import bootstrap_interval

    x = emb.reshape(len(data.labels), len(data.central), -1).mean(1)
    y, s = data.labels, data.image_split
    best = None
    for c in C_GRID:
        model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=3000, random_state=seed))
        model.fit(x[s == "train"], y[s == "train"])
        val = balanced_accuracy(y[s == "val"], model.predict(x[s == "val"]))
        if best is None or val > best[0]:
            best = (val, c, model)
    val, c, model = best
    pred = model.predict(x[s == "test"])
    return {"probe_C": c, "val_bacc": float(val), "test_bacc": float(balanced_accuracy(y[s == "test"], pred)),
            "test_bacc_ci95": bootstrap_interval(y[s == "test"], pred, seed=seed)}


class Evaluator:
    def __init__(self, teacher, data: Data, *, batch_size: int, seed: int, cache: Path | None = None) -> None:
        from pathtwt.compress.fidelity import tile_embeddings

        self.teacher, self.data, self.bs, self.seed = teacher, data, batch_size, seed
        self.kw = dict(transform=teacher.transform, num_prefix_tokens=teacher.spec.num_prefix_tokens, batch_size=batch_size)
        t0 = time.perf_counter()
        design = "" if data.holdout is None else f"_holdout{data.holdout}"
        saved = None if cache is None else cache / f"teacher_embeddings_seed{seed}_probe{len(data.central)}{design}.pt"
        if saved is not None and saved.exists():
            self.t_emb = torch.load(saved)
        else:
            self.t_emb = tile_embeddings(teacher.model, data.probe, **self.kw)
            if saved is not None:
                from pathtwt.io.atomic import atomic_output

                with atomic_output(saved) as tmp:
                    torch.save(self.t_emb, tmp)
        self.teacher_seconds = time.perf_counter() - t0
        self.centre = self.t_emb[torch.from_numpy(data.tile_split == "train")].double().mean(0).float()

    def embeddings(self, model) -> torch.Tensor:
        from pathtwt.compress.fidelity import tile_embeddings

        return tile_embeddings(model, self.data.probe, **self.kw)

    def score(self, emb: torch.Tensor) -> dict:
        out = {}
        for name in ("val", "test"):
            m = torch.from_numpy(self.data.tile_split == name)
            if m.any():
                out.update({f"{name}_{k}": v for k, v in fidelity(emb[m], self.t_emb[m], self.centre).items()})
        if (self.data.image_split == "test").any():  # no probe on the hold-out design: it has no test images
            out.update(probe(emb.numpy(), self.data, self.seed))
        return out

    def block_r2(self, student, boundaries) -> list[float]:
        """Block R^2 at each student block on the central tile of every validation image."""
        from pathtwt.compress.fidelity import evaluate_fidelity, teacher_centre

        if not hasattr(self, "_layer_centre"):
            self._layer_centre = teacher_centre(self.teacher.model, self.data.training(32, self.seed), **self.kw)
        r = evaluate_fidelity(student, self.teacher.model, self.data.val_middle, centre=self._layer_centre, boundaries=boundaries, **self.kw)
        return [round(float(v), 3) for v in r["block_r2"]]


def build_student(method: str, teacher, data: Data, seed: int, depth: int = 6):
    """The depth-6 student and its objective: TWT (plan by discovery on 64 train tiles,
    surrogates auditioned as they are on validation tiles, branch scalars on) or
    truncation (first 6 layers, final features only)."""
    from pathtwt.compress.distill import DeepSupervision
    from pathtwt.compress.methods.truncation import truncated_student
    from pathtwt.compress.pipeline import CompressOptions, resolve_plan
    from pathtwt.compress.student import add_branch_scales
    from pathtwt.compress.methods.twt import build_twt_student

    if method == "truncation":
        return truncated_student(teacher, depth), DeepSupervision(None), None
    if "twt" not in _STUDENTS:  # discovery and audition once per process
        from pathtwt.compress.calibration import CalibrationSet

        # discovery on 64 training tiles; the auditions choose on the validation images
        calib = CalibrationSet(fit=data.training(64, seed), select=data.val_middle, report=data.val_middle[:0], patch_size=TILE)
        opts = CompressOptions.from_flat(out=Path("."), depth=depth, audition_steps=0, batch_size=16, seed=seed, device="cpu")
        plan = resolve_plan(teacher, calib, opts)
        student, _ = build_twt_student(teacher, calib, plan, opts)
        print(f"twt plan {plan['blocks']}", flush=True)
        _STUDENTS["twt"] = (student, [e for _, e in plan["blocks"]])
    student, boundaries = _STUDENTS["twt"]
    student = add_branch_scales(copy.deepcopy(student))
    return student, DeepSupervision(boundaries), boundaries


_STUDENTS: dict = {}


_MEMO: dict = {}


def _memoise_targets() -> None:
    """Resuming a run at each checkpoint would recompute the teacher's targets of every
    tile and the loss-norm variances each time, and runs on the same tiles would compute
    the same targets again: keep them, keyed by the run's tiles and the teacher layers
    matched. Truncation's only target (the final features) is the last of TWT's, so it is
    taken from a TWT cache of the same tiles when there is one (the same numbers)."""
    import pathtwt.compress.distill as d

    build, norm = d.TargetCache.build.__func__, d.normalised_objective

    def cached_build(cls, teacher, tiles, **kw):
        boundaries = tuple(kw["objective"].boundaries or ())
        key = ("cache", _MEMO["tiles"], boundaries)
        if key not in _MEMO:
            full = next((v for k, v in _MEMO.items() if k[0] == "cache" and k[1] == _MEMO["tiles"] and k[2]), None)
            _MEMO[key] = cls([full.tensors[-1]]) if not boundaries and full is not None else build(cls, teacher, tiles, **kw)
        return _MEMO[key]

    def cached_norm(objective, teacher, source, transform, options, teacher_outputs=None):
        key = ("norm", _MEMO["tiles"], tuple(objective.boundaries or ()), options.loss_norm)
        if key not in _MEMO:
            _MEMO[key] = norm(objective, teacher, source, transform, options, teacher_outputs)
        return _MEMO[key]

    d.TargetCache.build = classmethod(cached_build)
    d.normalised_objective = cached_norm


def run_curve(spec: str, teacher, data: Data, ev: Evaluator, checkpoints: list[int], args, on_row=None) -> list[dict]:
    from pathtwt.compress.distill import DistillOptions, distill

    method, norm, n_tiles, steps, *own = spec.split(":")
    n_tiles, steps = int(n_tiles), int(steps)
    if own:  # the run's own checkpoints, "/"-separated
        checkpoints = sorted(int(c) for c in own[0].split("/") if c)
    tiles = data.training(n_tiles, args.seed)
    _MEMO["tiles"] = (n_tiles, args.seed)
    torch.manual_seed(args.seed)
    student, objective, boundaries = build_student(method, teacher, data, args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt.pt"
        spent, started = 0.0, time.perf_counter()
        stops = [c for c in checkpoints if c < steps] + [steps]
        if args.every:  # scored every --every steps up to the cap STEPS
            stops = list(range(args.every, steps, args.every)) + [steps]
        for stop in stops:
            opts = DistillOptions(steps=steps, batch_size=args.batch_size, lr=args.lr, augment=False, seed=args.seed,
                                  precision=args.precision, checkpoint=ckpt, checkpoint_every=0, stop_after=stop,
                                  progress=False, loss_norm=norm, cache_limit_bytes=int(args.cache_gb * 2**30))
            t0 = time.perf_counter()
            result = distill(student, teacher.model, tiles, transform=teacher.transform, objective=objective, options=opts)
            spent += time.perf_counter() - t0
            t1 = time.perf_counter()
            row = {"run": spec, "method": method, "loss_norm": norm, "tiles": n_tiles, "total_steps": steps, "step": stop,
                   "epochs": round(stop * args.batch_size / n_tiles, 2), "distill_s": round(spent, 1),
                   **{k: v for k, v in result.history[-1].items() if k != "step"}, **ev.score(ev.embeddings(student))}
            if stop == steps and boundaries is not None:
                row["val_block_r2"] = ev.block_r2(student, boundaries)
            row["eval_s"] = round(time.perf_counter() - t1, 1)
            rows.append(row)
            print(fmt_row(row), flush=True)
            if on_row is not None:  # written after every score, so a stopped run keeps its rows
                on_row(rows)
            if args.every and flat(rows, args):
                row["stopped"] = f"val R2 gained < {args.min_gain} over the last {args.window} steps"
                print(row["stopped"], flush=True)
                break
            if args.deadline_min and time.perf_counter() - started > 60 * args.deadline_min:
                row["stopped"] = f"wall-time cap of {args.deadline_min} min"
                print(row["stopped"], flush=True)
                break
    return rows


def flat(rows: list[dict], args) -> bool:
    """Validation R^2 has stopped rising: the last row gained less than --min-gain over the
    row --window steps before it."""
    last = rows[-1]
    before = [r for r in rows if r["step"] == last["step"] - args.window]
    return bool(before) and last["val_r2"] - before[0]["val_r2"] < args.min_gain



COLUMNS = ("run", "step", "epochs", "distill_s", "val_r2", "test_r2", "test_cka", "val_bacc", "test_bacc", "test_bacc_ci95")


def fmt_row(row: dict) -> str:
    def f(v):
        if isinstance(v, float):
            return f"{v:.3f}"
        if isinstance(v, list):
            return "[" + ", ".join(f"{x:.2f}" for x in v) + "]"
        return str(v)

    return " | ".join(f(row.get(c, "")) for c in COLUMNS)


def speed(teacher, data: Data, args) -> dict:
    """Steps/s of twt-6 distillation at --batch-size: fp32 vs bf16 autocast, the teacher's
    targets cached (computed once per tile) vs recomputed every step."""
    from pathtwt.compress.distill import DistillOptions, distill

    tiles = data.training(args.batch_size * (args.speed_steps + 1), args.seed)
    out = {}
    for config in args.speed_configs.split(","):
        precision, how = config.split(":")
        cached = how == "cached"
        student, objective, _ = build_student("twt", teacher, data, args.seed)
        opts = DistillOptions(steps=args.speed_steps + 1, batch_size=args.batch_size, augment=False, seed=args.seed,
                              precision=precision, progress=False, loss_norm="variance",
                              cache_limit_bytes=(8 * 2**30) if cached else 0)
        times = []

        class Timed:  # the time of every step (loss hook): first step (warm-up) dropped
            def __init__(self, inner):
                self.inner, self.t = inner, None

            def with_term_scales(self, s):
                return Timed(self.inner.with_term_scales(s))

            @property
            def boundaries(self):
                return self.inner.boundaries

            def targets(self, teacher, x):
                return self.inner.targets(teacher, x)

            def loss(self, student, x, targets, step):
                now = time.perf_counter()
                if self.t is not None:
                    times.append(now - self.t)
                self.t = now
                return self.inner.loss(student, x, targets, step)

        t0 = time.perf_counter()
        distill(student, teacher.model, tiles, transform=teacher.transform, objective=Timed(objective), options=opts)
        total = time.perf_counter() - t0
        step_s = float(np.median(times)) if times else float("nan")
        key = f"{precision}_{'cached' if cached else 'recomputed'}"
        out[key] = {"s_per_step": round(step_s, 3), "steps_per_s": round(1 / step_s, 4), "run_s_incl_cache": round(total, 1)}
        print(key, out[key], flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--weights", type=Path, default=SHARED / "weights" / "vit_s14_imgfocus.safetensors")
    parser.add_argument("--runs", nargs="*", default=[], metavar="METHOD:NORM:TILES:STEPS")
    parser.add_argument("--checkpoints", default="", help="comma-separated steps at which every run is scored")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--cache-gb", type=float, default=3.0, help="largest teacher-target cache (else recomputed)")
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--speed-steps", type=int, default=3)
    parser.add_argument("--speed-configs", default="fp32:cached,bf16:cached,fp32:recomputed,bf16:recomputed")
    parser.add_argument("--probe-tiles", type=int, choices=sorted(PROBE_TILES), default=9)
    parser.add_argument("--references", action="store_true", help="score teacher, constant and random-init")
    parser.add_argument("--tag", default="curve", help="name of the CSV / JSON written under --out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--holdout", type=float, default=None,
                        help="draw the images from the study's compression-only hold-out of this fraction (its train / val, 3 : 1 per class)")
    parser.add_argument("--folds", type=int, default=5, help="folds of the study whose hold-out --holdout draws")
    parser.add_argument("--every", type=int, default=0, help="score every N steps up to the run's STEPS (a cap) and stop when flat")
    parser.add_argument("--window", type=int, default=200, help="flat: val R^2 gained < --min-gain over this many steps")
    parser.add_argument("--min-gain", type=float, default=0.01)
    parser.add_argument("--deadline-min", type=float, default=0.0, help="stop a run at its first score after this many minutes of it")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not (BACH / "labels.csv").exists():
        raise SystemExit(f"{BACH}: BACH images not found; set PATHTWT_SHARED")
    from pathtwt.compress.fidelity import random_init_model
    from pathtwt.io.atomic import atomic_output
    from pathtwt.models.registry import create_backbone

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    teacher = create_backbone("vit-s14-imgfocus", weights=args.weights, device="cpu", precision="fp32")
    data = Data(args.seed, args.probe_tiles, args.holdout, args.folds)
    print(f"tiles read in {time.perf_counter() - t0:.0f}s: {len(data.train_tiles)} train, {len(data.probe)} probe", flush=True)
    if args.speed:
        result = speed(teacher, data, args)
        with atomic_output(args.out / "speed.json") as tmp:
            Path(tmp).write_text(json.dumps({"batch_size": args.batch_size, "threads": args.threads, **result}, indent=1))
    if not (args.runs or args.references):
        return
    _memoise_targets()
    ev = Evaluator(teacher, data, batch_size=32, seed=args.seed, cache=args.out)
    print(f"teacher embeddings of {len(data.probe)} tiles: {ev.teacher_seconds:.0f}s", flush=True)
    print(" | ".join(COLUMNS))
    rows = []
    if args.references:  # the free ones first; random-init (a full forward pass) after the runs
        for name, emb in (("teacher", ev.t_emb), ("constant", ev.centre.expand(len(ev.t_emb), -1).clone())):
            rows.append({"run": name, **ev.score(emb)})
            print(fmt_row(rows[-1]), flush=True)
    checkpoints = sorted(int(c) for c in args.checkpoints.split(",") if c)
    for spec in args.runs:
        rows += run_curve(spec, teacher, data, ev, checkpoints, args,
                          on_row=lambda part: write(args.out, rows + part, args))
        write(args.out, rows, args)
    if args.references:
        rows.append({"run": "random-init", **ev.score(ev.embeddings(random_init_model(teacher.spec, args.seed)))})
        print(fmt_row(rows[-1]), flush=True)
    write(args.out, rows, args)


def write(out: Path, rows: list[dict], args) -> None:
    from pathtwt.io.atomic import atomic_output

    name = args.tag
    with atomic_output(out / f"{name}.json") as tmp:
        Path(tmp).write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    keys = sorted({k for r in rows for k in r}, key=lambda k: (COLUMNS.index(k) if k in COLUMNS else 99, k))
    with atomic_output(out / f"{name}.csv") as tmp:
        with open(tmp, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
