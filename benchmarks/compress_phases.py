"""Where a ``pathtwt compress`` job's time goes, phase by phase, for one or more jobs run
one after the other in this process (as a workflow runs a backbone's variants: the later
jobs find what the earlier ones left on disk).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/compress_phases.py \\
        --job "--method twt --backbone vit-s14-imgfocus --weights W --calibration C --plan P --out /tmp/a ..." \\
        --job "--method twt ... --depth 4 --out /tmp/b ..." [--discover "--backbone ... --out D --depth 6"] [--json out.json]

Each ``--job`` is the argument list of ``pathtwt compress`` (as the workflow's log shows
it). The phases are pathtwt's own functions, wrapped with a timer; a phase's time is
exclusive of the phases called inside it (the distillation loop's time excludes the
teacher-target pass and the loss normalisation it starts), so the rows add up to the job's
wall time, with "other" the rest (argument parsing, teacher build, student stitching).
"Training steps" is the optimiser loop; the target is everything else <= 30 % of a
demo job (printed too: everything outside the training steps and auditioning's own
fitting steps). ``--discover`` runs the backbone's ``pathtwt discover`` job first, as the
workflow does: it leaves the teacher's shared pass over the fit tiles and the reference
rows in the teacher cache, and its time is printed beside the table. The process start-up (interpreter, torch and timm imports) is measured once in a
fresh interpreter and printed beside the table: every workflow job pays it.

"Host waits per training step": how often a step of each job's (last) distillation made
the host wait for the device (``benchmarks/host_waits.py``), counted after the jobs on a
5-step replay of that distillation (its objective, options and tiles; a copy of its
student and teacher), so the timed jobs run as they would: on a GPU with torch's sync
debug mode, on the CPU on the stand-in device ``cpu:0``. The target is 1 (the logged loss).

Measures: where the time of one or more `pathtwt compress` jobs, run one after the other in this process, goes
phase by phase (exclusive of the phases inside each), with the process start-up and the host waits per
distillation step of each job's last distillation.
Command: `PYTHONPATH=$PWD .venv/bin/python benchmarks/compress_phases.py --job "--method twt --backbone
vit-s14-tiny --random-init --calibration TILES --depth 2 --steps 2 --batch-size 4 --audition-steps 0 --device
cpu --precision fp32 --no-progress --out OUT" --json out.json` (smallest: a tiny random model on a few tiles);
a demo job's arguments, as the workflow's log shows them, for the figures of
`benchmarks/results/compress_phases.md`.
JSON keys: `jobs`: one per --job, each `job` (its arguments), `wall_s`, `phases` (phase -> seconds), `calls`
(phase -> calls), `host_waits` (per step, the counts and where; null without a distillation); `discover` (the
same for --discover, or null); `startup_s` (a fresh interpreter's imports).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
for _path in (str(REPO), str(REPO / "benchmarks")):
    if _path not in sys.path:
        sys.path.insert(0, _path)
REPLAY_STEPS = 5  # the replay's steps: waits are counted over the 2nd to the 5th

# (module, attribute, phase): the functions whose time is a phase of a compress job
PHASES = [
    ("pathtwt.models.registry", "create_backbone", "teacher build"),
    ("pathtwt.compress.calibration", "load_calibration", "load calibration"),
    ("pathtwt.compress.similarity", "similarity_matrix", "similarity matrix (plan)"),
    ("pathtwt.compress.teacher_cache", "fit_layer_outputs", "teacher layer outputs of the fit tiles (shared)"),
    ("pathtwt.compress.teacher_cache", "held_out_outputs", "teacher layer outputs of the held-out tiles (shared)"),
    ("pathtwt.compress.audition", "audition", "audition (rest)"),
    ("pathtwt.compress.audition", "teacher_states", "audition: teacher states"),
    ("pathtwt.compress.audition", "_fit", "audition: fitting candidates"),
    ("pathtwt.compress.audition", "_mse", "audition: scoring candidates"),
    ("pathtwt.compress.fidelity", "teacher_centre", "teacher fit means"),
    ("pathtwt.compress.fidelity", "tile_embeddings", "teacher select embeddings"),
    ("pathtwt.compress.pipeline", "report_fidelity", "student fidelity on report"),
    ("pathtwt.compress.fidelity", "references", "reference rows"),
    ("pathtwt.compress.distill", "normalised_objective", "loss normalisation"),
    ("pathtwt.compress.distill", "_check_bf16", "bf16 first-step check"),  # before compress/bf16_step.py
    ("pathtwt.compress.bf16_step", "first_step_precision", "bf16 first-step check"),
    ("pathtwt.compress.distill", "distill", "training steps"),
    ("pathtwt.compress.export", "export_backbone", "export"),
]
OPTIONAL = {"tile_embeddings", "_check_bf16", "first_step_precision", "fit_layer_outputs", "held_out_outputs"}  # absent in some versions: skipped


class PhaseClock:
    """Exclusive seconds per phase: a phase's time excludes the wrapped calls inside it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[list[float]] = []  # [start, seconds spent in nested phases]
        # the arguments of the latest distillation (the subset search runs one per
        # candidate): the job's last one is replayed to count its host waits
        self.last_distillation: tuple[tuple, dict] | None = None

    def wrap(self, fn: Callable, phase: str) -> Callable:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stack.append([time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                start, nested = self._stack.pop()
                spent = time.perf_counter() - start
                self.seconds[phase] = self.seconds.get(phase, 0.0) + spent - nested
                self.calls[phase] = self.calls.get(phase, 0) + 1
                if self._stack:
                    self._stack[-1][1] += spent

        return timed


def install(clock: PhaseClock) -> None:
    """Wrap every phase function in its module and in every pathtwt module that imported it
    by name at load time."""
    import pathtwt.cli  # noqa: F401

    for module_name, attr, phase in PHASES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            if attr in OPTIONAL:
                continue
            raise
        owner, name = module, attr
        if not hasattr(owner, name):
            if attr in OPTIONAL:
                continue
            raise SystemExit(f"{module_name}.{attr}: not found; update PHASES for this version")
        original = getattr(owner, name)
        _replace(name, original, clock.wrap(original, phase))
    _record_distillations(clock)
    # TargetCache's constructors are classmethods: wrap them on the class (in
    # compress/targets.py, or in distill.py before it)
    distill = importlib.import_module("pathtwt.compress.distill")
    cls = getattr(distill, "TargetCache", None)
    for name, phase in (("build", "teacher targets"), ("from_outputs", "teacher targets from the shared outputs")):
        if cls is not None and name in cls.__dict__:
            setattr(cls, name, classmethod(clock.wrap(cls.__dict__[name].__func__, phase)))


def _replace(name: str, original: Callable, replacement: Callable) -> None:
    """``replacement`` for ``original`` as the attribute ``name`` of every loaded pathtwt
    module that holds it (its own module, and those that imported it by name)."""
    for loaded in list(sys.modules.values()):
        if getattr(loaded, "__name__", "").startswith("pathtwt") and getattr(loaded, name, None) is original:
            setattr(loaded, name, replacement)


def _record_distillations(clock: PhaseClock) -> None:
    """Keep the arguments of the latest distillation (``clock.last_distillation``), for the
    replay that counts its host waits; the job itself runs untouched."""
    timed = importlib.import_module("pathtwt.compress.distill").distill

    @functools.wraps(timed)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        clock.last_distillation = (args, kwargs)
        return timed(*args, **kwargs)

    _replace("distill", timed, recorded)


def host_waits_per_step(call: tuple[tuple, dict]) -> dict[str, Any]:
    """A :data:`REPLAY_STEPS`-step replay of one recorded distillation, counting its host
    waits per step (see the module doc)."""
    import copy
    import dataclasses

    from host_waits import DEVICE, counted_run

    from pathtwt.compress.distill import distill

    (student, teacher, tiles), kwargs = call[0][:3], dict(call[1])
    options = kwargs["options"]
    on_gpu = options.device.startswith("cuda")
    kwargs["options"] = dataclasses.replace(options, steps=REPLAY_STEPS, epochs=None, stop_after=None, checkpoint=None,
                                            progress=False, workers=0, device=options.device if on_gpu else DEVICE)
    kwargs.pop("description", None)
    return counted_run(kwargs["options"].device,
                       lambda: distill(copy.deepcopy(student), copy.deepcopy(teacher), tiles, **kwargs))[1]


def startup_seconds() -> float:
    """A fresh interpreter's import of torch, timm and pathtwt's compress CLI."""
    code = "import time; t=time.perf_counter(); import torch, timm, pathtwt.cli.compress; print(time.perf_counter()-t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return float(out.stdout.strip().splitlines()[-1])


def run_job(clock: PhaseClock, argv: list[str], command: str = "compress") -> tuple[float, dict[str, float], dict[str, int]]:
    """One job's wall time and its phases (the clock's totals after the job less before)."""
    from pathtwt.cli import main

    seconds, calls = dict(clock.seconds), dict(clock.calls)
    start = time.perf_counter()
    rc = main([command, *argv])
    wall = time.perf_counter() - start
    if rc not in (0, None):
        raise SystemExit(f"pathtwt {command} exited {rc}")
    return (wall, {k: v - seconds.get(k, 0.0) for k, v in clock.seconds.items() if v - seconds.get(k, 0.0) > 0},
            {k: v - calls.get(k, 0) for k, v in clock.calls.items() if v - calls.get(k, 0) > 0})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", action="append", required=True, help="the arguments of one pathtwt compress job")
    parser.add_argument("--discover", help="the arguments of the pathtwt discover job run first, as the workflow "
                        "does (it leaves the shared teacher pass and the reference rows in the teacher cache); its "
                        "time is printed beside the table")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(torch.get_num_threads())
    clock = PhaseClock()
    install(clock)  # once: the later jobs run the same wrapped functions
    discover = None
    if args.discover:
        wall, seconds, _ = run_job(clock, shlex.split(args.discover), "discover")
        discover = {"job": args.discover, "wall_s": wall, "phases": seconds}
    results, replays = [], []
    for job in args.job:
        clock.last_distillation = None
        wall, seconds, calls = run_job(clock, shlex.split(job))
        results.append({"job": job, "wall_s": wall, "phases": seconds, "calls": calls})
        replays.append(clock.last_distillation)
    for r, call in zip(results, replays):  # after every job: the timed jobs run untouched
        r["host_waits"] = host_waits_per_step(call) if call is not None else None
    startup = startup_seconds()

    listed = [phase for _, _, phase in PHASES] + ["teacher targets", "teacher targets from the shared outputs"]
    names = [phase for phase in dict.fromkeys(listed) if any(phase in r["phases"] for r in results)]
    header = "| phase | " + " | ".join(f"job {i + 1} s | share" for i in range(len(results))) + " |"
    print(header)
    print("|---|" + "---|---|" * len(results))
    for name in names + ["other"]:
        cells = []
        for r in results:
            s = r["phases"].get(name, 0.0) if name != "other" else r["wall_s"] - sum(r["phases"].values())
            cells.append(f"{s:.1f} | {s / r['wall_s']:.0%}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("| **job wall** | " + " | ".join(f"**{r['wall_s']:.1f}** | 100%" for r in results) + " |")
    for i, r in enumerate(results):
        outside = r["wall_s"] - r["phases"].get("training steps", 0.0)
        fitting = r["phases"].get("audition: fitting candidates", 0.0)
        print(f"job {i + 1}: outside the training steps {outside:.1f} s = {outside / r['wall_s']:.0%} of the job; "
              f"outside the training steps and auditioning's fitting steps {outside - fitting:.1f} s = "
              f"{(outside - fitting) / r['wall_s']:.0%}")
    for i, r in enumerate(results):
        waits = r["host_waits"]
        if waits is None or waits["host_waits_per_step"] is None:
            print(f"job {i + 1}: host waits per training step n/a (no distillation of {REPLAY_STEPS} steps)")
            continue
        where = {k: v for k, v in waits["where"].items() if k != "async_h2d"}
        print(f"job {i + 1}: host waits per training step {waits['host_waits_per_step']:.3g} "
              f"({waits['counted_on']}, {REPLAY_STEPS}-step replay): {where}")
    if discover is not None:
        shared = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(discover["phases"].items(), key=lambda kv: -kv[1]))
        print(f"discover job first (once per calibration set): {discover['wall_s']:.1f} s ({shared})")
    total = sum(r["wall_s"] for r in results)
    print(f"jobs together {total:.1f} s; each workflow job also pays a process start-up of {startup:.1f} s "
          f"(interpreter, torch, timm) measured in a fresh interpreter")
    if args.json:
        from pathtwt.io.atomic import write_json_atomic

        write_json_atomic(args.json, {"jobs": results, "discover": discover, "startup_s": startup})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
