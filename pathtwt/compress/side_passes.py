"""The forward passes around distillation's steps: the bf16 first-step check, the loss
normalisation, the teacher-target cache, fidelity, auditioning and the linear maps' fit.

Each runs at most a rank's micro-batch of tiles per pass (:func:`rank_batch`): the tiles a
training step of that rank already holds with their gradients, so a GPU that fits the
training fits these too (``--batch-size`` is global, split over the ranks; before, each
pass ran the whole global batch on every GPU). When one still runs out of memory, the
error names the pass, its tiles per pass and the setting that sizes or skips it
(:func:`named_out_of_memory`), instead of torch's allocator report.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from pathtwt.errors import PathtwtError
from pathtwt.out_of_memory import ADVICE, failed_allocation, is_out_of_memory

# what lowers every side pass's memory: its tiles per pass are a rank's share of --batch-size
BATCH_ADVICE = ADVICE["compress"]


def rank_batch(batch_size: int) -> int:
    """Tiles per forward pass of a side pass: this rank's share of the global micro-batch."""
    from pathtwt.compress import ranks

    return max(1, int(batch_size) // ranks.world_size())


class DeviceMemoryError(PathtwtError):
    """A side pass ran out of device memory."""


@contextlib.contextmanager
def named_out_of_memory(name: str, tiles: int, skip: str = "",
                        sized_by: str = "this rank's share of --batch-size") -> Iterator[None]:
    """Within the block, a GPU out-of-memory error becomes one line naming the pass
    ``name``, its ``tiles`` per forward pass, what sets that number (``sized_by``) and what
    to change (``skip``: a setting that leaves the pass out, where there is one)."""
    try:
        yield
    except Exception as exc:
        if not is_out_of_memory(exc):  # CUDA and ROCm ("HIP out of memory") alike, re-raised ones too
            raise
        raise DeviceMemoryError(f"{name} ran out of GPU memory at {tiles} tiles a forward pass, {sized_by} "
                                f"({failed_allocation(exc, 160)}); {BATCH_ADVICE}{', or ' + skip if skip else ''}") from None
