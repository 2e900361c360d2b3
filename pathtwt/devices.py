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


_DECIDED: dict[str, str] = {}


def use_device(name: object = "auto") -> str:
    """The process's device, decided once: resolved (:func:`resolve_device`: a free GPU
    claimed where several are shared, MIOpen's caches node-local on ROCm), made torch's
    current device, so what asks torch.cuda without a device (bf16 support, memory
    statistics, pinned memory) asks about this one. Every command calls it once where it
    starts; the rest of the process reads its result (a Backbone's ``device``, the
    options' ``device``), and a second call returns the same device."""
    key = str(name)
    if key not in _DECIDED:
        device = resolve_device(key)
        if device.startswith("cuda:"):
            import torch

            torch.cuda.set_device(int(device[5:]))
        check_gpu_architecture(device)
        _DECIDED[key] = device
    return _DECIDED[key]


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


def _open_lock(path: str) -> tuple[int, bool]:
    """The lock file's descriptor and whether it is writable. An existing file is opened
    without O_CREAT: under fs.protected_regular (systemd's default) O_CREAT on another
    user's file in the sticky, world-writable claims folder is refused (EACCES) even when
    the file is shared. Read-only where another user's umask left it so: flock needs no
    write access."""
    for _ in range(3):  # a file made or removed by another job between two tries
        for flags, writable in ((os.O_RDWR, True), (os.O_RDONLY, False)):
            try:
                return os.open(path, flags), writable
            except FileNotFoundError:
                break
            except PermissionError:
                continue
        else:
            raise PermissionError(13, "permission denied")
        try:  # not there yet: made by this process, O_EXCL so an existing one is never re-created
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        try:
            os.fchmod(fd, 0o666)  # every user of a shared workstation claims through the same file
        except OSError:
            pass  # a filesystem without modes: flock still claims, the others open it read-only
        return fd, True
    raise FileNotFoundError(2, "appeared and vanished while opening")


def _try_lock(path: str) -> Any:
    import fcntl

    try:
        fd, writable = _open_lock(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot open the GPU claim ({exc.strerror}); set {LOCK_DIR_VARIABLE} "
                          "to a node-local folder of yours, or PATHTWT_GPU_CLAIMS=0") from None
    handle = os.fdopen(fd, "r+" if writable else "r")  # kept open for as long as the claim holds
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    if not writable:
        return handle
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
        # the claimed GPU is also the current one (as use_device makes it): set here too,
        # so a library caller of resolve_device alone is on the GPU it holds
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


# AMD GPUs (each MI250X GCD is one) show as DRM render nodes of vendor 0x1002 (the
# amdgpu driver); torch's ROCm build counts the same devices.
AMD_RENDER_VENDOR_GLOB = "/sys/class/drm/renderD*/device/vendor"
AMD_VENDOR_ID = "0x1002"


def visible_gpus() -> tuple[int, str]:
    """GPUs this machine shows, and what says so, without importing torch (the workflow's
    planning process; importing torch there costs seconds on every plan): the entries of
    CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES where set, else the
    driver's device files (NVIDIA's /dev/nvidiaN, AMD's render nodes)."""
    import glob

    for var in (*VISIBLE_VARIABLES, "ROCR_VISIBLE_DEVICES"):
        visible = os.environ.get(var)
        if visible is not None:
            entries = [v for v in visible.split(",") if v.strip() and not v.strip().startswith("-")]
            return len(entries), f"{var}={visible}"
    nvidia = glob.glob(NVIDIA_DEVICE_GLOB)
    if nvidia:
        return len(nvidia), f"{len(nvidia)} NVIDIA device file(s) {NVIDIA_DEVICE_GLOB}"
    amd = []
    for path in glob.glob(AMD_RENDER_VENDOR_GLOB):
        try:
            if open(path).read().strip().lower() == AMD_VENDOR_ID:
                amd.append(path)
        except OSError:
            continue
    if amd:
        return len(amd), f"{len(amd)} AMD render node(s) of the amdgpu driver"
    return 0, "no GPU device files and no *_VISIBLE_DEVICES"


def local_gpu_jobs(asked: object) -> tuple[int | None, str]:
    """How many GPU jobs a local run starts at a time, and the one line that says why.
    ``asked``: ``--resources gpu=N`` (a profile's or the command line's), None when not
    given. Not given: one per visible GPU, so a single-GPU machine runs its GPU stages one
    after another rather than all on cuda:0 at once; with no GPU visible, no limit (the GPU
    stages then run on the CPU, bounded by --cores). N above the visible GPUs: a one-line
    error (the jobs beyond them would wait for a GPU that never frees)."""
    count, why = visible_gpus()
    value = getattr(asked, "value", asked)
    if value is not None and str(value).isdigit():
        if count and int(value) > count:
            raise ConfigError(f"--resources gpu={value}: this machine shows {count} GPU(s); "
                              f"give at most gpu={count} ({why})")
        return None, f"pathtwt workflow: at most {value} GPU job(s) at a time (--resources gpu={value})"
    if not count:
        return None, (f"pathtwt workflow: no GPU visible ({why}); the GPU stages run on the CPU as their "
                      "`device` allows, as many at a time as --cores allows")
    return count, (f"pathtwt workflow: at most {count} GPU job(s) at a time, one per visible GPU ({why}); "
                   "--resources gpu=N to change")


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


def nvidia_driver_version() -> str | None:
    """The NVIDIA driver's version ("550.54.15"), from the kernel module's own file (no
    process to start) or nvidia-smi; None where neither says."""
    import subprocess

    try:
        m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)",
                      open("/proc/driver/nvidia/version").read())
        if m:
            return m.group(1)
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return None


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


# The workflow's conda env for each CUDA major (workflow/envs/, the config key conda_env).
CUDA_ENVS = {"13": "pathtwt", "12": "pathtwt-cu12"}


def build_for_driver(driver: str | None) -> str:
    """Which torch build an NVIDIA driver runs, in words naming the workflow's env."""
    if driver is None:
        return "the driver's version is unknown (nvidia-smi shows it)"
    for major in sorted(CUDA_ENVS, key=int, reverse=True):
        if _version_tuple(driver) >= _version_tuple(CUDA_MIN_DRIVER[major]):
            return f"driver {driver} runs CUDA {major} builds (conda_env: {CUDA_ENVS[major]})"
    return f"driver {driver} is older than any CUDA 12 build needs ({CUDA_MIN_DRIVER['12']}); update the driver"


def amd_gpu_evidence() -> str | None:
    """What says this node's GPUs are AMD ones: ROCm's variables, /dev/kfd, amdgpu render nodes."""
    import glob

    for var in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        value = os.environ.get(var, "").strip()
        if value and not value.startswith("-"):
            return f"{var}={value}"
    if os.path.exists("/dev/kfd"):
        return "/dev/kfd exists"
    for path in glob.glob(AMD_RENDER_VENDOR_GLOB):
        try:
            if open(path).read().strip().lower() == AMD_VENDOR_ID:
                return f"{os.path.dirname(os.path.dirname(path))} is an amdgpu device"
        except OSError:
            continue
    return None


def check_no_unusable_gpu(option: str) -> None:
    """A one-line error when this node was given a GPU that torch cannot use (a driver
    older than torch's CUDA build, a CPU-only torch wheel, a ROCm/CUDA mix-up), instead of
    a silent CPU run that lasts until the job's time limit. It says which build fits."""
    import torch

    evidence = allocated_gpu_evidence()
    if evidence is None:
        return
    cuda, hip = getattr(torch.version, "cuda", None), getattr(torch.version, "hip", None)
    amd = amd_gpu_evidence()
    if hip:
        need = f"it needs the amdgpu driver of ROCm {hip} or newer"
    elif amd:
        # an AMD node (LUMI-G) in the CUDA env: asking for an NVIDIA driver would mislead
        evidence = amd
        need = ("the GPU is an AMD one and this is not torch's ROCm build: use conda_env: pathtwt-rocm "
                "or the container (workflow/envs/README.md)")
    elif cuda:
        need = (f"its CUDA {cuda} build needs an NVIDIA driver >= {CUDA_MIN_DRIVER.get(cuda.split('.')[0], '?')}; "
                f"{build_for_driver(nvidia_driver_version())}")
    else:
        need = "it is the CPU-only build; install the CUDA (or ROCm) build"
    raise ConfigError(
        f"{option}: this node has a GPU ({evidence}) but {torch_build()} cannot use it: {need} "
        "(docs/gpus.md), or run on the CPU with --device cpu"
    )


def _arch_number(arch: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"(?:sm|compute)_(\d+)(\d)[a-z]?", arch)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_gpu_architecture(device: str) -> None:
    """A one-line error when torch's CUDA build has no kernels for this GPU (CUDA 13
    builds leave out sm_70, the V100): torch still reports the GPU as available, and the
    run would fail at its first kernel. A build runs on a GPU when it carries a cubin of
    the same major and an equal or lower minor, or PTX of an equal or lower version.
    ROCm builds are left to ROCm."""
    import torch

    if not device.startswith("cuda") or getattr(torch.version, "hip", None) or not getattr(torch.version, "cuda", None):
        return
    try:
        index = int(device[5:]) if device.startswith("cuda:") else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        archs = list(torch.cuda.get_arch_list() or [])
    except (RuntimeError, AssertionError):
        return  # torch cannot ask the driver: its own error comes at the first kernel, with more detail
    if not archs:
        return  # nothing to compare with
    for arch in archs:
        number = _arch_number(arch)
        if number is None:
            continue
        if arch.startswith("sm_") and number[0] == major and number[1] <= minor:
            return
        if arch.startswith("compute_") and number <= (major, minor):
            return
    name = torch.cuda.get_device_name(index)
    raise ConfigError(
        f"--device {device}: {name} is sm_{major}{minor} but {torch_build()} has kernels for {', '.join(archs)} only; "
        f"install a build with sm_{major}{minor} (conda_env: pathtwt-cu12, docs/gpus.md), or run with --device cpu"
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


def reading_workers(device: Any = "cpu") -> int:
    """Tile-reading processes of an extraction job when --workers is not given: the job's
    cores minus the embedding process; at most 4 on a CPU, where the forward passes compute
    on the same cores, and no cap on a GPU, which embeds faster than a few readers read."""
    spare = available_cores() - 1
    return max(1, spare if str(device).startswith("cuda") else min(4, spare))


# tiles per forward pass of extraction on a GPU when --batch-size is not given: a batch
# of 32 is launch-bound there (one eager ViT-B forward costs 2-6 ms of host time, about
# the GPU's own time for it); 256 tiles of a ViT-B take ~3 GiB of activations in bf16
GPU_BATCH = 256
GPU_BATCH_LARGE = 512  # on a GPU with at least LARGE_GPU_GIB of memory
LARGE_GPU_GIB = 40


def forward_batch_size(device: Any, default: int) -> int:
    """Extraction's batch when not given: ``default`` (the CPU's) off CUDA; on a CUDA
    device, sized from its memory (:data:`GPU_BATCH`, or :data:`GPU_BATCH_LARGE` on 40 GiB
    and more; a batch that does not fit is halved at run time and said)."""
    if not str(device).startswith("cuda"):
        return int(default)
    import torch

    total = torch.cuda.get_device_properties(torch.device(str(device))).total_memory
    return GPU_BATCH_LARGE if total >= LARGE_GPU_GIB * 2**30 else GPU_BATCH


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
