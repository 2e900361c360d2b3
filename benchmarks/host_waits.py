"""How often a distillation step makes the host wait for the device, counted on a GPU and
on the CPU alike (``benchmarks/distill_check.py``, ``benchmarks/compress_phases.py`` and
the tests use it).

On a CUDA device (:class:`CudaSyncs`): torch's own sync debug mode
(``torch.cuda.set_sync_debug_mode("warn")``) warns at every operation that makes the host
wait for the GPU (a blocking copy either way, ``.item()``, a value-dependent shape, a
stream synchronisation); each warning is one wait.

On the CPU (:class:`DeviceStandIn`): ``"cpu:0"`` plays the device and ``"cpu"`` the host
(torch accepts both, computes both on the CPU, and copies a tensor moved from one to the
other). A tensor is on the stand-in device when it was made by a move there
(``.to("cpu:0")``, ``torch.tensor(..., device="cpu:0")``, a factory given that device, a
module moved there) or computed from such tensors; every other tensor is host memory, and
on the stand-in device ``Tensor.device`` reads ``cpu:0``, so ``x.to(y.device)`` moves data
as on a GPU. What is counted, as CUDA would pay it:

* host-to-device copies: blocking unless asked ``non_blocking`` (a blocking copy on CUDA
  waits for the device; a non-blocking one from pinned memory does not, and one from
  pageable memory stages it on the host without waiting for the device);
* device-to-host reads, each a wait for the device: ``aten._local_scalar_dense``
  (``.item()``, ``float()``, ``int()``, ``bool()``), ``.tolist()``, ``.numpy()``,
  ``.cpu()`` and a ``copy_`` into host memory;
* device ops whose output shape depends on values (``nonzero``, ``masked_select``, ...),
  which CUDA answers by a copy of the count to the host;
* explicit synchronisations (``torch.cuda.synchronize``, ``Stream``/``Event.synchronize``).

What the stand-in cannot see: a move to the host written ``.to("cpu")`` of a stand-in
tensor (torch's own code moves tensors with their real device, which reads ``cpu`` on the
stand-in too: autograd's backward of a cast, the optimiser's scalars), and whether a host
tensor is pinned (nothing can be pinned without CUDA). Ops that mix a
stand-in tensor with a host tensor of more than one element, which CUDA refuses, are
recorded as ``mixed``.

:class:`StepMarks` notes where each optimiser step ends (torch's global step hook), so
that :func:`per_step` counts the waits of whole steps only, not the run's set-up.
"""

from __future__ import annotations

import contextlib
import time
import traceback
import warnings
import weakref
from collections import Counter
from typing import Any, Callable, Iterator, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

T = TypeVar("T")
DEVICE = "cpu:0"
_DEVICE = torch.device(DEVICE)
aten = torch.ops.aten
# ops whose output size CUDA learns by copying a count to the host
_DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default, aten.unique_dim.default,
                   aten.unique_consecutive.default, aten.repeat_interleave.Tensor, aten.nonzero_numpy.default}


# the kinds of event that make the host wait (the others are recorded for the reader)
WAITS = ("blocking_h2d", "d2h", "data_dependent", "explicit", "sync")


class Traffic:
    """Events in the order they happened: (kind, the pathtwt line that asked for it)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def of(self, kind: str, start: int = 0, end: int | None = None) -> list[str]:
        return [where for k, where in self.events[start:end] if k == kind]

    def waits(self, start: int = 0, end: int | None = None) -> int:
        return sum(1 for kind, _ in self.events[start:end] if kind in WAITS)

    def summary(self, start: int = 0, end: int | None = None) -> dict[str, dict[str, int]]:
        """{kind: {where: count}} of the events start..end."""
        out: dict[str, Counter] = {}
        for kind, where in self.events[start:end]:
            out.setdefault(kind, Counter())[where] += 1
        return {kind: dict(c) for kind, c in out.items()}


def _caller() -> str:
    """The innermost pathtwt frame that led here (where a transfer was asked for)."""
    for frame in reversed(traceback.extract_stack(limit=40)[:-2]):
        if "/pathtwt/" in frame.filename:
            return f"{frame.filename.rsplit('/pathtwt/', 1)[1]}:{frame.lineno}"
    return "torch"


class DeviceStandIn(TorchDispatchMode):
    """Within the block, ``cpu:0`` is a device whose traffic with the host is counted into
    ``traffic``; see the module doc."""

    def __init__(self) -> None:
        super().__init__()
        self.traffic = Traffic()
        self._on_device: dict[int, weakref.ref] = {}  # id -> the tensor (tensors compare by value, not identity)
        self._patches = contextlib.ExitStack()
        self._quiet = 0

    # ---- residency -------------------------------------------------------------------
    def on_device(self, t: Any) -> bool:
        ref = self._on_device.get(id(t)) if isinstance(t, torch.Tensor) else None
        return ref is not None and ref() is t

    def mark(self, tensors: Any) -> None:
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self._on_device[id(t)] = weakref.ref(t, lambda _, key=id(t): self._forget(key))

    def _forget(self, key: int) -> None:
        ref = self._on_device.get(key)
        if ref is not None and ref() is None:
            del self._on_device[key]

    @contextlib.contextmanager
    def _unrecorded(self) -> Iterator[None]:
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    # ---- aten level ------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._quiet:
            return out
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on = [self.on_device(t) for t in tensors]
        target = kwargs.get("device")
        target = None if target is None else torch.device(target)
        if func is aten._to_copy.default and target is not None:
            if target == _DEVICE and not on[0]:
                self._record("async_h2d" if kwargs.get("non_blocking") else "blocking_h2d")
            # a copy to "cpu" stays where its input is: autograd's cast backward passes the
            # input's real device, which is "cpu" on the stand-in too (see the module doc)
            target = _DEVICE if on[0] else target
        elif func is aten.copy_.default:
            dst, src = args[0], args[1]
            non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
            if on[0] and not on[1] and src.numel() > 1:
                self._record("async_h2d" if non_blocking else "blocking_h2d")
            elif on[1] and not on[0]:
                self._record("d2h")
            return out  # in place: the destination stays where it is
        elif func is aten._local_scalar_dense.default:
            if on[0]:
                self._record("d2h")
            return out
        elif any(on):
            if func in _DATA_DEPENDENT:
                self._record("data_dependent")
            if any(not o and t.numel() > 1 for o, t in zip(on, tensors)):
                self._record("mixed", str(func))
        if (target == _DEVICE) if target is not None else any(on):
            self.mark(out)
        return out

    def _record(self, kind: str, what: str = "") -> None:
        self.traffic.events.append((kind, f"{_caller()}{' ' + what if what else ''}"))

    # ---- Python level ----------------------------------------------------------------
    def __enter__(self):
        standin = self
        patches = self._patches
        device_prop = torch.Tensor.device

        def device(t):
            return _DEVICE if standin.on_device(t) else device_prop.__get__(t)

        patches.callback(delattr, torch.Tensor, "device")  # TensorBase's again
        torch.Tensor.device = property(device)

        def reading(name: str, copy: bool):
            original = getattr(torch.Tensor, name)

            def read(t, *args, **kwargs):
                if standin.on_device(t):
                    standin._record("d2h", name)
                    if copy:
                        with standin._unrecorded():
                            return t.clone()
                return original(t, *args, **kwargs)

            patches.callback(setattr, torch.Tensor, name, original)
            setattr(torch.Tensor, name, read)

        for name, copy in (("tolist", False), ("numpy", False), ("cpu", True)):
            reading(name, copy)

        def making(name: str):
            original = getattr(torch, name)

            def make(data, *args, device=None, **kwargs):
                t = original(data, *args, **kwargs)
                return t.to(device) if device is not None and torch.device(device) == _DEVICE else (
                    t if device is None else t.to(device))

            patches.callback(setattr, torch, name, original)
            setattr(torch, name, make)

        for name in ("tensor", "as_tensor"):
            making(name)

        module_to = torch.nn.Module.to

        def to(module, *args, **kwargs):
            out = module_to(module, *args, **kwargs)
            if torch._C._nn._parse_to(*args, **kwargs)[0] == _DEVICE:
                standin.mark([*module.parameters(), *module.buffers()])
            return out

        patches.callback(setattr, torch.nn.Module, "to", module_to)
        torch.nn.Module.to = to

        def synchronize(*args, **kwargs):
            standin._record("explicit")

        for owner in (torch.cuda, torch.cuda.Stream, torch.cuda.Event):
            patches.callback(setattr, owner, "synchronize", owner.synchronize)
            owner.synchronize = synchronize
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._patches.close()


class CudaSyncs:
    """Within the block, every operation that makes the host wait for a CUDA GPU, as torch's
    sync debug mode reports it, is recorded into ``traffic`` (kind ``sync``)."""

    MESSAGE = "called a synchronizing CUDA operation"

    def __init__(self) -> None:
        self.traffic = Traffic()
        self._catch = warnings.catch_warnings()
        self._mode = 0

    def __enter__(self) -> "CudaSyncs":
        self._catch.__enter__()
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if self.MESSAGE in str(message):
                self.traffic.events.append(("sync", _caller()))
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        self._mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.set_sync_debug_mode(self._mode)
        self._catch.__exit__(*exc)


def counter(device: str) -> "CudaSyncs | DeviceStandIn":
    """The counter for a run on ``device``: torch's sync debug mode on a CUDA GPU, else the
    stand-in (the run must then train on :data:`DEVICE`)."""
    return CudaSyncs() if torch.device(device).type == "cuda" else DeviceStandIn()


class StepMarks:
    """Within the block, the end of every optimiser step: (events recorded so far, time)."""

    def __init__(self, traffic: Traffic) -> None:
        self.traffic = traffic
        self.marks: list[tuple[int, float]] = []
        self._handle = None

    def __enter__(self) -> "StepMarks":
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(self._mark)
        return self

    def _mark(self, optimizer, args, kwargs) -> None:
        self.marks.append((len(self.traffic.events), time.perf_counter()))

    def __exit__(self, *exc) -> None:
        self._handle.remove()


def per_step(traffic: Traffic, marks: list[tuple[int, float]]) -> dict[str, Any]:
    """The waits per step over the steps from the second mark to the last (the first step
    carries the run's once-only work: the target cache's placement), and where they were
    asked for; None with fewer than three steps."""
    if len(marks) < 3:
        return {"host_waits_per_step": None, "steps_counted": 0, "where": {}}
    start, end, steps = marks[1][0], marks[-1][0], len(marks) - 2
    where = {kind: {w: n / steps for w, n in places.items()}
             for kind, places in traffic.summary(start, end).items()}
    return {"host_waits_per_step": traffic.waits(start, end) / steps, "steps_counted": steps, "where": where}


def counted_run(device: str, run: Callable[[], T]) -> tuple[T, dict[str, Any], list[tuple[int, float]]]:
    """``run()``, a distillation on ``device`` (on the CPU: on :data:`DEVICE`), with its host
    waits counted (:func:`counter`): its result, the waits per step (:func:`per_step`, and
    ``counted_on``: what counted them) and the ends of its steps (:class:`StepMarks`)."""
    with counter(device) as waits, StepMarks(waits.traffic) as steps:
        result = run()
    on = "torch.cuda sync debug mode" if torch.device(device).type == "cuda" else f"the CPU stand-in device {DEVICE}"
    return result, {**per_step(waits.traffic, steps.marks), "counted_on": on}, steps.marks
