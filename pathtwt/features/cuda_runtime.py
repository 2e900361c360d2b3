"""The CUDA runtime library torch calls (``libcudart``), for what ``torch.cuda.cudart()``
has no binding for: clearing its last error, and keeping a device's stream-ordered memory
pool's memory across batches.

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


def keep_pool_memory(device_index: int, runtime: object = None) -> int:
    """Make ``device_index``'s default stream-ordered memory pool (the one ``cudaMallocAsync``
    takes from: nvImageCodec's decoder allocates there) keep what it has freed. Its release
    threshold is 0 by default, so at every synchronisation (the loop waits for each batch's
    outputs) it would give its memory back and map it again for the next batch. Returns the
    runtime's status (0: done); a failure is cleared and costs only speed. ``runtime``: a
    stand-in for the tests."""
    if runtime is None:
        path = loaded_runtime()
        if path is None:
            return -1
        runtime = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
    pool = ctypes.c_void_p()
    status = int(runtime.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), int(device_index)))
    if status == 0:
        status = int(runtime.cudaMemPoolSetAttribute(pool, RELEASE_THRESHOLD, ctypes.byref(KEEP_ALL)))
    if status != 0:
        runtime.cudaGetLastError()  # the failed call's error would otherwise fail the next launch
    return status
