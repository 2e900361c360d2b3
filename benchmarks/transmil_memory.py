"""TransMIL memory versus bag size: forward + backward of one bag of 1536-d features (the
concat(CLS, mean patch) embedding of a ViT-B backbone) on CPU, each size in a fresh
process so the peak resident set size (ru_maxrss) belongs to that size alone.

Nystrom attention keeps (tokens x landmarks) kernels instead of (tokens x tokens), so
the extra memory should grow linearly with the bag: "slope" (extra MB per 1,000 more
tiles than the previous size) stays bounded instead of doubling with each doubling.
The last column is what one exact (tokens x tokens) attention map of 8 heads would
take in float32, for comparison.

    python benchmarks/transmil_memory.py                 # 6250 ... 50000 tiles
    python benchmarks/transmil_memory.py --sizes 1000 50000 --threads 4

Measures: TransMIL's peak resident memory for forward and backward of one bag against the bag's size, each
size in a fresh process: the extra MB per 1,000 tiles should stay bounded (Nystrom attention).
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/transmil_memory.py --sizes 200 400 --dim 64 --threads 1
--json out.json` (smallest); `PYTHONPATH=$PWD .venv/bin/python benchmarks/transmil_memory.py --json out.json`
(6,250 to 50,000 tiles of 1536-d features).
JSON keys: `dim`, `threads`, `rows`: one a size, with `tiles`, `tokens`, `peak_rss_mb`, `extra_mb`,
`slope_mb_per_1k`, `seconds`, `exact_attention_mb` (one exact attention map, for comparison).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path


def measure(n_tiles: int, dim: int, threads: int) -> dict:
    import torch

    from pathtwt.mil.models import TransMIL

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = TransMIL(in_dim=dim, n_classes=6)
    features = torch.randn(n_tiles, dim)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    logits, attention = model(features)
    torch.nn.functional.cross_entropy(logits, torch.tensor([1])).backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert attention.shape == (n_tiles,) and torch.isfinite(logits).all()
    return {"tiles": n_tiles, "peak_rss_mb": peak / 1024, "extra_mb": (peak - before) / 1024, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[6250, 12500, 25000, 50000])
    parser.add_argument("--dim", type=int, default=1536)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child process: measure one size
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.dim, args.threads)))
        return
    print(f"TransMIL (512-d, 8 heads, 256 landmarks), {args.dim}-d features, forward+backward on CPU, {args.threads} threads")
    print(f"{'tiles':>7} {'tokens':>7} {'peak RSS MB':>12} {'extra MB':>9} {'slope MB/1k':>12} {'seconds':>8} {'exact attn map MB':>18}")
    previous = None
    rows = []
    for n in args.sizes:
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(n), "--dim", str(args.dim), "--threads", str(args.threads)],
            check=True, capture_output=True, text=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        tokens = math.ceil(math.sqrt(n)) ** 2 + 1
        exact = 8 * tokens * tokens * 4 / 2**20
        base = previous or {"tiles": 0, "extra_mb": 0.0}
        slope = 1000 * (r["extra_mb"] - base["extra_mb"]) / (n - base["tiles"])
        print(f"{n:>7} {tokens:>7} {r['peak_rss_mb']:>12.0f} {r['extra_mb']:>9.0f} {slope:>12.1f} {r['seconds']:>8.1f} {exact:>18.0f}")
        previous = r
        rows.append({**r, "tokens": tokens, "slope_mb_per_1k": round(slope, 1), "exact_attention_mb": round(exact, 1)})
    if args.json:
        from pathtwt.io.atomic import write_json_atomic

        write_json_atomic(args.json, {"dim": args.dim, "threads": args.threads, "rows": rows})


if __name__ == "__main__":
    main()
