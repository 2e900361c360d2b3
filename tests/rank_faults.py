"""Faults injected into one rank of a real data-parallel ``pathtwt compress`` (helpers, not
tests). ``torchrun ... tests/rank_faults.py compress ARGS`` runs ``pathtwt compress`` in
each rank after patching, on the ranks that ``RANK_FAULT`` names, what a real fault would
break; nothing in the package knows about it.

``RANK_FAULT`` is ``KIND:RANK[:ARG]``, several separated by ``,``:

- ``tile:R`` - rank R cannot read its training tiles from step 2 on (each comes back with
  the reader's error, as an unreadable slide region does);
- ``save:R`` - rank R's checkpoint write finds the disk full;
- ``kill:R`` - rank R is SIGKILLed at step 2 (the kernel's out-of-memory killer);
- ``oom:R`` - rank R's GPU runs out of memory at step 2;
- ``busy:R:S`` - rank R spends S seconds in its step 2 before it reaches the step's
  collectives (a rank stuck in a CUDA wait, which no signal interrupts);
- ``argv:R:FLAG=VALUE`` - rank R is started with ``--FLAG VALUE`` added;
- ``mark:R:PATH`` - rank R writes PATH when it starts step 2 and then spends a second in it
  (a test signals the job then);
- ``stopexport:R`` - rank R is sent SIGTERM during its export, between the weights file
  and the ``model.json`` that completes the folder;
- ``collective:R`` - rank R's collective of step 2 raises NCCL's error (a ``DistBackendError``
  naming its GPU's out of memory);
- ``hold:R:PATH`` - rank R writes PATH at step 2, then waits there, deaf to signals, as a
  CUDA wait is (a rank that stops reporting, or that another's failure leaves waiting);
- ``cachestop:R`` - rank R is sent SIGTERM while it builds the teacher-target cache;
- ``cachehold:R`` - rank R waits, deaf to signals, while it builds the cache;
- ``finalstop:R:STEP`` - rank R is sent SIGTERM while it writes the checkpoint of STEP;
- ``finalhold:R:STEP`` - rank R waits, deaf to signals, after the checkpoint of STEP.

A rank ``*`` is every rank this launch starts (a node of its own, in a two-node test).

``SLOW_TILES=S``: every tile read takes S seconds.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from pathlib import Path

FAULT_STEP = 2


def _faults() -> dict[str, str]:
    """kind -> argument of the faults on this rank."""
    me = os.environ.get("RANK", "0")
    out = {}
    for spec in filter(None, os.environ.get("RANK_FAULT", "").split(",")):
        kind, rank, *arg = spec.split(":", 2)
        if rank in (me, "*"):
            out[kind] = arg[0] if arg else ""
    return out


def _at_step(action) -> None:
    from pathtwt.compress.distill import DeepSupervision

    original = DeepSupervision.loss

    def loss(self, student, x, targets, step):
        if step == FAULT_STEP:
            action()
        return original(self, student, x, targets, step)

    DeepSupervision.loss = loss


def _unreadable_tiles() -> None:
    from pathtwt.compress.training_tiles import TrainingItems

    original = TrainingItems.__getitem__

    def getitem(self, key):
        position, index, tile, error = original(self, key)
        return position, index, tile, error or ("OSError: [Errno 5] Input/output error" if position >= 8 else "")

    TrainingItems.__getitem__ = getitem


def _full_disk() -> None:
    import torch

    def save(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    torch.save = save


def _out_of_memory() -> None:
    import torch

    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.19 GiB "
                                 "of which 1.06 GiB is free.")


def _mark(path: str) -> None:
    Path(path).write_text("step 2")
    time.sleep(1.0)  # the signals land inside the step


def _stop_during_export() -> None:
    from pathtwt.models import hub_format

    original = hub_format.write_hub_format

    def write(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    hub_format.write_hub_format = write


HOLD_S = 300.0  # far past every bound of the tests: only another rank's notice ends it


def _hold(mark: str = "") -> None:
    """Wait as a CUDA wait does: no signal handler runs until it returns."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    if mark:
        Path(mark).write_text("held")
    time.sleep(HOLD_S)


def _collective_error() -> None:
    import torch.distributed as dist

    from pathtwt.compress import ranks

    original = ranks.all_mean
    calls = []

    def all_mean(values):
        calls.append(1)
        if len(calls) > 1 and os.environ.get("FAULT_STEP_SEEN"):
            raise dist.DistBackendError(
                "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error (run with "
                "NCCL_DEBUG=INFO for details), NCCL version 2.27.5\nncclUnhandledCudaError: Call to CUDA function failed.\n"
                "Last error:\nCuda failure 2 'out of memory'")
        return original(values)

    ranks.all_mean = all_mean
    _at_step(lambda: os.environ.__setitem__("FAULT_STEP_SEEN", "1"))


def _in_cache_build(action) -> None:
    from pathtwt.compress.targets import TargetCache

    original = TargetCache._computed.__func__

    def computed(cls, *args, **kwargs):
        action()
        return original(cls, *args, **kwargs)

    TargetCache._computed = classmethod(computed)


def _stop_in_final_checkpoint(step: int) -> None:
    from pathtwt.compress import distill

    original = distill.save_checkpoint

    def save(path, **kwargs):
        if kwargs["step"] == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(path, **kwargs)

    distill.save_checkpoint = save


def _hold_after_final_checkpoint(step: int) -> None:
    from pathtwt.compress import distill

    original = distill._Optimisation.checkpoint

    def checkpoint(self, student, at, run, options):
        original(self, student, at, run, options)
        if at == step:
            _hold()

    distill._Optimisation.checkpoint = checkpoint


def _slow_tiles(seconds: float) -> None:
    from pathtwt.compress.training_tiles import ArrayTiles

    original = ArrayTiles.read

    def read(self, index):
        time.sleep(seconds)
        return original(self, index)

    ArrayTiles.read = read


def main() -> int:
    faults = _faults()
    argv = sys.argv[1:]
    if "tile" in faults:
        _unreadable_tiles()
    if "save" in faults:
        _full_disk()
    if "kill" in faults:
        _at_step(lambda: os.kill(os.getpid(), signal.SIGKILL))
    if "oom" in faults:
        _at_step(_out_of_memory)
    if "busy" in faults:
        _at_step(lambda: time.sleep(float(faults["busy"])))
    if "mark" in faults:
        _at_step(lambda: _mark(faults["mark"]))
    if "stopexport" in faults:
        _stop_during_export()
    if "collective" in faults:
        _collective_error()
    if "hold" in faults:
        _at_step(lambda: _hold(faults["hold"]))
    if "cachestop" in faults:
        _in_cache_build(lambda: os.kill(os.getpid(), signal.SIGTERM))
    if "cachehold" in faults:
        _in_cache_build(_hold)
    if "finalstop" in faults:
        _stop_in_final_checkpoint(int(faults["finalstop"]))
    if "finalhold" in faults:
        _hold_after_final_checkpoint(int(faults["finalhold"]))
    if "argv" in faults:
        flag, value = faults["argv"].split("=", 1)
        argv += [f"--{flag}", value]
    if os.environ.get("SLOW_TILES"):
        _slow_tiles(float(os.environ["SLOW_TILES"]))
    from pathtwt.cli import main as pathtwt_main

    return pathtwt_main(argv)


if __name__ == "__main__":
    sys.exit(main())


def two_gloo_ranks(script: Path, *, timeout: float = 120) -> list[tuple[int, str, str]]:
    """Run ``script`` as ranks 0 and 1 of a gloo group (the environment torchrun gives, on a
    free port); (return code, stdout, stderr) of each."""
    import socket
    import subprocess

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    repo = Path(__file__).resolve().parents[1]
    base = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    procs = [subprocess.Popen([sys.executable, str(script)], env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:  # ranks that hang are not left behind
            p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]


def write_tiles(folder: Path, n: int) -> Path:
    """``n`` random 56 px PNG tiles in ``folder``: a calibration source ``pathtwt compress`` reads."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)).save(folder / f"t{i}.png")
    return folder


STEPS = 6  # the optimiser steps of a test run


def compress_argv(tiles: Path, out: Path, *extra: str) -> list[str]:
    """``rank_faults.py compress ...``: a short CPU run of ``STEPS`` steps on ``tiles``."""
    repo = Path(__file__).resolve().parents[1]
    return [str(repo / "tests" / "rank_faults.py"), "compress", "--backbone", "vit-s14-tiny", "--random-init",
            "--calibration", str(tiles), "--n-tiles", "12", "--depth", "2", "--steps", str(STEPS), "--batch-size", "4",
            "--audition-steps", "0", "--device", "cpu", "--precision", "fp32", "--no-progress", "--checkpoint-every", "1",
            "--out", str(out), *extra]
