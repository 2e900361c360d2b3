"""Fault injection for pathtwt commands (helpers, not tests).

A command runs as a subprocess in its own process group and is killed with SIGKILL
(no handler, no cleanup, exactly what an out-of-memory kill or a node failure does) at
a chosen moment: a fixed delay, or once it has made progress (a file matching a pattern
appeared or was rewritten since it started) plus a seeded random delay. Then:

* :func:`visible_files` / :func:`assert_nothing_looks_finished` check what a killed run
  left: only hidden temporary files (``.name.tmp-*``), the command's declared resume
  files, and complete files equal to a clean run's; a marker of a finished result only
  when it is the finished result;
* the command is run again to completion and :func:`compare_trees` compares its outputs
  with those of a clean, uninterrupted run: HDF5 datasets numerically (exactly, unless a
  tolerance is given), JSON ignoring timing and provenance keys, tensors in safetensors
  and torch files numerically, anything else byte for byte.
"""

from __future__ import annotations

import fnmatch
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

# JSON keys (or attrs) that legitimately differ between two runs of the same command:
# wall-clock times, speeds, dates, hosts, the command line, and resume bookkeeping.
VOLATILE_KEYS = ("time", "second", "elapsed", "duration", "date", "created", "host", "per_s", "wall",
                 "resum", "command", "platform", "python", "torch_version", "started", "finished", "progress",
                 "waited")  # who waited for whom (extraction): measured shares of wall time


@dataclass(frozen=True)
class Kill:
    """When to SIGKILL: ``delay`` seconds after the start, or, with ``after``, ``delay``
    seconds after a file matching the glob ``after`` (relative to the watched folder,
    hidden names included) was created or rewritten by this run."""

    delay: float = 0.0
    after: str | None = None

    def describe(self) -> str:
        return f"{self.delay:.2f} s after {self.after or 'start'}"


@dataclass
class KillResult:
    kill: Kill
    killed: bool  # False when the command finished before the moment came
    returncode: int
    seconds: float
    stderr: str = field(repr=False, default="")


def pathtwt_command(args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pathtwt", *map(str, args)]


def subprocess_env(threads: int | None = None) -> dict[str, str]:
    """The environment for command subprocesses: the same compute threads as the test
    process (so floating-point reductions happen in the same order) and no colour/TTY
    dependent output."""
    env = dict(os.environ)
    if threads is None:
        try:
            import torch

            threads = torch.get_num_threads()
        except ImportError:  # pragma: no cover - torch is a dependency
            threads = 1
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[key] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def seeded_kills(seed: int, *, after: Sequence[str | None], max_delay: float) -> list[Kill]:
    """One kill per entry of ``after``, each a seeded random delay in [0, max_delay)."""
    rng = random.Random(seed)
    return [Kill(delay=rng.uniform(0.0, max_delay), after=a) for a in after]


def _fresh_match(folder: Path, pattern: str, since: float) -> bool:
    if not folder.exists():
        return False
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            if fnmatch.fnmatch(str(path.relative_to(folder)), pattern):
                try:
                    if path.stat().st_mtime >= since:
                        return True
                except FileNotFoundError:  # a temporary file renamed under our feet
                    continue
    return False


def run_and_kill(command: Sequence[str], kill: Kill, *, watch: Path, cwd: Path | None = None,
                 env: dict[str, str] | None = None, timeout: float = 300.0, poll: float = 0.005) -> KillResult:
    """Run ``command``, SIGKILL its whole process group at the moment ``kill`` says (or
    let it finish if it ends first); never leaves a child behind."""
    start = time.time()
    proc = subprocess.Popen(list(command), cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    # mtimes have coarse resolution on some filesystems: count files from just before the start
    since = start - 0.01
    triggered_at = None if kill.after else start
    try:
        while proc.poll() is None:
            now = time.time()
            if now - start > timeout:
                raise TimeoutError(f"{command[:4]} did not reach {kill.describe()} within {timeout} s")
            if triggered_at is None and _fresh_match(watch, kill.after, since):
                triggered_at = now
            if triggered_at is not None and now - triggered_at >= kill.delay:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return KillResult(kill, True, proc.returncode, time.time() - start, _read(proc))
            time.sleep(poll)
        return KillResult(kill, False, proc.returncode, time.time() - start, _read(proc))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _read(proc: subprocess.Popen) -> str:
    return proc.stderr.read().decode(errors="replace") if proc.stderr else ""


def run_to_completion(command: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
                      timeout: float = 300.0) -> subprocess.CompletedProcess:
    result = subprocess.run(list(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command[2:5])} failed ({result.returncode}): {result.stderr[-2000:]}")
    return result


# -- what a killed run leaves ---------------------------------------------------------------

def is_temporary(path: Path) -> bool:
    return path.name.startswith(".") and ".tmp-" in path.name


def visible_files(folder: Path) -> list[Path]:
    """Files under ``folder`` that are not hidden (folder scans and Snakemake see these)."""
    if not folder.exists():
        return []
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        out.extend(Path(root) / f for f in files if not f.startswith("."))
    return sorted(out)


def assert_nothing_looks_finished(folder: Path, *, markers: Iterable[str] = (), resume_files: Iterable[str] = (),
                                  reference: Path | None = None, rtol: float = 0.0, atol: float = 0.0) -> list[str]:
    """After a kill: every hidden file is a temporary one, and every visible file is
    complete (it parses) and, given the ``reference`` folder of a clean run, holds the
    same results as the file there (a file a killed run published must be final, not a
    draft). A marker of a finished result may exist only when it equals the clean run's
    (the kill came after the work was done, e.g. during interpreter shutdown); the
    markers found are returned."""
    markers, resume_files = list(markers), list(resume_files)
    found = []
    for path in visible_files(folder):
        rel = str(path.relative_to(folder))
        if any(fnmatch.fnmatch(rel, m) for m in markers):
            assert reference is not None, f"{rel} exists although the run was killed"
            found.append(rel)
        assert_complete(path)
        if reference is not None and not any(fnmatch.fnmatch(rel, r) for r in resume_files):
            assert (reference / rel).exists(), f"{rel} was published by a killed run but a clean run has no such file"
            compare_file(reference / rel, path, roots=[str(reference), str(folder)], rtol=rtol, atol=atol)
    if folder.exists():
        for root, _dirs, files in os.walk(folder):
            for name in files:
                if name.startswith("."):
                    assert is_temporary(Path(name)), f"unexpected hidden file {name} in {root}"
    return found


def assert_complete(path: Path) -> None:
    """A visible file must be whole: HDF5, JSON, safetensors and torch files are opened
    and read in full."""
    suffix = path.suffix.lower()
    if suffix == ".h5":
        import h5py

        with h5py.File(path, "r") as h5:
            h5.visititems(lambda _name, obj: obj[()] if isinstance(obj, h5py.Dataset) else None)
    elif suffix == ".json":
        json.loads(path.read_text(encoding="utf-8"))
    elif suffix == ".safetensors":
        from safetensors.numpy import load_file

        load_file(str(path))
    elif suffix == ".pt":
        import torch

        torch.load(path, map_location="cpu", weights_only=False)


# -- comparing a resumed run with a clean one -------------------------------------------------

def _volatile(key: str) -> bool:
    key = key.lower()
    return any(v in key for v in VOLATILE_KEYS)


def normalise(value: Any, roots: Sequence[str]) -> Any:
    """JSON-like value with volatile keys dropped and run-folder paths replaced by <RUN>."""
    if isinstance(value, dict):
        return {k: normalise(v, roots) for k, v in value.items() if not _volatile(str(k))}
    if isinstance(value, (list, tuple)):
        return [normalise(v, roots) for v in value]
    if isinstance(value, str):
        for root in roots:
            value = value.replace(root, "<RUN>")
        return value
    return value


def _assert_close(a: Any, b: Any, where: str, rtol: float, atol: float) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), f"{where}: keys differ: {sorted(set(a) ^ set(b))}"
        for k in a:
            _assert_close(a[k], b[k], f"{where}.{k}", rtol, atol)
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), f"{where}: lengths differ ({len(a)} vs {len(b)})"
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{where}[{i}]", rtol, atol)
    elif isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None and np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True), \
            f"{where}: {a!r} != {b!r}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _arrays_equal(a: np.ndarray, b: np.ndarray, where: str, rtol: float, atol: float) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, f"{where}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
    if rtol == 0 and atol == 0 or not np.issubdtype(a.dtype, np.floating):
        assert np.array_equal(a, b, equal_nan=np.issubdtype(a.dtype, np.floating)), \
            f"{where}: arrays differ ({_max_diff(a, b)})"
    else:
        assert np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True), f"{where}: arrays differ ({_max_diff(a, b)})"


def _max_diff(a: np.ndarray, b: np.ndarray) -> str:
    if np.issubdtype(a.dtype, np.number):
        return f"max |diff| {np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))):.3g}"
    return "non-numeric"


def _h5_tree(path: Path, roots: Sequence[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    import h5py

    arrays: dict[str, np.ndarray] = {}
    attrs: dict[str, Any] = {}
    with h5py.File(path, "r") as h5:
        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                arrays[name] = obj[()]
            attrs[name] = {k: _plain(v) for k, v in obj.attrs.items()}

        attrs["/"] = {k: _plain(v) for k, v in h5.attrs.items()}
        h5.visititems(visit)
    return arrays, normalise(attrs, roots)


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _tensors(path: Path) -> dict[str, np.ndarray]:
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file

        return load_file(str(path))
    import torch

    flat: dict[str, np.ndarray] = {}

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            flat[prefix] = obj.detach().cpu().numpy()
        elif isinstance(obj, dict):
            for k, v in obj.items():
                if not _volatile(str(k)):
                    walk(f"{prefix}.{k}", v)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(f"{prefix}[{i}]", v)
        elif isinstance(obj, (int, float, bool, str)) or obj is None:
            flat[prefix] = np.asarray(obj if not isinstance(obj, str) else obj.encode())

    walk("", torch.load(path, map_location="cpu", weights_only=False))
    return flat


def compare_file(a: Path, b: Path, *, roots: Sequence[str], rtol: float = 0.0, atol: float = 0.0) -> None:
    """Assert that two outputs of the same command hold the same results."""
    suffix = a.suffix.lower()
    if suffix == ".h5":
        (arr_a, attrs_a), (arr_b, attrs_b) = _h5_tree(a, roots), _h5_tree(b, roots)
        assert arr_a.keys() == arr_b.keys(), f"{a.name}: datasets differ: {sorted(set(arr_a) ^ set(arr_b))}"
        for key in arr_a:
            _arrays_equal(arr_a[key], arr_b[key], f"{a.name}:{key}", rtol, atol)
        _assert_close(attrs_a, attrs_b, f"{a.name} attrs", rtol, atol)
    elif suffix == ".json":
        _assert_close(normalise(json.loads(a.read_text()), roots), normalise(json.loads(b.read_text()), roots),
                      a.name, rtol, atol)
    elif suffix in (".safetensors", ".pt"):
        ta, tb = _tensors(a), _tensors(b)
        assert ta.keys() == tb.keys(), f"{a.name}: entries differ: {sorted(set(ta) ^ set(tb))}"
        for key in ta:
            _arrays_equal(np.asarray(ta[key]), np.asarray(tb[key]), f"{a.name}:{key}", rtol, atol)
    elif suffix == ".csv":
        import pandas as pd

        da, db = pd.read_csv(a), pd.read_csv(b)
        assert list(da.columns) == list(db.columns) and len(da) == len(db), f"{a.name}: tables differ in shape"
        for column in da.columns:
            _arrays_equal(da[column].to_numpy(), db[column].to_numpy(), f"{a.name}:{column}", rtol, atol)
    else:
        assert a.read_bytes() == b.read_bytes(), f"{a.name}: bytes differ"


def compare_trees(clean: Path, resumed: Path, *, ignore: Iterable[str] = (), rtol: float = 0.0,
                  atol: float = 0.0) -> list[str]:
    """Compare every visible file of two output folders (same relative names required,
    globs in ``ignore`` skipped); returns the relative names compared."""
    ignore = list(ignore)

    def names(folder: Path) -> set[str]:
        rels = (str(p.relative_to(folder)) for p in visible_files(folder))
        return {r for r in rels if not any(fnmatch.fnmatch(r, g) for g in ignore)}

    a, b = names(clean), names(resumed)
    assert a == b, f"output files differ: only clean {sorted(a - b)}, only resumed {sorted(b - a)}"
    roots = [str(clean), str(resumed)]
    for rel in sorted(a):
        compare_file(clean / rel, resumed / rel, roots=roots, rtol=rtol, atol=atol)
    return sorted(a)


def kill_then_finish(command: Sequence[str], kills: Sequence[Kill], *, watch: Path, markers: Iterable[str] = (),
                     resume_files: Iterable[str] = (), reference: Path | None = None, rtol: float = 0.0,
                     atol: float = 0.0, env: dict[str, str] | None = None, cwd: Path | None = None,
                     timeout: float = 300.0) -> list[KillResult]:
    """Run ``command`` once per kill, all in the same output folder so that each run
    resumes what the previous one left, checking after each kill what it left (see
    :func:`assert_nothing_looks_finished`); then run it to completion. A run that ends
    before its kill ends the series (the caller asserts how many kills landed)."""
    markers, resume_files = list(markers), list(resume_files)
    results = []
    for kill in kills:
        result = run_and_kill(command, kill, watch=watch, cwd=cwd, env=env, timeout=timeout)
        results.append(result)
        if not result.killed:
            assert result.returncode == 0, f"run ended with {result.returncode} before its kill: {result.stderr[-2000:]}"
            break
        assert result.returncode == -signal.SIGKILL, result
        finished = assert_nothing_looks_finished(watch, markers=markers, resume_files=resume_files,
                                                 reference=reference, rtol=rtol, atol=atol)
        if markers and len(finished) == len(markers):
            result.killed = False  # killed after its work was done: nothing left to interrupt
            break
    run_to_completion(command, cwd=cwd, env=env, timeout=timeout)
    return results
