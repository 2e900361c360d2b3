"""Where distillation's teacher targets come from, and how they are computed: in
inference mode, in the run's precision, as float32 tensors the loss may keep.

The source is decided once per run, before the bf16 check (:func:`target_source`): the
teacher's shared fp32 layer outputs (:mod:`pathtwt.compress.teacher_cache`), a cache of
every in-memory tile's targets computed once in a fixed order (:class:`TargetCache`), or
a teacher pass per step (augmentation, streamed tiles, or targets above the cache limit).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from pathtwt.compress.device_copies import gather_to_device, is_gpu, to_device
from pathtwt.compress.intermediates import tiles_to_batch
from pathtwt.compress.side_passes import named_out_of_memory
from pathtwt.models.bf16_guard import autocast

if TYPE_CHECKING:
    from pathtwt.compress.distill_options import DistillOptions, Objective, Transform

log = logging.getLogger(__name__)


def teacher_targets(objective: Any, teacher: nn.Module, x: torch.Tensor, precision: str) -> list[torch.Tensor]:
    """The teacher's targets (``objective.targets``) in ``precision`` under inference mode
    (no autograd bookkeeping at all), returned as ordinary float32 tensors so the loss may
    save them for its backward pass."""
    with torch.inference_mode(), autocast(str(x.device), precision):
        targets = objective.targets(teacher, x)
    return [t.to(torch.float32, copy=True) for t in targets]


# what a GPU keeps free beside the target cache: the larger of these (the cache is placed
# after the loop's first step, while the allocator still holds that step's peak)
DEVICE_MARGIN_BYTES = 2**30
DEVICE_MARGIN_SHARE = 0.10


def device_budget(device: str) -> int | None:
    """Bytes of target cache ``device`` takes: its free memory less the margin on a GPU;
    None where the device's memory is the host's (every target tensor is used in place)."""
    if not is_gpu(device):
        return None
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return int(free) - max(DEVICE_MARGIN_BYTES, int(DEVICE_MARGIN_SHARE * total))


class TargetCache:
    """Teacher targets of every in-memory tile, computed once in a fixed order (so the
    values depend neither on when a run was resumed nor on which rank of a node computed
    them; a run resumed with another number of ranks computes them in other chunks, the
    same to float rounding).

    Built in host memory, one copy per node (:mod:`pathtwt.compress.node_shared`), each rank
    of a node computing its share of the chunks at a rank's micro-batch
    (:mod:`pathtwt.compress.side_passes`). After the loop's first step, :meth:`settle` moves
    to the training device every target tensor that fits there (:func:`device_budget`); the
    others stay in host memory. A micro-batch's targets are then an index on the device, or
    a gather into pinned memory and one copy that does not wait
    (:func:`pathtwt.compress.device_copies.gather_to_device`): never a copy the host waits for."""

    def __init__(self, tensors: Sequence[torch.Tensor], sharers: int = 1) -> None:
        self.tensors = list(tensors)
        self.on_device = [False] * len(self.tensors)
        self.sharers = sharers  # ranks that computed and share the host copy

    @classmethod
    def build(cls, teacher: nn.Module, tiles: np.ndarray, *, transform: Transform, objective: Objective, device: str,
              chunk: int, precision: str) -> "TargetCache":
        def compute(i: int, j: int) -> list[torch.Tensor]:
            return teacher_targets(objective, teacher, tiles_to_batch(transform, tiles[i:j], device), precision)

        return cls._computed(compute, len(tiles), chunk)

    @classmethod
    def from_outputs(cls, teacher: nn.Module, outputs: Sequence[torch.Tensor], *, objective: Objective,
                     n_tiles: int, device: str, chunk: int) -> "TargetCache":
        """The targets of the first ``n_tiles`` tiles from the teacher's layer outputs of
        them, already computed (in fp32) for auditioning: no forward pass."""
        def compute(i: int, j: int) -> list[torch.Tensor]:
            with torch.inference_mode():
                outs = [o[i:j].to(device) for o in outputs]
                return [t.to(torch.float32, copy=True) for t in objective.targets_from_outputs(teacher, outs)]

        return cls._computed(compute, n_tiles, chunk)

    @classmethod
    def _computed(cls, compute: Callable[[int, int], list[torch.Tensor]], n: int, chunk: int) -> "TargetCache":
        """The cache of ``compute(i, j)`` (the targets of tiles i..j-1) over ``n`` tiles."""
        from pathtwt.compress.node_shared import node_tensors

        with named_out_of_memory("the teacher-target cache", chunk):
            host = node_tensors([(n, *t.shape[1:]) for t in compute(0, 1)])
            for c, i in enumerate(range(0, n, chunk)):
                if host.mine(c):
                    for dst, src in zip(host.tensors, compute(i, min(n, i + chunk))):
                        dst[i : i + len(src)].copy_(src)
        host.filled()
        return cls(host.tensors, sharers=host.sharers)

    def settle(self, device: str) -> None:
        """Move to ``device`` the host target tensors that fit there (see the class doc)."""
        budget = device_budget(device)
        for j, t in enumerate(self.tensors):
            nbytes = t.numel() * t.element_size()
            if self.on_device[j] or (budget is not None and nbytes > budget):
                continue
            self.tensors[j], self.on_device[j] = t.to(device), True
            budget = None if budget is None else budget - nbytes
        placed = self.describe()
        log.info("teacher targets: %.3g GiB on %s, %.3g GiB in host memory (shared by %d rank(s))",
                 placed["device_bytes"] / 2**30, device, placed["host_bytes"] / 2**30, self.sharers)

    def get(self, idx: torch.Tensor, device: str) -> list[torch.Tensor]:
        """The targets of the tiles ``idx`` (a host index tensor) on ``device``."""
        on_device = to_device(idx, device) if any(self.on_device) else None
        return [t.index_select(0, on_device) if here else gather_to_device(t, idx, device)
                for t, here in zip(self.tensors, self.on_device)]

    def describe(self) -> dict[str, int]:
        sizes = [t.numel() * t.element_size() for t in self.tensors]
        return {"device_bytes": sum(n for n, here in zip(sizes, self.on_device) if here),
                "host_bytes": sum(n for n, here in zip(sizes, self.on_device) if not here), "sharers": self.sharers}


def estimate_target_bytes(teacher: nn.Module, tiles: np.ndarray, transform: Transform, objective: Objective, device: str) -> int:
    probe = teacher_targets(objective, teacher, tiles_to_batch(transform, tiles[:1], device), "fp32")
    return sum(t.numel() * 4 for t in probe) * len(tiles)


TARGET_SOURCES = ("shared outputs", "target cache", "teacher pass per step")


def target_source(teacher: nn.Module, tiles: Any, transform: Transform, objective: Objective, options: DistillOptions,
                   teacher_outputs: Sequence[torch.Tensor] | None) -> str:
    """Where the loop's teacher targets come from, decided once before the bf16 check: the
    teacher's shared fp32 outputs (in-memory tiles without augmentation that they cover), a
    cache of every in-memory tile's targets computed once (without augmentation), or a
    teacher pass per step (augmentation, streamed tiles, or targets above the cache limit)."""
    if not isinstance(tiles, np.ndarray) or options.augment:
        return TARGET_SOURCES[2]
    if estimate_target_bytes(teacher, tiles, transform, objective, options.device) > options.cache_limit_bytes:
        return TARGET_SOURCES[2]
    if teacher_outputs is not None and len(teacher_outputs[0]) >= len(tiles) and hasattr(objective, "targets_from_outputs"):
        return TARGET_SOURCES[0]
    return TARGET_SOURCES[1]
