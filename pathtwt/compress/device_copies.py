"""Host data onto the training device without the host waiting for the device.

A copy from pageable host memory to a GPU (``tensor.to("cuda")``) waits for the device to
finish everything queued before it: one such copy per micro-batch turns the loop's
asynchronous kernel queue into a lockstep. Here host data crosses through pinned memory
with a non-blocking copy instead. The pinned blocks come from torch's caching host
allocator, which records the copy on the stream and does not hand a block out again
before that copy has completed, so neither the copy nor the reuse waits. Elsewhere (CPU
training) the host is the device and nothing is copied.
"""

from __future__ import annotations

import torch


def is_gpu(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"  # ROCm builds name their GPUs cuda too


def to_device(tensor: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """``tensor`` (host memory) on ``device``, copied without waiting (see the module doc)."""
    if is_gpu(device) and tensor.device.type == "cpu" and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def gather_to_device(host: torch.Tensor, idx: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """Rows ``idx`` (a host index tensor) of the host tensor ``host`` on ``device``: gathered
    straight into a pinned staging block, then one non-blocking copy."""
    staging = torch.empty((len(idx), *host.shape[1:]), dtype=host.dtype, pin_memory=is_gpu(device))
    torch.index_select(host, 0, idx, out=staging)
    return staging.to(device, non_blocking=True)
