"""bf16 against fp32 on this CPU, in one run: matrix-multiply peaks, backbone forward and a
distillation train step, each as a fraction of the measured peaks, and what bf16 loses where.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/cpu_precision.py [--threads 2] [--json out.json]

Measured (random weights: speed does not depend on them), all interleaved round by round
so a drifting load on a shared machine favours no variant:

- ``mm``: ``torch.mm`` of two large square matrices, fp32 and bf16: the practical peaks.
- ``forward``: tiles/s of ViT-S (the vit-s14-imgfocus architecture) and H0-mini through
  ``embed_tiles`` under inference mode, as extraction runs it: fp32; bf16 autocast over
  fp32 weights with timm's fused attention (``pathtwt extract --precision auto`` before
  :mod:`pathtwt.models.bf16_guard`); bf16 autocast with the matrix weights cast once
  (autocast re-casts a frozen model's weights on every call; same numbers); the whole
  model cast to bf16; bf16 autocast with explicit attention (extraction's path now); and
  fp32 with explicit attention.
- ``train``: one distillation optimiser step (``pathtwt.compress.distill``'s teacher
  targets, then the student's forward and backward and AdamW) of a TWT student (depth
  --student-depth) against the 12-layer teacher: fp32; bf16 autocast (the teacher's
  weights cast on every call); bf16 autocast with the frozen teacher's matrix weights
  cast once; bf16 autocast with explicit attention in teacher and student. FLOPs: teacher forward + 3 x student forward (``pathtwt.models.flops``).

Each figure is GFLOP/s = 2 x MACs x tiles/s, and its fraction of the fp32 and of the bf16
``mm`` peak. The targets: bf16 extraction >= 0.8 of the bf16 peak,
fp32 extraction >= 0.9 of the fp32 peak, a train step >= 0.6 of the fp32 peak in fp32 and
>= 1.5x that in bf16.

Measures: bf16 against fp32 on this CPU: torch.mm peaks, then tiles/s of backbone forwards and of a
distillation train step in each precision variant, each as GFLOP/s and as fractions of the fp32 and bf16
peaks.
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/cpu_precision.py --threads 1 --mm-n 256 --backbones
vit-s14-tiny --batch 2 --train-batch 2 --rounds 1 --json out.json` (smallest); `PYTHONPATH=$PWD
.venv/bin/python benchmarks/cpu_precision.py --threads 2 --json out.json` (ViT-S and H0-mini).
JSON keys: `machine` (cores, threads, torch, mkldnn, cpu_capability, load_average), `mm_gflops` {fp32, bf16},
`mm_bf16_over_fp32`, `forward` and `train` (backbone -> batch and, per variant, tiles/s, GFLOP/s and fractions
of the peaks), `ratios` (backbone -> the fractions the targets are stated in), `seconds`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pathtwt.bench.timing import interleaved_best  # noqa: E402


def cast_matmul_weights(model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """Cast, in place, a frozen model's Linear/Conv weights and biases to ``dtype``. Autocast
    caches its bf16 weight copies only for tensors that require grad, so a frozen model has
    them re-cast on every call; with these cast once, autocast's outputs are bit-identical
    (norms and softmax keep their fp32 parameters and run in fp32 as before)."""
    for m in model.modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)):
            for p in (m.weight, m.bias):
                if p is not None:
                    p.data = p.data.to(dtype)
    return model


def explicit_attention(model: torch.nn.Module) -> torch.nn.Module:
    """timm's explicit attention (q @ k^T, softmax, @ v in the autocast dtype) in place of
    ``F.scaled_dot_product_attention``, whose fused CPU kernel gains nothing from bf16."""
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    return model


def forward_calls(name: str, batch: int) -> tuple[dict[str, Callable[[], Any]], int]:
    from pathtwt.models.embedding import embed_tiles
    from pathtwt.models.flops import count_macs
    from pathtwt.models.registry import build_timm_model, get_spec

    spec = get_spec(name)
    torch.manual_seed(0)
    model = build_timm_model(spec).eval().requires_grad_(False)
    model16 = copy.deepcopy(model).to(torch.bfloat16)
    x = torch.randn(batch, 3, spec.input_size, spec.input_size)
    prefix = spec.num_prefix_tokens
    auto = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731

    def fp32():
        with torch.inference_mode():
            embed_tiles(model, x, prefix)

    def autocast():
        with torch.inference_mode(), auto():
            embed_tiles(model, x, prefix)

    # a copy whose matrix weights are cast once, here, for the whole run (as extraction does)
    model_once = copy.deepcopy(model)
    cast_matmul_weights(model_once, torch.bfloat16)

    def autocast_cast_once():
        with torch.inference_mode(), auto():
            embed_tiles(model_once, x, prefix)

    def bf16_model():
        with torch.inference_mode():
            embed_tiles(model16, x, prefix)

    model_explicit = explicit_attention(copy.deepcopy(model))

    def autocast_explicit_attention():
        with torch.inference_mode(), auto():
            embed_tiles(model_explicit, x, prefix)

    def fp32_explicit_attention():
        with torch.inference_mode():
            embed_tiles(model_explicit, x, prefix)

    calls = {"fp32": fp32, "bf16-autocast": autocast, "bf16-autocast-weights-once": autocast_cast_once,
             "bf16-model": bf16_model, "bf16-autocast-explicit-attention": autocast_explicit_attention,
             "fp32-explicit-attention": fp32_explicit_attention}
    return calls, count_macs(model)


def train_calls(name: str, depth: int, batch: int) -> tuple[dict[str, Callable[[], Any]], int, int]:
    from pathtwt.compress.distill import DeepSupervision
    from pathtwt.compress.targets import teacher_targets
    from pathtwt.compress.student import clone_layers, stitch_student
    from pathtwt.models.flops import count_macs
    from pathtwt.models.registry import build_timm_model, get_spec

    spec = get_spec(name)
    torch.manual_seed(0)
    teacher = build_timm_model(spec).eval().requires_grad_(False)
    n = len(teacher.blocks)
    ends = [round((j + 1) * n / depth) for j in range(depth)]
    objective = DeepSupervision(ends)
    x = torch.randn(batch, 3, spec.input_size, spec.input_size)
    students: list[torch.nn.Module] = []

    # the frozen teacher with its matrix weights cast once, for the whole run
    teacher_once = cast_matmul_weights(copy.deepcopy(teacher), torch.bfloat16)
    teacher_explicit = explicit_attention(copy.deepcopy(teacher))

    def step_fn(precision: str, frozen: torch.nn.Module, explicit: bool = False) -> Callable[[], Any]:
        student = stitch_student(teacher, clone_layers(teacher, [e - 1 for e in ends]), spec=spec).train()
        if explicit:
            explicit_attention(student)
        opt = torch.optim.AdamW(student.parameters(), lr=1e-5)
        students.append(student)

        def step():
            targets = teacher_targets(objective, frozen, x, precision)
            opt.zero_grad(set_to_none=True)
            amp = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
            with amp:
                loss, _ = objective.loss(student, x, targets, 0)
            loss.backward()
            opt.step()

        return step

    calls = {"fp32": step_fn("fp32", teacher), "bf16-autocast": step_fn("bf16", teacher),
             "bf16-autocast-teacher-once": step_fn("bf16", teacher_once),
             "bf16-autocast-explicit-attention": step_fn("bf16", teacher_explicit, explicit=True)}
    return calls, count_macs(teacher), count_macs(students[0])


def mm_calls(n: int) -> dict[str, Callable[[], Any]]:
    a32, b32 = torch.randn(n, n), torch.randn(n, n)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    return {"fp32": lambda: torch.mm(a32, b32), "bf16": lambda: torch.mm(a16, b16)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="torch compute threads (default: torch's own)")
    ap.add_argument("--mm-n", type=int, default=2048)
    ap.add_argument("--backbones", default="vit-s14-imgfocus,h0-mini")
    ap.add_argument("--batch", type=int, default=8, help="forward batch (H0-mini uses half)")
    ap.add_argument("--train-batch", type=int, default=8, help="train-step batch (H0-mini uses half)")
    ap.add_argument("--student-depth", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    out: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "mkldnn": torch.backends.mkldnn.is_available(),
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "load_average": os.getloadavg()[0]},
    }
    n = args.mm_n
    mm = interleaved_best(mm_calls(n), rounds=args.rounds + 1)
    peak = {k: 2 * n**3 / t / 1e9 for k, t in mm.items()}
    out["mm_gflops"] = {k: round(v, 1) for k, v in peak.items()}
    out["mm_bf16_over_fp32"] = round(peak["bf16"] / peak["fp32"], 3)

    def figures(gflop_per_item: float, seconds: float, items: int) -> dict[str, float]:
        gflops = gflop_per_item * items / seconds
        return {"tiles_per_s": round(items / seconds, 3), "gflops": round(gflops, 1),
                "of_fp32_peak": round(gflops / peak["fp32"], 3), "of_bf16_peak": round(gflops / peak["bf16"], 3)}

    for name in args.backbones.split(","):
        small = name.startswith("h0-mini") or name.startswith("hibou")
        batch = max(1, args.batch // 2) if small else args.batch
        calls, macs = forward_calls(name, batch)
        best = interleaved_best(calls, rounds=args.rounds)
        fwd = {k: figures(2 * macs / 1e9, t, batch) for k, t in best.items()}
        out.setdefault("forward", {})[name] = {"batch": batch, **fwd}
        tb = max(1, args.train_batch // 2) if small else args.train_batch
        tcalls, t_macs, s_macs = train_calls(name, args.student_depth, tb)
        tbest = interleaved_best(tcalls, rounds=args.rounds)
        per_tile = 2 * (t_macs + 3 * s_macs) / 1e9
        out.setdefault("train", {})[name] = {"batch": tb, "student_depth": args.student_depth,
                                             **{k: figures(per_tile, t, tb) for k, t in tbest.items()}}
        print(json.dumps({name: {"forward": out["forward"][name], "train": out["train"][name]}}, indent=1), flush=True)

    ratios: dict[str, Any] = {}
    for name in out["forward"]:
        f, t = out["forward"][name], out["train"][name]
        ratios[name] = {
            "forward fp32 / fp32 peak": f["fp32"]["of_fp32_peak"],
            "forward bf16-autocast / bf16 peak (before)": f["bf16-autocast"]["of_bf16_peak"],
            "forward bf16-autocast-explicit-attention / bf16 peak (after)":
                f["bf16-autocast-explicit-attention"]["of_bf16_peak"],
            "forward bf16 speed-up over fp32: autocast, weights once, explicit attention": tuple(
                round(f[k]["tiles_per_s"] / f["fp32"]["tiles_per_s"], 3)
                for k in ("bf16-autocast", "bf16-autocast-weights-once", "bf16-autocast-explicit-attention")),
            "train fp32 / fp32 peak": t["fp32"]["of_fp32_peak"],
            "train bf16 speed-up over fp32: autocast, teacher once, explicit attention": tuple(
                round(t[k]["tiles_per_s"] / t["fp32"]["tiles_per_s"], 3)
                for k in ("bf16-autocast", "bf16-autocast-teacher-once", "bf16-autocast-explicit-attention")),
        }
    out["ratios"] = ratios
    out["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps({"mm_gflops": out["mm_gflops"], "ratios": ratios, "seconds": out["seconds"]}, indent=1))
    if args.json:
        from pathtwt.io.atomic import write_json_atomic

        write_json_atomic(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
