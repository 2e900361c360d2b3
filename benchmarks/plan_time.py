"""The dry run of config/paper.yaml at the real cohorts' sizes (PANDA 10,616, TCGA-PRAD 449,
CAMELYON17 500, CAMELYON16 399 slides; small fake slide files), planned by this checkout
against its store and by the workflow of another commit (before the store), side by side in
one run: alternating rounds, each tree importing its own pathtwt.

    .venv/bin/python benchmarks/plan_time.py [--base REV] [--rounds 2] [--json out.json]

REV defaults to the commit this branch forked from main (``git merge-base HEAD main``). This
checkout's first plan hashes every slide (its fingerprint cache starts empty: "cold"); the
later ones find them kept ("warm"), as every plan after a study's first does. The ratio is
warm over the base's (the target: at most 1.2).

Measures: the dry run of config/paper.yaml at the real cohorts' sizes, this checkout's plan with its store
(cold and warm) against another commit's workflow, in alternating rounds.
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/plan_time.py --base HEAD --scale 0.003 --rounds 1 --json
out.json` (smallest); `PYTHONPATH=$PWD .venv/bin/python benchmarks/plan_time.py --json out.json` (the real
sizes, against the merge base with main).
JSON keys: `slides`, `base` (the commit compared with), `cpu`, `times` {base, store} (seconds of each round),
`cold` (the first plan's seconds), `jobs` {base, store} (jobs planned), `ratio_warm` (warm over the base's
median; target <= 1.2).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
# cohort -> (slides folder, label table, label column, split sizes, suffix), as config/paper.yaml names them
REAL_SIZES = {
    "panda": ("PANDA/train_images", "labels/panda_song_split.csv", "isup_grade",
              {"train": 8492, "val": 1062, "test": 1062}, ".tiff"),
    "tcga-prad": ("TCGA-PRAD/slides", "labels/tcga_prad_isup.csv", "isup_grade", {"test": 449}, ".svs"),
    "camelyon17": ("CAMELYON17/images", "labels/camelyon17_slides.csv", "label",
                   {"train": 300, "val": 100, "test": 100}, ".tif"),
    "camelyon16": ("CAMELYON16/images", "labels/camelyon16_slides.csv", "label", {"test": 399}, ".tif"),
}


def scaled(factor: float) -> dict:
    """:data:`REAL_SIZES` with every split ``factor`` times as large (at least 2 slides)."""
    return {c: (f, l, col, {s: max(2, round(n * factor)) for s, n in splits.items()}, e)
            for c, (f, l, col, splits, e) in REAL_SIZES.items()}


def make_cohorts(root: Path, sizes: dict = REAL_SIZES) -> int:
    """Fake slide files (distinct bytes: identical files would be one slide to the store) and
    label tables of ``sizes`` (as :data:`REAL_SIZES`); the number of slides."""
    total = 0
    for cohort, (folder, labels, label_col, splits, ext) in sizes.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        rows = []
        for split, n in splits.items():
            for i in range(n):
                slide = f"{cohort}-{split}-{i:05d}"
                (root / folder / f"{slide}{ext}").write_bytes(slide.encode())
                rows.append(f"{slide},{i % 2},{split}\n")
        (root / labels).parent.mkdir(parents=True, exist_ok=True)
        (root / labels).write_text(f"slide_id,{label_col},split\n" + "".join(rows))
        total += len(rows)
    return total


def checkout(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (its Snakefile, workflow and package) under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def plan(tree: Path, work: Path, data: Path, cache: Path) -> tuple[float, int]:
    """Seconds of one dry run of ``tree``'s workflow, and the jobs it planned."""
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(tree), "PATHTWT_CACHE_DIR": str(cache)}
    cmd = [str(SNAKEMAKE), "-s", str(tree / "Snakefile"), "--directory", str(work), "-n", "--quiet", "rules",
           "--configfile", str(tree / "config" / "paper.yaml"), "--config", f"data_root={data}"]
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    seconds = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"{tree}: the dry run failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    # the plan's job stats (a dry run prints the table twice): its first total
    jobs = next(int(line.split()[-1]) for line in res.stdout.splitlines() if line.strip().startswith("total"))
    return seconds, jobs


def cpu() -> str:
    from pathtwt.bench.cpu import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} cores"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=None, help="the commit to compare with (default: git merge-base HEAD main)")
    parser.add_argument("--rounds", type=int, default=2, help="warm rounds of each (default 2)")
    parser.add_argument("--scale", type=float, default=1.0, help="cohort sizes as a fraction of the real ones (a quick look)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    base = args.base or subprocess.run(["git", "-C", str(REPO), "merge-base", "HEAD", "main"], capture_output=True,
                                       text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="plan-time-") as tmp:
        root = Path(tmp)
        n = make_cohorts(root / "data", scaled(args.scale) if args.scale != 1 else REAL_SIZES)
        trees = {"base": checkout(base, root / "base"), "store": REPO}
        times: dict[str, list[float]] = {"base": [], "store": []}
        jobs = {}
        cold, jobs["store"] = plan(REPO, root / "work-store", root / "data", root / "cache")
        for _ in range(args.rounds):
            for name, tree in trees.items():
                seconds, jobs[name] = plan(tree, root / f"work-{name}", root / "data", root / f"cache-{name}"
                                           if name == "base" else root / "cache")
                times[name].append(seconds)
        shutil.rmtree(root / "data", ignore_errors=True)
    base_s, store_s = statistics.median(times["base"]), statistics.median(times["store"])
    print(f"config/paper.yaml, {n} slides; {cpu()}; base {base[:10]}")
    print("| workflow | jobs planned | dry run s (median) | rounds |")
    print("|---|---|---|---|")
    print(f"| before the store ({base[:7]}) | {jobs['base']} | {base_s:.1f} | {', '.join(f'{t:.1f}' for t in times['base'])} |")
    print(f"| the store, slides hashed before (warm) | {jobs['store']} | {store_s:.1f} | "
          f"{', '.join(f'{t:.1f}' for t in times['store'])} |")
    print(f"| the store, first plan (cold: every slide hashed) | {jobs['store']} | {cold:.1f} | 1 |")
    print(f"warm / before: {store_s / base_s:.2f}x (target <= 1.2); cold / before: {cold / base_s:.2f}x")
    if args.json:
        from pathtwt.io.atomic import write_json_atomic

        write_json_atomic(args.json, {"slides": n, "base": base, "cpu": cpu(), "times": times, "cold": cold,
                                      "jobs": jobs, "ratio_warm": store_s / base_s})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
