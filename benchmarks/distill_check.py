"""A short TWT distillation on a device, measured: H0-mini's architecture with random
weights (LayerScale redrawn so every layer does something) distilled into a 6-block
student, as ``pathtwt compress`` runs it with augmentation off (the shipped configs: the
teacher targets come from the target cache).

Measures: a short distillation's steady-state steps and tiles per second, its host waits
per step, its peak memory, the GPU's idle share and where the target cache sat; on CUDA
also a two-rank NCCL run under torchrun (ended, every process of it, at its timeout).
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/distill_check.py --device cpu --budget-s 2 --backbone vit-s14-tiny --depth 3 --precision fp32 --json out.json`
(on a GPU: `--device cuda --budget-s 120 --json distill_check.json`).
JSON keys: device, device_name, backbone, depth, batch_size, precision, fp32_matmul, augment,
tiles_in_memory (the run's settings); steps (timed steps), steps_per_s, tiles_per_s (the
rate); host_waits_per_step, host_waits (counts and where); peak_memory (bytes);
gpu_wait_share, gpu_wait_note (the GPU's idle share); targets (the cache's bytes on the
device and the host); probe_s, budget_s (the sizing probe); nccl_two_process (ran, gpus,
exit, note or the two-rank rate).

    python benchmarks/distill_check.py --device cuda --budget-s 120 --json distill_check.json
    python benchmarks/distill_check.py --device cpu --budget-s 3 --backbone vit-s14-tiny --depth 3 --batch-size 4

What it prints, and writes to ``--json``:

* ``steps_per_s``, ``tiles_per_s``: optimiser steps of the timed run, from the end of its
  second step to the end of its last (set-up, the first step and the target cache's
  placement excluded); the timed run's step count is chosen from a 3-step probe so that
  probe and run fit ``--budget-s``.
* ``host_waits_per_step``: operations that made the host wait for the device, per step
  (benchmarks/host_waits.py): torch's sync debug mode during the timed run on CUDA; on the
  CPU a 5-step replay on the stand-in device ``cpu:0``. ``where`` says which lines.
* ``peak_memory``: the timed run's peak allocated and reserved GPU memory; on the CPU the
  process's peak resident memory.
* ``gpu_wait_share``: the share of the steady-state steps in which the GPU ran no kernel,
  from a 5-step run under torch.profiler (kernel time summed between the ends of the
  second and the last step, against the wall time); the profiler's own host work makes it
  an upper bound. "n/a" on the CPU.
* ``targets``: where the target cache sat (bytes on the device, in host memory).
* ``nccl_two_process``: a 4-step run of two ranks under torchrun with NCCL on one GPU (two
  GPUs when two are visible), or the reason it could not run: NCCL refuses two ranks of a
  communicator on one GPU ("Duplicate GPU detected"), which the run then reports. A rank
  that fails aborts its group; a run past ``--nccl-timeout-s`` is sent SIGTERM, then
  killed, torchrun and its ranks alike.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (str(REPO), str(REPO / "benchmarks")):
    if path not in sys.path:
        sys.path.insert(0, path)

PROBE_STEPS = 3  # the probe that sizes the timed run
MIN_STEPS = 4  # the timed run's fewest steps: three steady-state intervals
PROFILED_STEPS = 5


def build(backbone: str, depth: int, device: str, seed: int = 0):
    """The teacher (random weights, LayerScale gammas drawn in [0.2, 1.0]), a ``depth``-block
    student of evenly spaced teacher layers, and TWT's objective on those boundaries."""
    import torch

    from pathtwt.compress.distill import DeepSupervision
    from pathtwt.compress.student import clone_layers, stitch_student
    from pathtwt.models.registry import create_backbone

    teacher = create_backbone(backbone, pretrained=False, init_seed=seed, device=device, precision="fp32")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for blk in teacher.model.blocks:
            for ls in (getattr(blk, "ls1", None), getattr(blk, "ls2", None)):
                if ls is not None and hasattr(ls, "gamma"):
                    ls.gamma.copy_((torch.rand(ls.gamma.shape, generator=g) * 0.8 + 0.2).to(ls.gamma.device))
    n = len(teacher.model.blocks)
    ends = [round((j + 1) * n / depth) for j in range(depth)]
    student = stitch_student(teacher.model, clone_layers(teacher.model, [e - 1 for e in ends]), spec=teacher.spec)
    return teacher, student, DeepSupervision(ends)


def random_tiles(n: int, size: int, seed: int = 0):
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)


def distill_run(teacher, student, objective, tiles, device: str, args, steps: int):
    from pathtwt.compress.distill import DistillOptions, distill

    options = DistillOptions(steps=steps, batch_size=args.batch_size, device=device, precision=args.precision,
                             augment=args.augment, progress=False, seed=0, workers=0, checkpoint=None)
    return distill(student, teacher.model, tiles, transform=teacher.transform, objective=objective, options=options)


def steady_rate(marks: list[tuple[int, float]]) -> float | None:
    """Steps per second between the end of the second step and the end of the last."""
    if len(marks) < 3:
        return None
    return (len(marks) - 2) / (marks[-1][1] - marks[1][1])


def gpu_wait_share(run) -> tuple[float | str, str]:
    """(share, note): the share of the steady-state steps of ``run()`` in which no kernel ran."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def mark(*_):
        with record_function("pathtwt.step_end"):
            pass

    handle = register_optimizer_step_post_hook(mark)
    try:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=activities) as prof:
            run()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
    finally:
        handle.remove()
    events = prof.events()
    ends = sorted(e.time_range.start for e in events if e.name == "pathtwt.step_end")
    kernels = [e.time_range for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    if len(ends) < 3 or not kernels:
        return "n/a", f"the profiler saw {len(ends)} step ends and {len(kernels)} kernels"
    start, end = ends[1], ends[-1]
    busy = _union([(max(k.start, start), min(k.end, end)) for k in kernels if k.end > start and k.start < end])
    return max(0.0, 1.0 - busy / (end - start)), f"{len(ends) - 2} steps under torch.profiler (an upper bound)"


def _union(spans: list[tuple[float, float]]) -> float:
    """Length of the union of intervals (kernels on several streams may overlap)."""
    total, reach = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


def replayed_waits(args, device: str) -> dict[str, Any]:
    """Host waits per step from a short run on the CPU stand-in device (a fresh teacher and
    student: the stand-in tracks only what is made within it)."""
    from host_waits import DEVICE, counted_run

    teacher, student, objective = build(args.backbone, args.depth, "cpu")
    tiles = random_tiles(args.tiles, teacher.spec.input_size)
    return counted_run(DEVICE, lambda: distill_run(teacher, student, objective, tiles, DEVICE, args, PROFILED_STEPS))[1]


def nccl_two_process(args, budget_s: float) -> dict[str, Any]:
    """A short run of two NCCL ranks under torchrun (see the module doc)."""
    import torch

    if not args.device.startswith("cuda") or not torch.cuda.is_available():
        return {"ran": False, "note": f"n/a: --device {args.device} (NCCL needs CUDA GPUs)"}
    gpus = 2 if torch.cuda.device_count() >= 2 else 1
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
               "--role", "rank", "--device", "cuda", "--backbone", args.backbone, "--depth", str(args.depth),
               "--batch-size", str(2 * args.batch_size), "--tiles", str(args.tiles), "--precision", args.precision,
               "--json", str(out)]
        env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ",".join(
            os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").split(",")[:gpus])}
        code, text = run_ranks(cmd, env, budget_s)
        if code is None:
            return {"ran": False, "gpus": gpus, "note": f"did not end within {budget_s:.0f} s; its processes were ended"}
        if code == 0 and out.exists():
            return {"ran": True, "gpus": gpus, **json.loads(out.read_text())}
        return {"ran": False, "gpus": gpus, "exit": code, "note": cause_line(text)}


def cause_line(text: str) -> str:
    """The line of a failed run that says why: NCCL's "Duplicate GPU detected" when it is
    there (two ranks on one GPU), else the first line that says error, else the last."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    found = next((l for l in lines if "Duplicate GPU" in l), None) or \
        next((l for l in lines if "Error" in l or "error" in l), None)
    return (found or (lines[-1] if lines else "no output"))[:300]


# after SIGTERM, how long the run's processes have to end before they are killed
TERM_GRACE_S = 10.0


def run_ranks(cmd: list[str], env: dict[str, str], timeout_s: float) -> tuple[int | None, str]:
    """Run a torchrun command; (its exit status, its output), the status None when it did
    not end within ``timeout_s``. torchrun starts in a process group of its own and its
    ranks in sessions of their own (torch/distributed/elastic/multiprocessing/
    subprocess_handler/subprocess_handler.py: ``start_new_session``), so on a timeout the
    group and every descendant are sent SIGTERM, then killed: none is left holding a GPU."""
    import signal

    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
            family = _descendants(proc.pid)
            _signal_all(proc.pid, family, signal.SIGTERM)
            end = time.monotonic() + TERM_GRACE_S
            while time.monotonic() < end and any(_alive(pid) for pid in family + [proc.pid]):
                proc.poll()
                time.sleep(0.1)
            family = sorted(set(family) | set(_descendants(proc.pid)))
            _signal_all(proc.pid, family, signal.SIGKILL)
            proc.wait()
        log.seek(0)
        return code, log.read()


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (from /proc: its ranks left its process group)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _signal_all(group: int, pids: list[int], sig: int) -> None:
    for send, target in [(os.killpg, group)] + [(os.kill, pid) for pid in pids]:
        try:
            send(target, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def rank_main(args) -> int:
    """One rank of the two-process run: 4 steps, rank 0 writes its rate. After an error
    the rank aborts its group (NCCL's destroy would wait for the other rank's collectives)."""
    from host_waits import StepMarks, Traffic

    from pathtwt.compress import ranks

    device = ranks.init_from_env(args.device)
    try:
        teacher, student, objective = build(args.backbone, args.depth, device)
        tiles = random_tiles(args.tiles, teacher.spec.input_size)
        with StepMarks(Traffic()) as steps:
            distill_run(teacher, student, objective, tiles, device, args, MIN_STEPS)
        if ranks.is_writer():
            rate = steady_rate(steps.marks)
            from pathtwt.io.atomic import write_json_atomic

            write_json_atomic(Path(args.json), {"world": ranks.world_size(), "steps_per_s": rate,
                                                "tiles_per_s": None if rate is None else rate * args.batch_size})
    except BaseException:
        ranks.abort()
        raise
    ranks.shutdown()
    return 0


def measure(args) -> dict[str, Any]:
    import torch

    from host_waits import StepMarks, Traffic, counted_run

    from pathtwt.models.precision import resolve_precision

    start = time.perf_counter()
    device = args.device
    cuda = device.startswith("cuda")
    args.precision = resolve_precision(args.precision, device, training=True).compute if args.precision == "auto" \
        else args.precision
    teacher, student, objective = build(args.backbone, args.depth, device)
    tiles = random_tiles(args.tiles, teacher.spec.input_size)
    with StepMarks(Traffic()) as probe:
        distill_run(teacher, student, objective, tiles, device, args, PROBE_STEPS)
    probe_s = time.perf_counter() - start
    rate = steady_rate(probe.marks) or PROBE_STEPS / probe_s
    set_up_s = max(0.0, probe_s - PROBE_STEPS / rate)
    steps = max(MIN_STEPS, int((args.budget_s - probe_s - set_up_s) * rate))

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    result, counted, marks = counted_run(device, lambda: distill_run(teacher, student, objective, tiles, device, args,
                                                                     steps))
    if cuda:
        torch.cuda.synchronize()
        peak = {"allocated_bytes": torch.cuda.max_memory_allocated(), "reserved_bytes": torch.cuda.max_memory_reserved()}
        counted["counted_on"] += ", the timed run"
        share, note = gpu_wait_share(lambda: distill_run(teacher, student, objective, tiles, device, args, PROFILED_STEPS))
    else:
        peak = {"process_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        counted = replayed_waits(args, device)
        share, note = "n/a", "the CPU computes the steps itself: there is no device to wait"
    rate = steady_rate(marks)
    return {
        "device": device, "device_name": torch.cuda.get_device_name(torch.device(device)) if cuda else "cpu",
        "backbone": args.backbone, "depth": args.depth, "batch_size": args.batch_size, "precision": result.precision,
        "fp32_matmul": result.fp32_matmul, "augment": args.augment, "tiles_in_memory": args.tiles,
        "steps": steps, "steps_per_s": rate, "tiles_per_s": None if rate is None else rate * args.batch_size,
        "host_waits_per_step": counted["host_waits_per_step"], "host_waits": counted,
        "peak_memory": peak, "gpu_wait_share": share, "gpu_wait_note": note, "targets": result.targets,
        "probe_s": probe_s, "budget_s": args.budget_s,
    }


def report(out: dict[str, Any]) -> str:
    rate = out["steps_per_s"]
    share = out["gpu_wait_share"]
    lines = [
        f"distill check: {out['backbone']} -> TWT-{out['depth']} on {out['device_name']} ({out['device']}), "
        f"batch {out['batch_size']}, {out['precision']} (fp32 matmuls {out['fp32_matmul']}), {out['steps']} steps timed",
        f"  steps/s {rate:.3g}, tiles/s {out['tiles_per_s']:.4g}" if rate else "  steps/s n/a (fewer than 3 steps)",
        f"  host waits per step {out['host_waits_per_step']} ({out['host_waits']['counted_on']}): "
        f"{ {k: v for k, v in out['host_waits']['where'].items() if k != 'async_h2d'} }",
        f"  peak memory {', '.join(f'{k} {v / 2**30:.2f} GiB' for k, v in out['peak_memory'].items())}",
        f"  GPU waited for the host {share if isinstance(share, str) else f'{share:.1%}'} of the step ({out['gpu_wait_note']})",
        f"  target cache {out['targets']}",
        f"  two-process NCCL run: {out['nccl_two_process']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--budget-s", type=float, default=120.0, help="wall time of the probe and the timed run together")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    ap.add_argument("--backbone", default="h0-mini")
    ap.add_argument("--depth", type=int, default=6, help="student blocks (TWT-6)")
    ap.add_argument("--batch-size", type=int, default=None, help="tiles a step (default 64 on a GPU, 4 on the CPU)")
    ap.add_argument("--tiles", type=int, default=None, help="in-memory training tiles (default 8 batches)")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    ap.add_argument("--augment", action="store_true", help="colour and blur augmentation (a teacher pass per step)")
    ap.add_argument("--nccl-timeout-s", type=float, default=240.0)
    ap.add_argument("--no-nccl", action="store_true", help="leave out the two-process NCCL run")
    ap.add_argument("--role", default="main", choices=["main", "rank"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.batch_size = args.batch_size or (64 if args.device.startswith("cuda") else 4)
    args.tiles = args.tiles or 8 * args.batch_size
    if args.role == "rank":
        return rank_main(args)
    out = measure(args)
    out["nccl_two_process"] = {"ran": False, "note": "left out (--no-nccl)"} if args.no_nccl else \
        nccl_two_process(args, args.nccl_timeout_s)
    print(report(out), flush=True)
    if args.json:
        from pathtwt.io.atomic import write_json_atomic

        write_json_atomic(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
