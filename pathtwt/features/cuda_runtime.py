"""The CUDA runtime library torch calls (``libcudart``), for what ``torch.cuda.cudart()``
has no binding for: clearing its last error, and keeping a device's stream-ordered memory
pool's memory across batches (and giving it back after the GPU ran out of memory).

A runtime call that fails (``cudaHostRegister`` of the tile ring, say) leaves its error
as the runtime's last error for the calling thread; the next kernel launch that checks
it (torch checks after each) then fails with that old error as if it were its own. torch
binds ``cudaHostRegister``, ``cudaHostUnregister`` and ``cudaGetErrorString`` but not
``cudaGetLastError``, the call that reads and clears it, so it is called here through the
very library torch loaded: found among the process's mapped files and opened with
``RTLD_NOLOAD``, which never loads a second copy (whose error state would be its own).
Copies that other packages vendor (torchvision's, named ``libcudart.<hash>.so.13``) are
not torch's and are passed over.
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path
from typing import Callable

from pathtwt.errors import PathtwtError

MAPS = Path("/proc/self/maps")
# cudaMemPoolAttr's cudaMemPoolAttrReleaseThreshold (driver_types.h): the bytes a pool keeps
# at a synchronisation before it gives memory back to the system
RELEASE_THRESHOLD = 4
KEEP_ALL = ctypes.c_uint64(2**64 - 1)
# a CUDA wheel's or toolkit's runtime: libcudart.so.13, libcudart.so.12.4.127
TORCH_RUNTIME = re.compile(r"libcudart\.so\.\d+(\.\d+)*")


def loaded_runtime() -> str | None:
    """The path of the CUDA runtime mapped into this process under its own name, or None
    (not loaded as a library: linked statically into torch, or not Linux)."""
    try:
        lines = MAPS.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        path = line.split(maxsplit=5)[5].strip() if len(line.split(maxsplit=5)) == 6 else ""
        if TORCH_RUNTIME.fullmatch(os.path.basename(path)):
            return path
    return None


def clear_last_error(context: str) -> int:
    """Read and clear the runtime's last error in this thread; its code. ``context`` (what
    failed) starts the one line raised when the runtime torch uses cannot be reached, so
    the job stops instead of failing later with a misleading message."""
    path = loaded_runtime()
    if path is None:
        raise PathtwtError(f"{context}; the CUDA runtime torch uses is not a loaded library here, so the error it "
                           "left cannot be cleared and would fail the next GPU call: stopping. Check the locked-memory "
                           "limit (ulimit -l) and /dev/shm, or run with --decode cpu --workers 0")
    runtime = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
    return int(runtime.cudaGetLastError())


def _runtime(runtime: object) -> object | None:
    """``runtime`` (a stand-in, for the tests), else the runtime torch loaded (None: not a
    loaded library here)."""
    if runtime is not None:
        return runtime
    path = loaded_runtime()
    return None if path is None else ctypes.CDLL(path, mode=os.RTLD_NOLOAD)


def _on_default_pool(device_index: int, runtime: object, call: Callable[[object, ctypes.c_void_p], int]) -> int:
    """``call(runtime, pool)`` on ``device_index``'s default stream-ordered memory pool (the
    one ``cudaMallocAsync`` takes from: nvImageCodec's decoder allocates there); the
    runtime's status (0: done; -1: no runtime here). A failure is cleared: it costs only
    memory or speed, and would otherwise fail the next kernel launch."""
    runtime = _runtime(runtime)
    if runtime is None:
        return -1
    pool = ctypes.c_void_p()
    status = int(runtime.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), int(device_index)))
    if status == 0:
        status = int(call(runtime, pool))
    if status != 0:
        runtime.cudaGetLastError()
    return status


def keep_pool_memory(device_index: int, runtime: object = None) -> int:
    """Make ``device_index``'s default memory pool keep what it has freed. Its release
    threshold is 0 by default, so at every synchronisation (the loop waits for each batch's
    outputs) it would give its memory back and map it again for the next batch. What it
    keeps is given back by :func:`trim_pool` when the GPU runs out of memory."""
    return _on_default_pool(device_index, runtime, lambda rt, pool: rt.cudaMemPoolSetAttribute(
        pool, RELEASE_THRESHOLD, ctypes.byref(KEEP_ALL)))


def trim_pool(device_index: int, runtime: object = None) -> int:
    """Give back to the device what ``device_index``'s default memory pool holds unused
    (``cudaMemPoolTrimTo(pool, 0)``): after an out-of-memory error, so the forward pass and
    torch's allocator can have what the decoder's freed Images held. Memory freed on a
    stream the host has not yet seen reach that point counts as in use: the caller
    synchronises first."""
    return _on_default_pool(device_index, runtime, lambda rt, pool: rt.cudaMemPoolTrimTo(pool, ctypes.c_size_t(0)))
