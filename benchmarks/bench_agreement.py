"""Does ``pathtwt bench``'s model-only rate agree with a plain timm loop? The target: within
10 % at the same precision.

Measures: tiles/s of ``pathtwt bench``'s model-only measurement
(:func:`pathtwt.bench.throughput.model_only_rate`: uint8 tiles normalised on the device and
embedded, timed by :func:`pathtwt.bench.timing.seconds_per_call`) and of a plain loop over
``timm.create_model(...).forward_features`` on a float batch (no pathtwt code in the loop,
``time.perf_counter`` around it), same backbone architecture, batch and precision, each built
once and warmed, in alternating rounds of one run; prints their ratio (bench over timm; the
target is 0.9 to 1.1).
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_agreement.py --quick --json agreement.json`
(``--quick``: the tiny ViT, batch 4, two rounds, seconds); the measurement itself:
`PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_agreement.py --backbone vit-s14-imgfocus --batch 4 --rounds 7`
JSON keys: ``backbone``, ``batch``, ``precision`` (fp32 | bf16), ``device``, ``bench_tiles_per_s``
and ``timm_tiles_per_s`` (each the best of its rounds), ``ratio`` (bench over timm), ``within_10_percent``
(bool), ``rounds``, ``median_round_ratio`` (the median of the rounds' own ratios: a busy machine's
load moves both sides of a round together), ``seconds`` (the whole run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def timm_loop(spec, batch: int, precision: str, device: str):
    """A plain timm loop's one call: the registry's architecture built by timm itself, a float
    batch, ``forward_features`` under inference mode; returns (call, sync)."""
    import timm
    import torch

    from pathtwt.models.registry import resolve_timm_kwargs

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = timm.create_model(spec.timm_name, pretrained=False, **resolve_timm_kwargs(spec.timm_kwargs))
    model = model.to(device=device, dtype=dtype).eval()
    x = torch.randn(batch, 3, spec.input_size, spec.input_size, device=device, dtype=dtype)
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)

    def call() -> None:
        with torch.inference_mode():
            model.forward_features(x)

    return call, sync


def timm_rate(call, sync, batch: int, min_time_s: float) -> float:
    """tiles/s of the plain loop: ``time.perf_counter`` around calls filling ``min_time_s`` (at least one)."""
    calls, began = 0, time.perf_counter()
    while calls < 1 or time.perf_counter() - began < min_time_s:
        call()
        calls += 1
    sync()
    return calls * batch / (time.perf_counter() - began)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the tiny ViT, batch 4, two rounds (seconds)")
    ap.add_argument("--backbone", default="vit-s14-imgfocus")
    ap.add_argument("--batch", type=int, default=4, help="tiles a call (the CPU default of pathtwt bench)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds of each; the best of each counts")
    ap.add_argument("--min-time-s", type=float, default=0.0, help="each timing window (0: one call)")
    ap.add_argument("--json", default=None, help="also write the result as JSON to this file")
    args = ap.parse_args(argv)
    if args.quick:
        args.backbone, args.batch, args.rounds, args.min_time_s = "vit-s14-tiny", 4, 2, 0.0
    from pathtwt.bench.throughput import model_only_rate
    from pathtwt.models.registry import create_backbone, get_spec

    spec = get_spec(args.backbone)
    began = time.perf_counter()
    backbone = create_backbone(args.backbone, pretrained=False, device=args.device, precision=args.precision)
    call, sync = timm_loop(spec, args.batch, args.precision, args.device)
    call()  # each warmed once; then rounds alternate, so a change in the machine's load touches both
    ours, theirs = [], []
    for _ in range(args.rounds):
        ours.append(model_only_rate(backbone, args.batch, args.min_time_s, bf16_autocast=False, warmup=0, rounds=1,
                                    min_calls=1))
        theirs.append(timm_rate(call, sync, args.batch, args.min_time_s))
    ratio = max(ours) / max(theirs)
    pairs = sorted(o / t for o, t in zip(ours, theirs))
    result = {"backbone": args.backbone, "batch": args.batch, "precision": args.precision, "device": args.device,
              "bench_tiles_per_s": round(max(ours), 3), "timm_tiles_per_s": round(max(theirs), 3),
              "ratio": round(ratio, 4), "within_10_percent": bool(0.9 <= ratio <= 1.1), "rounds": args.rounds,
              "median_round_ratio": round(pairs[len(pairs) // 2], 4),
              "seconds": round(time.perf_counter() - began, 1)}
    print(f"bench {result['bench_tiles_per_s']} tiles/s, timm {result['timm_tiles_per_s']} tiles/s: ratio "
          f"{result['ratio']} ({'within' if result['within_10_percent'] else 'outside'} 10 %); median of the rounds' "
          f"ratios {result['median_round_ratio']}")
    if args.json:
        from pathtwt.io.atomic import write_json_atomic

        write_json_atomic(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
