"""One rule for ``--device auto|cpu|cuda|cuda:N`` in every command, and the settings a
GPU run needs before its first kernel (MIOpen's caches on ROCm)."""

from __future__ import annotations

import os
import re
import tempfile

from pathtwt.errors import ConfigError

# The names every command accepts; torch.cuda is also the ROCm/HIP device.
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
DEVICE_HELP = "auto (a CUDA or ROCm GPU when one is visible, else cpu), cpu, cuda or cuda:N"
# MIOpen (ROCm's kernel library) keeps its tuning database and compiled kernels under
# $HOME by default: on a cluster that is a shared network file system, which many jobs
# then write at once (slow, and SQLite locking fails on Lustre). Node-local storage
# avoids both; the variables are left alone when the user has set them.
MIOPEN_VARIABLES = ("MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR")


def check_device_name(name: str) -> str:
    """``name`` when it is one of the accepted device names, else a ConfigError."""
    if not DEVICE_PATTERN.fullmatch(str(name)):
        raise ConfigError(f"--device {name}: expected {DEVICE_HELP}")
    return str(name)


def resolve_device(name: object = "auto") -> str:
    """A device name (or torch.device) as a string. ``auto`` -> CUDA (ROCm builds included)
    when visible, else CPU; ``cuda`` without a visible device is a one-line error rather
    than a failure deep inside torch."""
    import torch

    name = str(name)
    check_device_name(name)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    elif name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: no CUDA device is visible; use --device cpu or auto")
    elif name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        raise ConfigError(
            f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) are visible (cuda:0 ...)"
        )
    if name.startswith("cuda") and getattr(torch.version, "hip", None):
        use_node_local_miopen_cache()
    return name


def available_cores() -> int:
    """Cores this process may use: SLURM's allocation (SLURM_CPUS_PER_TASK) when set, else
    the CPU affinity mask, not the node's total that os.cpu_count() reports."""
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        return int(slurm)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # platforms without affinity masks
        return os.cpu_count() or 1


def node_local_dir() -> str:
    """Node-local scratch: SLURM's per-job $TMPDIR when set, else the system temp dir
    (/tmp, which is node-local RAM disk on LUMI's compute nodes)."""
    return os.environ.get("TMPDIR") or tempfile.gettempdir()


def use_node_local_miopen_cache() -> dict[str, str]:
    """Point MIOpen's user database and kernel cache at node-local storage unless the
    user has set them; returns the variables it set."""
    folder = os.path.join(node_local_dir(), f"miopen-{os.getuid()}")
    chosen = {}
    for var in MIOPEN_VARIABLES:
        if not os.environ.get(var):
            os.makedirs(folder, exist_ok=True)
            os.environ[var] = chosen[var] = folder
    return chosen
