"""Does ``pathtwt bench``'s model-only rate agree with a plain timm loop? The target: within
10 % at the same precision.

Measures: tiles/s of ``pathtwt bench``'s model-only measurement
(:func:`pathtwt.bench.throughput.model_only_rate`: uint8 tiles normalised on the device and
embedded, timed by :func:`pathtwt.bench.timing.seconds_per_call`) and of a plain loop over
``timm.create_model(...).forward_features`` on a float batch (no pathtwt code in the loop,
``time.perf_counter`` around it), same backbone architecture, batch and precision, in
alternating rounds of one run; prints their ratio (bench over timm; the target is 0.9 to 1.1).
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_agreement.py --quick --json agreement.json`
(``--quick``: the 1-layer vit-s14-tiny, batch 4, one round each, seconds); the measurement itself:
`PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_agreement.py --backbone vit-s14-imgfocus --batch 8 --rounds 3`
JSON keys: ``backbone``, ``batch``, ``precision`` (fp32 | bf16), ``device``, ``bench_tiles_per_s``
and ``timm_tiles_per_s`` (each the best of its rounds), ``ratio`` (bench over timm), ``within_10_percent``
(bool), ``rounds``, ``seconds`` (the whole run).
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


def timm_rate(spec, batch: int, precision: str, device: str, min_time_s: float) -> float:
    """tiles/s of a plain timm loop: the registry's architecture built by timm itself, a float batch."""
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
    with torch.inference_mode():
        model.forward_features(x)  # warm-up
        sync()
        calls, began = 0, time.perf_counter()
        while calls < 2 or time.perf_counter() - began < min_time_s:
            model.forward_features(x)
            calls += 1
        sync()
        return calls * batch / (time.perf_counter() - began)


def bench_rate(name: str, batch: int, precision: str, device: str, min_time_s: float) -> float:
    from pathtwt.bench.throughput import model_only_rate
    from pathtwt.models.registry import create_backbone

    backbone = create_backbone(name, pretrained=False, device=device, precision=precision)
    return model_only_rate(backbone, batch, min_time_s, bf16_autocast=False, warmup=1, rounds=1, min_calls=2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the 1-layer vit-s14-tiny, batch 4, one round (seconds)")
    ap.add_argument("--backbone", default="vit-s14-imgfocus")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of each; the best of each counts")
    ap.add_argument("--min-time-s", type=float, default=2.0, help="each timing window")
    ap.add_argument("--json", default=None, help="also write the result as JSON to this file")
    args = ap.parse_args(argv)
    if args.quick:
        args.backbone, args.batch, args.rounds, args.min_time_s = "vit-s14-tiny", 4, 1, 0.2
    from pathtwt.models.registry import get_spec

    spec = get_spec(args.backbone)
    began = time.perf_counter()
    ours, theirs = [], []
    for _ in range(args.rounds):  # alternating, so a change in the machine's load touches both
        ours.append(bench_rate(args.backbone, args.batch, args.precision, args.device, args.min_time_s))
        theirs.append(timm_rate(spec, args.batch, args.precision, args.device, args.min_time_s))
    ratio = max(ours) / max(theirs)
    result = {"backbone": args.backbone, "batch": args.batch, "precision": args.precision, "device": args.device,
              "bench_tiles_per_s": round(max(ours), 3), "timm_tiles_per_s": round(max(theirs), 3),
              "ratio": round(ratio, 4), "within_10_percent": bool(0.9 <= ratio <= 1.1), "rounds": args.rounds,
              "seconds": round(time.perf_counter() - began, 1)}
    print(f"bench {result['bench_tiles_per_s']} tiles/s, timm {result['timm_tiles_per_s']} tiles/s: ratio "
          f"{result['ratio']} ({'within' if result['within_10_percent'] else 'outside'} 10 %)")
    if args.json:
        from pathtwt.io.atomic import write_json_atomic

        write_json_atomic(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
