"""A fixed ring of shared-memory slots between the reading processes and the embedding
process (torch-free).

One anonymous shared mapping, made before the reading processes fork, so they inherit it:
a slot holds one batch (finished uint8 tiles, or the compressed streams of the native tiles
under it) and only its number travels through the queues, never its bytes. The mapping is
not a file in /dev/shm (a container's small /dev/shm does not limit it); it counts against
the job's memory, so its size is stated in the job's log line (:meth:`Ring.describe`) and a
mapping the system refuses is one line saying what to lower.

On a CUDA device the embedding process pins the whole mapping once
(:func:`pathtwt.features.device_tiles.pin_host_memory`), so a slot's tiles cross to the GPU
by DMA without a staging copy.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np

from pathtwt.errors import PathtwtError

MiB = 2**20


@dataclass(frozen=True)
class RingSize:
    """How many slots of how many bytes: two per reading process (one being filled, one
    queued) and two in the embedding process (one decoding or copying, one embedding)."""

    slots: int
    slot_bytes: int

    @classmethod
    def for_job(cls, workers: int, batch_size: int, tile_bytes: int, stream_bytes: int = 0) -> "RingSize":
        """Slots for ``workers`` readers of batches of ``batch_size`` tiles of ``tile_bytes``
        each (finished uint8 tiles), or of streams of up to ``stream_bytes`` a batch
        (compressed native tiles), whichever is larger."""
        slot = max(int(batch_size) * int(tile_bytes), int(stream_bytes), 1)
        slot = -(-slot // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages, so every slot is aligned
        return cls(slots=2 * max(int(workers), 1) + 2, slot_bytes=slot)

    @property
    def total(self) -> int:
        return self.slots * self.slot_bytes


class Ring:
    """The mapping and a view of each slot."""

    def __init__(self, size: RingSize) -> None:
        self.size = size
        try:
            self.memory = mmap.mmap(-1, size.total, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        except (OSError, ValueError) as exc:
            raise PathtwtError(
                f"extract: cannot map {self.describe()} of shared memory for the tile ring ({exc}); lower "
                "--batch-size or --workers, or give the job more memory") from None
        self.view = memoryview(self.memory)

    def describe(self) -> str:
        return f"{self.size.slots} slots x {self.size.slot_bytes / MiB:.1f} MiB = {self.size.total / MiB:.0f} MiB"

    def slot(self, k: int) -> memoryview:
        """Slot ``k``'s bytes (writable)."""
        start = int(k) * self.size.slot_bytes
        return self.view[start:start + self.size.slot_bytes]

    def tiles(self, k: int, n: int, size: int) -> np.ndarray:
        """Slot ``k`` as uint8 tiles (n, size, size, 3)."""
        return np.frombuffer(self.memory, np.uint8, count=n * size * size * 3,
                             offset=int(k) * self.size.slot_bytes).reshape(n, size, size, 3)

    def close(self) -> None:
        try:
            self.view.release()
            self.memory.close()
        except BufferError:  # a tensor still views a slot: the mapping goes with the last of them
            pass
