"""The CPU a measurement ran on, as the benchmarks record it: its model name and the
matrix units that decide its precision paths (AVX2, AVX-512, bf16, AMX)."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo); empty where it cannot be read."""
    from pathtwt.models.precision import _cpu_flags

    return _cpu_flags()


def cpu_units() -> dict[str, object]:
    """The model name and whether the CPU has AVX2, AVX-512F, AVX-512 bf16 and AMX."""
    flags = cpu_flags()
    return {"model": cpu_model(), "avx2": "avx2" in flags, "avx512f": "avx512f" in flags,
            "avx512_bf16": "avx512_bf16" in flags, "amx": "amx_tile" in flags}
