"""Real gloo ranks of ``pathtwt compress`` (tests/rank_faults.py), with the other rank held
where an NCCL rank would be: inside a wait no signal interrupts and no closed connection
ends. Whatever ends one rank, the others end within seconds with a line that names it:

- a rank's own collective error (NCCL's out of memory) is the job's line;
- a rank that stops reporting is named by the others after --rank-timeout;
- rank 0 fails under a plain two-process launch and takes the store with it; on two
  torchrun "nodes" the failing rank's node agent, which hosts the store, is killed: the
  held rank still ends with the failing rank's line;
- SIGTERM while the teacher-target cache is built, and during the checkpoint written after
  the last step: every rank ends at once, without a traceback; the checkpoint is whole and
  the rerun resumes from it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rank_faults import STEPS, compress_argv, write_tiles
from test_compress_rank_faults import AFTER_FAILURE_S, BOUND_S, REPO, TORCHRUN, start

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks in /proc (Linux)")
RANK_TIMEOUT_MIN = 0.2
# targets cached (augmentation off); the loop's last checkpoint at step 4, the one after it at STEPS
LAST_CHECKPOINT = ("--augment", "off", "--checkpoint-every", "4")


@pytest.fixture(scope="module")
def tiles(tmp_path_factory) -> Path:
    return write_tiles(tmp_path_factory.mktemp("tiles"), 12)


def _wait_for(path: Path, what, seconds: float = 120.0) -> float:
    """Wait until ``what(path)`` holds; the time it did."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if path.exists() and what(path):
            return time.time()
        time.sleep(0.05)
    raise AssertionError(f"{path}: not there within {seconds:.0f} s")


def _sweep(marker: str) -> list[int]:
    """Kill every process whose command line holds ``marker`` (a test's own folder); the pids."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return found


def _ended(job, tmp_path: Path):
    """The job, once it has ended within the bound (its processes killed otherwise)."""
    try:
        job.wait(timeout=120)
    finally:
        _sweep(str(tmp_path))
    assert job.seconds < BOUND_S, (job.lines(0), job.lines(1))
    return job


def _no_traceback(*texts: list[str]) -> bool:
    return not any("Traceback" in line for lines in texts for line in lines)


def test_a_ranks_own_collective_error_is_the_jobs_line(tiles, tmp_path):
    job = start(tiles, tmp_path / "out", tmp_path, fault="collective:1").wait()
    own, theirs = job.lines(1)[-1], job.lines(0)[-1]
    assert job.proc.returncode != 0 and job.seconds < BOUND_S, (own, theirs)
    assert own.startswith("pathtwt compress: error: rank 1 of 2: ") and "out of memory" in own, own
    assert theirs.startswith("pathtwt compress: error: rank 0 of 2: stopped because rank 1 failed: ") and "out of memory" in theirs
    assert _no_traceback(job.lines(0), job.lines(1))


def test_a_rank_that_stops_reporting_is_named_by_the_others(tiles, tmp_path):
    mark = tmp_path / "held"
    job = start(tiles, tmp_path / "out", tmp_path, fault=f"hold:1:{mark}", extra=("--rank-timeout", str(RANK_TIMEOUT_MIN)))
    try:
        held = _wait_for(mark, Path.exists)
        job.wait(timeout=120)
    finally:
        _sweep(str(tmp_path))
    assert job.ended - held < 60 * RANK_TIMEOUT_MIN + AFTER_FAILURE_S, (job.ended - held, job.lines(0), job.lines(1))
    waiting, stalled = job.lines(0)[-1], job.lines(1)[-1]
    assert waiting.startswith("pathtwt compress: error: rank 0 of 2: stopped because rank 1 stopped reporting: no progress "
                              f"for {RANK_TIMEOUT_MIN:g} minutes while the other ranks waited for it"), waiting
    assert stalled.startswith("pathtwt compress: error: rank 1 of 2: stopped reporting: no progress"), stalled


def _plain_ranks(tiles: Path, out: Path, logs: Path, faults: str) -> list[subprocess.Popen]:
    """Two ranks started as plain ``srun`` starts them: no agent, rank 0 hosts the store."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    logs.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "OMP_NUM_THREADS": "1", "RANK_FAULT": faults,
           "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    return [subprocess.Popen([sys.executable, *compress_argv(tiles, out)], stdout=subprocess.DEVNULL,
                             stderr=(logs / f"{r}.log").open("w"), env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
            for r in range(2)]


def test_rank_0_fails_and_takes_the_store_with_it_the_other_rank_still_says_so(tiles, tmp_path):
    logs = tmp_path / "logs"
    procs = _plain_ranks(tiles, tmp_path / "out", logs, f"tile:0,hold:1:{tmp_path / 'held'}")
    try:
        procs[0].wait(timeout=120)
        gone = time.time()
        procs[1].wait(timeout=AFTER_FAILURE_S + 30)
        ended = time.time()
    finally:
        _sweep(str(tmp_path))
    lines = [(logs / f"{r}.log").read_text().strip().splitlines() for r in range(2)]
    assert ended - gone < AFTER_FAILURE_S, lines
    said = lines[0][-1].removeprefix("pathtwt compress: error: rank 0 of 2: ")
    assert said.startswith("training tile ") and said.endswith("OSError: [Errno 5] Input/output error"), lines[0]
    assert lines[1][-1] == f"pathtwt compress: error: rank 1 of 2: stopped because rank 0 failed: {said}", lines[1]


def test_two_nodes_the_failing_nodes_agent_killed_the_other_node_says_why(tiles, tmp_path):
    """Two torchrun agents, one rank each, meeting through the c10d rendezvous on this host;
    the one whose rank fails hosts the store, and is killed once its rank has said so."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agents, logs = [], []
    for node, fault in enumerate(["tile:*", f"hold:*:{tmp_path / 'held'}"]):
        logs.append(tmp_path / f"logs{node}")
        env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "OMP_NUM_THREADS": "1", "RANK_FAULT": fault}
        cmd = [str(TORCHRUN), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
               f"127.0.0.1:{port}", "--rdzv-id", "two-nodes", "--rdzv-conf", f"is_host={int(node == 0)}",
               "--local-addr", "127.0.0.1", "--max-restarts", "0", "--log-dir", str(logs[-1]), "--redirects", "3",
               *compress_argv(tiles, tmp_path / "out")]
        agents.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       start_new_session=True))
        time.sleep(1.0 if node == 0 else 0)  # node 0 binds the rendezvous port first

    def failure_line(root: Path):
        return lambda _: any("Input/output error" in p.read_text() for p in root.glob("*/attempt_0/*/stderr.log"))

    try:
        said = _wait_for(logs[0], failure_line(logs[0]))
        os.killpg(agents[0].pid, signal.SIGKILL)  # the store's host goes (if it has not already)
        ended = _wait_for(logs[1], failure_line(logs[1]), AFTER_FAILURE_S + 15)
    finally:
        _sweep(str(tmp_path))
    line = next(logs[1].glob("*/attempt_0/*/stderr.log")).read_text().strip().splitlines()[-1]
    assert ended - said < AFTER_FAILURE_S, line
    assert "stopped because rank" in line and "Input/output error" in line, line


def test_sigterm_in_the_cache_build_and_in_the_last_checkpoint_ends_every_rank(tiles, tmp_path):
    from pathtwt.compress.distill import load_checkpoint

    out = tmp_path / "out"
    # one rank signalled while the cache is built, the other inside it, deaf as a CUDA wait
    job = _ended(start(tiles, out, tmp_path, fault="cachestop:1,cachehold:0", extra=("--augment", "off")), tmp_path)
    assert job.lines(1)[-1] == "pathtwt compress: interrupted", job.lines(1)
    assert job.lines(0)[-1] == "pathtwt compress: rank 0 of 2: stopped because rank 1 was interrupted", job.lines(0)
    assert _no_traceback(job.lines(0), job.lines(1)) and not (out / "checkpoint.pt").exists()
    # rank 0 signalled while it writes the checkpoint after the last step, rank 1 held after it
    job = _ended(start(tiles, out, tmp_path, fault=f"finalstop:0:{STEPS},finalhold:1:{STEPS}", extra=LAST_CHECKPOINT), tmp_path)
    assert job.lines(0)[-1] == "pathtwt compress: interrupted", job.lines(0)
    assert job.lines(1)[-1] == "pathtwt compress: rank 1 of 2: stopped because rank 0 was interrupted", job.lines(1)
    assert _no_traceback(job.lines(0), job.lines(1))
    assert int(load_checkpoint(out / "checkpoint.pt")["step"]) == STEPS  # written whole
    again = start(tiles, out, tmp_path, extra=LAST_CHECKPOINT).wait()
    assert again.proc.returncode == 0, again.lines(0)
    assert json.loads((out / "model.json").read_text())["distillation"]["resumed_from"] == STEPS
