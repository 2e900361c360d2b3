"""Two real gloo ranks (torchrun) of ``pathtwt compress``, with a fault injected into one
of them (tests/rank_faults.py): whatever fails, and on whichever rank, the whole job ends
within seconds, each rank with one line naming the rank that failed and its error, and no
``model.safetensors`` is left. A stop signal, once or repeated, to the whole job (torchrun
and its ranks, as SLURM sends it) or to one rank, ends every rank after the same step,
rank 0 checkpoints it, and the rerun resumes there to the weights of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rank_faults import STEPS, compress_argv, write_tiles

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).parent / "torchrun"
# a whole job (start to end) takes a few seconds here, and a minute on a crowded machine
BOUND_S = 60.0
# from the failing rank's line to the job's end: seconds (the watcher's grace is 3 s), where
# torchrun alone would wait 30 s for a rank it signalled and the group's timeout 10 minutes
AFTER_FAILURE_S = 15.0

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds torchrun's ranks in /proc (Linux)")


@pytest.fixture(scope="module")
def tiles(tmp_path_factory) -> Path:
    return write_tiles(tmp_path_factory.mktemp("tiles"), 12)


class Job:
    def __init__(self, proc: subprocess.Popen, logs: Path, out: Path, started: float) -> None:
        self.proc, self.logs, self.out, self.started = proc, logs, out, started
        self.seconds, self.ended = 0.0, 0.0

    def wait(self, timeout: float = 180) -> "Job":
        self.proc.wait(timeout=timeout)
        self.seconds = time.monotonic() - self.started
        self.ended = time.time()
        return self

    def since_line(self, rank: int) -> float:
        """Seconds from the rank's last line (its log's last write) to the job's end."""
        return self.ended - next(self.logs.glob(f"*/attempt_0/{rank}/stderr.log")).stat().st_mtime

    def ranks(self) -> list[int]:
        """The pids of the ranks torchrun started (the processes running tests/rank_faults.py)."""
        out = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                words = cmdline.read_bytes().split(b"\0")
                status = (cmdline.parent / "status").read_text()
            except OSError:
                continue
            parent = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
            if parent == self.proc.pid and any(w.endswith(b"rank_faults.py") for w in words):
                out.append(int(cmdline.parent.name))
        return sorted(out)

    def lines(self, rank: int) -> list[str]:
        """What the rank wrote to stderr (torchrun --redirects keeps each rank's apart)."""
        found = list(self.logs.glob(f"*/attempt_0/{rank}/stderr.log"))
        return found[0].read_text().strip().splitlines() if found else []


def start(tiles: Path, out: Path, tmp: Path, *, fault: str = "", extra: tuple[str, ...] = ()) -> Job:
    logs = tmp / f"logs-{out.name}-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "OMP_NUM_THREADS": "1", "RANK_FAULT": fault}
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node=2", "--log-dir", str(logs), "--redirects", "3",
           *compress_argv(tiles, out, *extra)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return Job(proc, logs, out, time.monotonic())


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("fault, failing, says", [
    # rank 1 in its collective when rank 0 fails: gloo tells it at once
    ("save:0", 0, "checkpoint.pt: cannot write it: no space left on the device"),
    # rank 0 inside a long wait no signal ends (as a CUDA wait on NCCL, which learns nothing
    # of a rank gone) when rank 1 fails: its watcher ends it
    ("tile:1,busy:0:120", 1, "training tile 8: OSError: [Errno 5] Input/output error"),
], ids=["checkpoint-disk-full", "unreadable-tile-other-rank-stuck"])
def test_a_rank_that_fails_ends_the_job_with_its_line(tiles, tmp_path, fault, failing, says):
    job = start(tiles, tmp_path / "out", tmp_path, fault=fault).wait()
    assert job.proc.returncode != 0 and job.seconds < BOUND_S, (job.seconds, job.lines(0), job.lines(1))
    assert job.since_line(failing) < AFTER_FAILURE_S
    other = 1 - failing
    own, theirs = job.lines(failing)[-1], job.lines(other)[-1]
    assert own.startswith(f"pathtwt compress: error: rank {failing} of 2: ") and says in own, own
    assert theirs.startswith(f"pathtwt compress: error: rank {other} of 2: stopped because rank {failing} failed: ")
    assert says in theirs
    assert not any("Traceback" in line for r in (0, 1) for line in job.lines(r))
    assert not (job.out / "model.safetensors").exists()


def test_a_killed_rank_ends_the_job_and_the_others_say_they_lost_it(tiles, tmp_path):
    job = start(tiles, tmp_path / "out", tmp_path, fault="kill:1").wait()
    assert job.proc.returncode != 0 and job.seconds < BOUND_S
    assert job.lines(1) == []  # SIGKILL: no line of its own
    line = job.lines(0)[-1]
    assert line.startswith("pathtwt compress: error: rank 0 of 2: lost contact with the other ranks (") and "killed" in line
    assert not (job.out / "model.safetensors").exists()


# ---- stopping -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def uninterrupted(tiles, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("reference")
    job = start(tiles, tmp / "out", tmp).wait()
    assert job.proc.returncode == 0, job.lines(0)
    return job.out


def test_stop_signals_to_one_rank_and_to_the_whole_job_stop_every_rank_after_one_step(tiles, tmp_path, uninterrupted):
    out = tmp_path / "out"
    job = start(tiles, out, tmp_path, fault=f"mark:0:{tmp_path / 'mark'}")
    mark = tmp_path / "mark"
    end = time.monotonic() + 120
    while not mark.exists():
        assert job.proc.poll() is None and time.monotonic() < end, job.lines(0)
        time.sleep(0.02)
    # Ctrl-C to one rank, then SIGTERM as SLURM sends it at a time limit: to torchrun and to
    # every rank (torchrun forwards it to them again), and once more while they finish the step
    os.kill(job.ranks()[-1], signal.SIGINT)
    for _ in range(2):
        time.sleep(0.1)
        for pid in [job.proc.pid, *job.ranks()]:
            os.kill(pid, signal.SIGTERM)
    job.wait()
    for rank in (0, 1):
        assert job.lines(rank)[-1] == "pathtwt compress: interrupted", job.lines(rank)
    from pathtwt.compress.distill import load_checkpoint

    step = int(load_checkpoint(out / "checkpoint.pt")["step"])
    # the signals came in step index 2 (3 unless this machine was too slow to send them in time)
    assert 3 <= step < STEPS and not (out / "model.safetensors").exists()
    again = start(tiles, out, tmp_path).wait()
    assert again.proc.returncode == 0, again.lines(0)
    meta = json.loads((out / "model.json").read_text())
    assert meta["distillation"]["resumed_from"] == step
    a, b = _weights(out), _weights(uninterrupted)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6
