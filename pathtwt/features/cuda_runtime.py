"""The CUDA runtime library torch calls (``libcudart``), for what ``torch.cuda.cudart()``
has no binding for: clearing its last error.

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
