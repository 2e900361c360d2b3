"""One rule for ``--device auto|cpu|cuda|cuda:N`` in every command, and the settings a
GPU run needs before its first kernel (MIOpen's caches on ROCm)."""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from typing import Any

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


def resolve_device(name: object = "auto", claim: bool = True) -> str:
    """A device name (or torch.device) as a string. ``auto`` -> CUDA (ROCm builds included)
    when visible, else CPU; ``cuda`` without a visible device is a one-line error rather
    than a failure deep inside torch, and so is ``auto`` on a node that was given a GPU
    torch cannot use (:func:`check_no_unusable_gpu`).

    With several GPUs visible and not narrowed by the launcher (CUDA_VISIBLE_DEVICES,
    SLURM, torchrun ranks), ``auto``/``cuda`` take a free one (:func:`process_claim`): jobs
    started side by side on one machine each get their own GPU, ``cuda:K``. The claim is
    the process's own and is kept until it ends; later calls return the same device."""
    import torch

    name = str(name)
    check_device_name(name)
    if name == "auto":
        if not torch.cuda.is_available():
            check_no_unusable_gpu("--device auto")
            return "cpu"
        name = "cuda"
    if name.startswith("cuda") and not torch.cuda.is_available():
        check_no_unusable_gpu(f"--device {name}")
        raise ConfigError(f"--device {name}: no CUDA device is visible; use --device cpu or auto")
    count = torch.cuda.device_count()
    if name.startswith("cuda:") and int(name[5:]) >= count:
        raise ConfigError(f"--device {name}: only {count} CUDA device(s) are visible (cuda:0 ... cuda:{count - 1}); "
                          "give one of those or --device cuda (a free one)")
    if name.startswith("cuda"):
        check_ranks_fit(count)
        if getattr(torch.version, "hip", None):
            use_node_local_miopen_cache()
    if name == "cuda" and claim and claims_apply(count):
        name = f"cuda:{process_claim(count).index}"
    return name


# --- one GPU per job on a machine with several (local runs) ---------------------------

# Set to 0 to share the GPUs without claims (every `cuda` job then runs on cuda:0).
CLAIM_VARIABLE = "PATHTWT_GPU_CLAIMS"
# Where the claims live: one lock file per GPU index, node-local (locks on a network
# file system are unreliable); PATHTWT_GPU_LOCK_DIR overrides it.
LOCK_DIR_VARIABLE = "PATHTWT_GPU_LOCK_DIR"
# A torchrun rank: its launcher placed it (LOCAL_RANK), nothing is left to claim.
RANK_VARIABLES = ("LOCAL_RANK",)
# Variables naming the GPUs a process sees, by the ids the machine knows them by.
VISIBLE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def claims_apply(count: int) -> bool:
    """Whether a ``cuda`` job claims a GPU: several visible, not a torchrun rank, claims
    not turned off. Also under CUDA_VISIBLE_DEVICES or SLURM: a job given four GPUs that
    runs four extractions at once (a grouped SLURM job) needs them as much as a workstation."""
    if count < 2 or os.environ.get(CLAIM_VARIABLE, "1").strip() in ("0", "off", "false", "no"):
        return False
    return not any(os.environ.get(var, "").strip() for var in RANK_VARIABLES)


def gpu_lock_dir() -> str:
    """Node-local; per SLURM job, since SLURM numbers each allocation's GPUs from 0."""
    if os.environ.get(LOCK_DIR_VARIABLE):
        return os.environ[LOCK_DIR_VARIABLE]
    job = os.environ.get("SLURM_JOB_ID", "").strip()
    return os.path.join(tempfile.gettempdir(), "pathtwt-gpu-claims" + (f"-slurm{job}" if job else ""))


def gpu_id(index: int) -> str:
    """The machine's name of visible GPU ``index``: its CUDA_VISIBLE_DEVICES entry (an
    index or a UUID) when set, so processes shown different subsets claim the same GPU by
    the same lock."""
    for var in VISIBLE_VARIABLES:
        entries = [e.strip() for e in os.environ.get(var, "").split(",") if e.strip()]
        if index < len(entries):
            return re.sub(r"[^A-Za-z0-9_.-]", "_", entries[index])
    return str(index)


class GpuClaim:
    """An exclusive lock on GPU ``index`` (flock on ``{lock_dir}/gpu{index}.lock``), held
    while the file stays open: the kernel releases it when the process ends, however it
    ends, so a killed job leaves no stale claim."""

    def __init__(self, index: int, handle: Any, path: str):
        self.index, self.handle, self.path = index, handle, path

    def release(self) -> None:
        if not self.handle.closed:
            self.handle.close()


def _try_lock(path: str) -> Any:
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot open the GPU claim ({exc.strerror}); set {LOCK_DIR_VARIABLE} "
                          "to a node-local folder of yours, or PATHTWT_GPU_CLAIMS=0") from None
    try:
        os.fchmod(fd, 0o666)  # every user of a shared workstation claims through the same file
    except OSError:
        pass  # another user's file, already shared
    handle = os.fdopen(fd, "r+")  # kept open for as long as the claim holds
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def claim_gpus(n: int, count: int, lock_dir: str | None = None, wait_s: float | None = None,
               poll_s: float = 2.0, log: Any = None) -> list[GpuClaim]:
    """Claim ``n`` of the ``count`` visible GPUs, the lowest free indices first. When
    fewer are free it waits (another job ends; a local run with ``--resources gpu=N``
    never starts more GPU jobs than there are GPUs), saying so once; ``wait_s`` bounds
    the wait (None: no bound). More GPUs than the machine has is a one-line error."""
    if n > count:
        raise ConfigError(
            f"{n} GPU(s) asked for, but this machine has {count} visible; ask for at most {count} "
            "(compress.gpus, snakemake --resources gpu=N)"
        )
    folder = lock_dir or gpu_lock_dir()
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{folder}: cannot make the GPU claims folder ({exc.strerror}); set "
                          f"{LOCK_DIR_VARIABLE} to a node-local folder of yours, or PATHTWT_GPU_CLAIMS=0") from None
    try:
        os.chmod(folder, 0o1777)  # several users of one workstation share the claims
    except OSError:
        pass
    start, said = time.monotonic(), False
    while True:
        held: list[GpuClaim] = []
        for index in range(count):
            path = os.path.join(folder, f"gpu{gpu_id(index)}.lock")
            handle = _try_lock(path)
            if handle is not None:
                held.append(GpuClaim(index, handle, path))
                if len(held) == n:
                    return held
        for claim in held:  # all or nothing: two multi-GPU jobs never hold half each
            claim.release()
        if wait_s is not None and time.monotonic() - start >= wait_s:
            raise ConfigError(f"no {n} free GPU(s) of {count} after {wait_s:.0f} s (claims in {folder})")
        if not said:
            (log or _stderr)(f"all {count} GPUs are claimed by other jobs (claims in {folder}); waiting for one")
            said = True
        time.sleep(poll_s)


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


_PROCESS_CLAIM: list[GpuClaim] = []


def process_claim(count: int) -> GpuClaim:
    """This process's GPU claim, taken on first use and kept until the process ends."""
    if not _PROCESS_CLAIM:
        import torch

        _PROCESS_CLAIM.extend(claim_gpus(1, count))
        # the claimed GPU is also the current one: what asks torch.cuda without a device
        # (bf16 support, memory statistics, pinned memory) asks about it
        torch.cuda.set_device(_PROCESS_CLAIM[0].index)
        _stderr(f"device: cuda:{_PROCESS_CLAIM[0].index} (claimed {_PROCESS_CLAIM[0].path})")
    return _PROCESS_CLAIM[0]


def check_ranks_fit(count: int) -> None:
    """torchrun starts one rank per GPU (LOCAL_WORLD_SIZE of them on this node): more
    ranks than visible GPUs would put two ranks on one GPU; a one-line error instead."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    if local.isdigit() and int(local) > count:
        raise ConfigError(
            f"{local} ranks on this node (one per GPU) but {count} GPU(s) are visible; "
            f"ask for at most {count} (compress.gpus)"
        )


def visible_gpu_count() -> int | None:
    """GPUs this machine shows without importing torch (the workflow's planning process):
    the entries of CUDA_VISIBLE_DEVICES when set, else the NVIDIA device files; None when
    neither says (e.g. AMD GPUs), so nothing is checked."""
    import glob

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip() and not v.strip().startswith("-")])
    found = glob.glob(NVIDIA_DEVICE_GLOB)
    return len(found) if found else None


def check_local_gpu_resource(asked: object) -> None:
    """``snakemake --resources gpu=N`` of a local run: N above the machine's GPUs is a
    one-line error (the jobs beyond them would wait for a GPU that never frees)."""
    if asked is None:
        return
    value = getattr(asked, "value", asked)
    if not str(value).isdigit():
        return
    count = visible_gpu_count()
    if count is not None and int(value) > count:
        raise ConfigError(f"--resources gpu={value}: this machine shows {count} GPU(s); give at most gpu={count}")


# --- a GPU that torch cannot use -------------------------------------------------------

# The NVIDIA driver each CUDA major version needs at least (minor-version compatibility:
# every 12.x build runs on a 525.60.13 driver; NVIDIA's CUDA release notes, table 3).
CUDA_MIN_DRIVER = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}
NVIDIA_DEVICE_GLOB = "/dev/nvidia[0-9]*"


def allocated_gpu_evidence() -> str | None:
    """What says this node gave the job a GPU (a variable naming real GPU indices, or an
    NVIDIA device file), or None."""
    import glob

    for var in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "SLURM_JOB_GPUS"):
        value = os.environ.get(var, "").strip()
        # "" hides every GPU; -1 and NoDevFiles are how launchers say "none"
        if value and value not in ("-1", "NoDevFiles") and not value.startswith("-"):
            return f"{var}={value}"
    gpus = os.environ.get("SLURM_GPUS_ON_NODE", "").strip()
    if gpus.isdigit() and int(gpus) > 0:
        return f"SLURM_GPUS_ON_NODE={gpus}"
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        found = sorted(glob.glob(NVIDIA_DEVICE_GLOB))
        if found:
            return f"{found[0]} exists"
    return None


def torch_build() -> str:
    """torch's version and the GPU runtime it was built for, in words."""
    import torch

    cuda, hip = getattr(torch.version, "cuda", None), getattr(torch.version, "hip", None)
    if hip:
        return f"torch {torch.__version__} (ROCm {hip} build)"
    if cuda:
        return f"torch {torch.__version__} (CUDA {cuda} build)"
    return f"torch {torch.__version__} (CPU-only build)"


def check_no_unusable_gpu(option: str) -> None:
    """A one-line error when this node was given a GPU that torch cannot use (a driver
    older than torch's CUDA build, a CPU-only torch wheel, a ROCm/CUDA mix-up), instead of
    a silent CPU run that lasts until the job's time limit."""
    import torch

    evidence = allocated_gpu_evidence()
    if evidence is None:
        return
    cuda, hip = getattr(torch.version, "cuda", None), getattr(torch.version, "hip", None)
    if hip:
        need = f"it needs the amdgpu driver of ROCm {hip} or newer"
    elif cuda:
        need = (f"its CUDA {cuda} build needs an NVIDIA driver >= {CUDA_MIN_DRIVER.get(cuda.split('.')[0], '?')} "
                "(nvidia-smi shows the installed one); install a torch build for the driver's CUDA version")
    else:
        need = "it is the CPU-only build; install the CUDA (or ROCm) build"
    raise ConfigError(
        f"{option}: this node has a GPU ({evidence}) but {torch_build()} cannot use it: {need} "
        "(docs/gpus.md), or run on the CPU with --device cpu"
    )


def device_provenance(device: object) -> dict[str, Any]:
    """Which device a run used, for its output files: ``device``, the GPU's name, torch's
    version and the CUDA/ROCm version it was built with."""
    import torch

    name = str(device)
    # plain str: torch's version strings are a str subclass that HDF5 attributes refuse
    info: dict[str, Any] = {"device": name, "torch_version": str(torch.__version__),
                            "cuda_version": str(getattr(torch.version, "cuda", None) or ""),
                            "hip_version": str(getattr(torch.version, "hip", None) or "")}
    if name.startswith("cuda") and torch.cuda.is_available():
        index = int(name[5:]) if name.startswith("cuda:") else torch.cuda.current_device()
        info["gpu_name"] = torch.cuda.get_device_name(index)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        if visible:
            info["cuda_visible_devices"] = visible
    else:
        info["gpu_name"] = ""
    return info


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


def run_with_gpus(argv: list[str]) -> int:
    """``python -m pathtwt.devices --gpus N -- COMMAND ...``: run COMMAND (a torchrun of N
    ranks) on N GPUs of this machine. Where no launcher chose the GPUs, N free ones are
    claimed as :func:`resolve_device` claims one, CUDA_VISIBLE_DEVICES names them, and the
    claims pass to COMMAND (the locks stay held until it ends); more GPUs than the machine
    has is a one-line error."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pathtwt.devices", description=run_with_gpus.__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    import torch

    try:
        if not torch.cuda.is_available():
            check_no_unusable_gpu(f"--gpus {args.gpus}")
            raise ConfigError(f"--gpus {args.gpus}: no CUDA device is visible; use device cpu")
        count = torch.cuda.device_count()
        if claims_apply(count):
            claims = claim_gpus(args.gpus, count)
            for claim in claims:
                os.set_inheritable(claim.handle.fileno(), True)
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_id(c.index) for c in claims)
            _stderr(f"devices: cuda:{os.environ['CUDA_VISIBLE_DEVICES']} (claimed in {os.path.dirname(claims[0].path)})")
        elif args.gpus > count:
            claim_gpus(args.gpus, count)  # the one-line error
    except ConfigError as exc:
        _stderr(f"error: {exc}")
        return 2
    os.execvp(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(run_with_gpus(sys.argv[1:]))
