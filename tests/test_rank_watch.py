"""The failure notices and the watcher of a data-parallel run (pathtwt.compress.rank_failures),
against a store in a dict: a notice once read is acted on whatever the store does next (it
fails, or never answers again); a rank behind the others for --rank-timeout is named; an
interrupt releases the others; a rank's own collective error is its line, posted for the
others, unless another rank's notice came first; a stop signal after another rank failed
says that rank's cause."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch.distributed as dist

from pathtwt.compress import rank_failures, ranks
from pathtwt.compress.rank_failures import Notice, PeerWatch, leave_after_error, post, read
from conftest import REPO

PREFIX = "pathtwt compress: error: "


class DictStore:
    """TCPStore's calls the notices use, over a dict; ``gone`` makes every call fail, and
    ``hang`` makes every call wait for ever (a store whose host is gone, either way)."""

    def __init__(self):
        self.data, self.gone, self.hang = {}, False, False
        self._never = threading.Event()

    def _call(self):
        if self.hang:
            self._never.wait()
        if self.gone:
            raise dist.DistNetworkError("Connection reset by peer")

    def compare_set(self, key, expected, desired):
        self._call()
        self.data.setdefault(key, desired.encode() if isinstance(desired, str) else desired)
        return self.data[key]

    def check(self, keys):
        self._call()
        return all(k in self.data for k in keys)

    def get(self, key):
        self._call()
        return self.data[key]

    def multi_get(self, keys):
        return [self.get(k) for k in keys]

    def set(self, key, value):
        self._call()
        self.data[key] = value.encode() if isinstance(value, str) else value


@pytest.fixture
def ended(monkeypatch):
    """What the watcher ends the rank with: (exit status, line), instead of ending the test."""
    out = []
    lines = []
    monkeypatch.setattr(rank_failures, "GRACE_S", 0.3)
    monkeypatch.setattr(rank_failures, "POLL_S", 0.05)
    monkeypatch.setattr(rank_failures, "ACK_WAIT_S", 0.3, raising=False)
    monkeypatch.setattr(rank_failures, "_reported", False)
    monkeypatch.setattr(rank_failures.os, "write", lambda fd, data: lines.append(data.decode()))
    monkeypatch.setattr(rank_failures.os, "_exit", lambda code: out.append((code, lines[-1] if lines else "")))
    return out


def _wait_for(out, seconds=5.0):
    end = time.monotonic() + seconds
    while not out and time.monotonic() < end:
        time.sleep(0.02)
    return out


@pytest.mark.parametrize("after", ["gone", "hang"])
def test_a_notice_once_read_ends_the_rank_whatever_the_store_does_next(ended, after):
    store = DictStore()
    watch = PeerWatch(store, 1, 2, PREFIX)
    watch.start()
    post(store, Notice(0, "failed", "training tile 8: OSError: [Errno 5] Input/output error"))
    end = time.monotonic() + 5
    while store.data.get(rank_failures.SEEN_KEY.format(rank=1)) is None and time.monotonic() < end:
        time.sleep(0.01)
    setattr(store, after, True)  # the store's host exits with the failing rank
    try:
        assert _wait_for(ended) == [(1, f"{PREFIX}rank 1 of 2: stopped because rank 0 failed: training tile 8: "
                                        "OSError: [Errno 5] Input/output error\n")]
    finally:
        watch.done.set()
        store._never.set()


def test_an_interrupt_on_another_rank_releases_this_one(ended):
    store = DictStore()
    watch = PeerWatch(store, 0, 2, PREFIX, stop_prefix="pathtwt compress: ")
    watch.start()
    post(store, Notice(1, "interrupted", "interrupted"))
    try:
        assert _wait_for(ended) == [(130, "pathtwt compress: rank 0 of 2: stopped because rank 1 was interrupted\n")]
    finally:
        watch.done.set()


def test_a_rank_behind_the_others_for_the_timeout_is_named_by_every_rank(ended, monkeypatch):
    """Rank 0 has entered a collective rank 1 never reaches: after the timeout rank 0 posts
    a notice naming rank 1 and ends with it; rank 1's own watcher ends it with its line."""
    store = DictStore()
    store.set(rank_failures.BEAT_KEY.format(rank=1), "4")  # rank 1 stuck at its 4th collective
    monkeypatch.setattr(ranks, "_entered", 5)
    watch = PeerWatch(store, 0, 2, PREFIX, timeout_s=0.5)
    started = time.monotonic()
    watch.start()
    try:
        assert _wait_for(ended)
        assert time.monotonic() - started >= 0.5
        code, line = ended[0]
        assert code == 1 and line.startswith(f"{PREFIX}rank 0 of 2: stopped because rank 1 stopped reporting: no progress "
                                              "for 0.00833 minutes while the other ranks waited for it"), line
    finally:
        watch.done.set()
    assert read(store).rank == 1 and read(store).kind == "stalled" and read(store).poster == 0
    ended.clear()
    monkeypatch.setattr(rank_failures, "_reported", False)
    stuck = PeerWatch(store, 1, 2, PREFIX)
    stuck.start()
    try:
        assert _wait_for(ended)[0][1].startswith(f"{PREFIX}rank 1 of 2: stopped reporting: no progress for")
    finally:
        stuck.done.set()


def test_ranks_that_move_together_are_not_named(ended, monkeypatch):
    store = DictStore()
    store.set(rank_failures.BEAT_KEY.format(rank=1), "5")
    monkeypatch.setattr(ranks, "_entered", 5)
    watch = PeerWatch(store, 0, 2, PREFIX, timeout_s=0.2)
    watch.start()
    time.sleep(0.8)
    watch.done.set()
    assert ended == [] and read(store) is None


@pytest.fixture
def rank_1_of_2(monkeypatch):
    store, aborted = DictStore(), []
    monkeypatch.setattr(ranks, "world_size", lambda: 2)
    monkeypatch.setattr(ranks, "rank", lambda: 1)
    monkeypatch.setattr(ranks, "abort", lambda: aborted.append(True) or True)
    monkeypatch.setattr(rank_failures, "_store", lambda: store)
    monkeypatch.setattr(rank_failures, "_reported", False)
    monkeypatch.setattr(rank_failures, "ACK_WAIT_S", 0.2, raising=False)
    return store, aborted


NCCL_OOM = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error (run with "
            "NCCL_DEBUG=INFO for details), NCCL version 2.27.5\nncclUnhandledCudaError: Call to CUDA function failed.\n"
            "Last error:\nCuda failure 2 'out of memory'")


def test_a_ranks_own_collective_error_is_its_line_for_all(rank_1_of_2):
    store, aborted = rank_1_of_2
    out = leave_after_error(dist.DistBackendError(NCCL_OOM), None)
    assert str(out) == ("rank 1 of 2: its collective failed: DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/"
                        "c10d/NCCLUtils.cpp:77, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version "
                        "2.27.5 (Cuda failure 2 'out of memory')")
    assert read(store).rank == 1 and read(store).kind == "failed" and read(store).line == str(out).removeprefix("rank 1 of 2: ")
    assert aborted == [True]


def test_another_ranks_notice_first_is_the_cause_also_of_a_signal(rank_1_of_2):
    store, _ = rank_1_of_2
    assert leave_after_error(KeyboardInterrupt(), None) is None  # alone, a stop stays one, posted
    assert read(store) == Notice(1, "interrupted", "interrupted")
    store.data.clear()
    post(store, Notice(0, "failed", "/x/checkpoint.pt: cannot write it: no space left on the device"))
    said = "rank 1 of 2: stopped because rank 0 failed: /x/checkpoint.pt: cannot write it: no space left on the device"
    # its own collective error, then the stop signal torchrun sends the ranks still running
    assert str(leave_after_error(dist.DistBackendError("Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000"),
                                 None)) == said
    assert str(leave_after_error(KeyboardInterrupt(), None)) == said
    assert read(store).rank == 0


# ---- a rank that ended well exits through the interpreter: its watcher must be out of the store first ----

# The watcher in a real TCPStore call (C++, the GIL released, as every TCPStore call in torch's
# bindings) when the run ends; the interpreter's finalisation then outlasts the call (a slow __del__
# in __main__, whose globals are cleared after CPython marks itself finalising). A daemon thread
# that retakes the GIL then is ended with pthread_exit, and the forced unwind through pybind11's
# noexcept gil_scoped_release destructor calls std::terminate: SIGABRT after a run that ended well.
IN_FLIGHT_AT_EXIT = """
import threading, time
from datetime import timedelta
import torch.distributed as dist
from pathtwt.compress import rank_failures

server = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30))


class InFlight:
    def __init__(self, store):
        self.store, self.entered = store, threading.Event()

    def check(self, keys):
        self.entered.set()
        try:
            self.store.wait(["never"], timedelta(milliseconds=300))
        except Exception:
            pass
        return False

    def __getattr__(self, name):
        return getattr(self.store, name)


store = InFlight(server)
rank_failures.POLL_S = 0.01
rank_failures._watch = rank_failures.PeerWatch(store, 1, 2, "pathtwt compress: error: ")
rank_failures._watch.start()
assert store.entered.wait(10)
print("stopped", rank_failures.stop_watching(), flush=True)


class SlowFinalise:
    def __del__(self):
        time.sleep(1.0)


slow = SlowFinalise()
"""


def test_a_rank_that_ended_well_exits_cleanly_with_its_watcher_in_a_store_call(tmp_path):
    script = tmp_path / "rank_exit.py"
    script.write_text(IN_FLIGHT_AT_EXIT)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert "terminate called" not in res.stderr, res.stderr[-2000:]
    assert res.returncode == 0 and res.stdout.split() == ["stopped", "True"], (res.returncode, res.stdout, res.stderr[-2000:])


def test_a_watcher_whose_store_call_never_returns_is_given_up_in_bounded_time(monkeypatch):
    store = DictStore()
    store.hang = True  # the store call the watcher is in never returns
    monkeypatch.setattr(rank_failures, "POLL_S", 0.01)
    monkeypatch.setattr(rank_failures, "STOP_WAIT_S", 0.3)
    watch = PeerWatch(store, 1, 2, PREFIX)
    monkeypatch.setattr(rank_failures, "_watch", watch)
    watch.start()
    time.sleep(0.1)
    try:
        began = time.monotonic()
        assert rank_failures.stop_watching() is False  # the caller then leaves with os._exit
        assert time.monotonic() - began < 2.0 and rank_failures._watch is None
    finally:
        store._never.set()
    watch.join(5)
    assert not watch.is_alive()
