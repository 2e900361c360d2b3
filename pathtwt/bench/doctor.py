"""What this machine can run, one check a line: OK, WARN or FAIL, with the fix.

Each check is a function of :data:`CHECKS` that returns :class:`Check` rows (one per GPU
for the GPU check); :func:`run_checks` runs them all, and a check that raises is a FAIL
row naming the error, so one broken library never hides the others. ``pathtwt doctor``
prints them; ``pathtwt bench`` records them as the machine's facts.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

OK, WARN, FAIL = "OK", "WARN", "FAIL"
GiB = 2**30
# below this a GPU is taken as busy: a ViT-B forward at batch 256 and its reader ring need a few GiB
BUSY_FREE_GIB = 4.0
# what one loader worker of a compress job passes through /dev/shm at a time: torch's
# DataLoader sends each batch as shared memory (prefetch_factor 2 batches a worker), a batch
# of 128 fp32 224 px tiles being 77 MiB (torch/utils/data/_utils/worker.py, collate)
SHM_PER_WORKER_BYTES = 2 * 128 * 3 * 224 * 224 * 4
MIN_PYTHON = (3, 10)  # pyproject.toml's requires-python


@dataclass
class Check:
    """One line of the doctor: ``name`` (what was checked), ``status`` (OK | WARN | FAIL),
    ``detail`` (what was found), ``fix`` (what to do; empty when OK), ``facts`` (the
    values, for --json)."""

    name: str
    status: str
    detail: str
    fix: str = ""
    facts: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        fix = f" -> {self.fix}" if self.fix and self.status != OK else ""
        return f"{self.status:<4}  {self.name:<14} {self.detail}{fix}"


@dataclass
class Context:
    """What the checks are asked about: the store folder and the reading workers a job would use."""

    store: str
    workers: int


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_python(ctx: Context) -> list[Check]:
    v = sys.version_info
    text = f"Python {v.major}.{v.minor}.{v.micro} ({sys.executable})"
    if (v.major, v.minor) < MIN_PYTHON:  # noqa: UP036 - the check itself
        return [Check("python", FAIL, text, f"pathtwt needs Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]}")]
    return [Check("python", OK, text, facts={"version": f"{v.major}.{v.minor}.{v.micro}"})]


def check_torch(ctx: Context) -> list[Check]:
    from pathtwt.devices import torch_build

    import torch

    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
             "timm": _version("timm")}
    return [Check("torch", OK, f"{torch_build()}, timm {facts['timm']}", facts=facts)]


def check_driver(ctx: Context) -> list[Check]:
    """The NVIDIA driver against the CUDA version torch was built for (pathtwt.devices'
    table of the least driver each CUDA major needs)."""
    from pathtwt.devices import CUDA_MIN_DRIVER, _version_tuple, build_for_driver, nvidia_driver_version, visible_gpus

    import torch

    cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
    driver = nvidia_driver_version()
    gpus, why = visible_gpus()
    facts = {"driver": driver, "visible_gpus": gpus}
    if hip:
        return [Check("driver", OK, f"ROCm {hip} build; the amdgpu driver is checked by the GPU line", facts=facts)]
    if not cuda:
        if gpus and driver:
            return [Check("driver", WARN, f"NVIDIA driver {driver} and {why}, but torch is a CPU-only build",
                          f"install torch's CUDA build: {build_for_driver(driver)}", facts)]
        return [Check("driver", OK, "no NVIDIA driver needed: torch is a CPU-only build", facts=facts)]
    if driver is None:
        status = FAIL if gpus else OK
        return [Check("driver", status, f"no NVIDIA driver found ({why}); torch built for CUDA {cuda}",
                      "install the NVIDIA driver, or run with --device cpu" if gpus else "", facts)]
    major = cuda.split(".")[0]
    needed = CUDA_MIN_DRIVER.get(major)
    if needed and _version_tuple(driver) < _version_tuple(needed):
        return [Check("driver", FAIL, f"driver {driver} is older than CUDA {cuda} needs ({needed})",
                      f"update the driver, or install torch for an older CUDA: {build_for_driver(driver)}", facts)]
    return [Check("driver", OK, f"driver {driver} runs torch's CUDA {cuda} build", facts=facts)]


def check_gpus(ctx: Context) -> list[Check]:
    """Each GPU: name, free memory, native bf16, and peer access to the others."""
    from pathtwt.devices import visible_gpus
    from pathtwt.models.precision import resolve_precision

    import torch

    if not torch.cuda.is_available():
        gpus, why = visible_gpus()
        if gpus:
            return [Check("gpu", FAIL, f"{why}, but torch {torch.__version__} cannot use them",
                          "install the torch build the driver runs (see the driver line), or run with --device cpu")]
        return [Check("gpu", OK, "no GPU: every command runs on the CPU (--device cpu)", facts={"count": 0})]
    count = torch.cuda.device_count()
    rows = []
    for i in range(count):
        name = torch.cuda.get_device_name(i)
        free, total = torch.cuda.mem_get_info(i)
        bf16 = resolve_precision("auto", f"cuda:{i}").autocast  # auto runs bf16 where the GPU has bf16 units
        peers = [j for j in range(count) if j != i and torch.cuda.can_device_access_peer(i, j)]
        no_peer = [j for j in range(count) if j != i and j not in peers]
        facts = {"index": i, "name": name, "free_gib": round(free / GiB, 1), "total_gib": round(total / GiB, 1),
                 "native_bf16": bf16, "peer_access": peers}
        detail = (f"cuda:{i} {name}, {free / GiB:.1f} of {total / GiB:.1f} GiB free, bf16 "
                  f"{'native' if bf16 else 'emulated (auto runs fp32)'}")
        if count > 1:
            detail += f", peer access {'to all' if not no_peer else 'missing to ' + ','.join(map(str, no_peer))}"
        status, fix = OK, ""
        if free / GiB < BUSY_FREE_GIB:
            status, fix = WARN, f"another process holds this GPU (under {BUSY_FREE_GIB:.0f} GiB free): pick another with --device cuda:N"
        elif no_peer:
            status, fix = WARN, "multi-GPU compress copies through the host between these GPUs (slower); check the topology with nvidia-smi topo -m"
        rows.append(Check("gpu", status, detail, fix, facts))
    return rows


def check_decoders(ctx: Context) -> list[Check]:
    """Each GPU JPEG decoder of pathtwt.features.gpu_decoders: its self-check on the first
    GPU (made as a job makes it), or why it cannot run there."""
    from pathtwt.features import gpu_decoders

    import torch

    names = gpu_decoders.decoder_names(on_gpu=True, only_installed=False)
    installed = set(gpu_decoders.decoder_names(on_gpu=True, only_installed=True))
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        where = "an AMD GPU" if torch.cuda.is_available() else "no GPU"
        return [Check("decoder", OK, f"{name}: not used ({where}: extraction decodes JPEG tiles on the CPU)")
                for name in names]
    rows = []
    for name in names:
        if name not in installed:
            rows.append(Check("decoder", WARN, f"{name}: not installed", gpu_decoders.INSTALL_GPU_DECODER
                              if name == "nvimgcodec" else f"pip install the {name} build of your torch"))
            continue
        try:
            decoder = gpu_decoders.make_decoder(name, "cuda:0")
            rows.append(Check("decoder", OK, f"{name}: self-check passed on cuda:0 ({decoder!r})",
                              facts={"name": name, "decodes_rgb": decoder.decodes_rgb}))
        except gpu_decoders.GpuDecoderUnavailable as exc:
            rows.append(Check("decoder", WARN, f"{name}: cannot decode on cuda:0", str(exc)))
    if not any(r.status == OK for r in rows):
        rows.append(Check("decoder", WARN, "no GPU decoder works here: extraction decodes on the CPU (slower)",
                          gpu_decoders.INSTALL_GPU_DECODER))
    return rows


def check_slide_readers(ctx: Context) -> list[Check]:
    """OpenSlide and tiffslide, and the slide formats (pathtwt.wsi.formats.FORMATS) their readers open."""
    from pathtwt.wsi.formats import FORMATS

    found: dict[str, str | None] = {}
    unloaded: set[str] = set()  # readers (pathtwt.wsi.readers names) whose library does not load
    rows = []
    try:
        import openslide

        found["openslide"] = f"OpenSlide {openslide.__library_version__}"
    except (ImportError, OSError) as exc:
        found["openslide"] = None
        unloaded.add("openslide")
        rows.append(Check("slides", FAIL, f"OpenSlide cannot load: {' '.join(str(exc).split())[:120]}",
                          "pip install openslide-bin openslide-python (or your system's libopenslide)"))
    version = _version("tiffslide")
    found["tiffslide"] = f"tiffslide {version}" if version else None
    if not version:
        unloaded.add("tiffslide")
        rows.append(Check("slides", WARN, "tiffslide is not installed: no fallback reader for TIFF slides",
                          "pip install tiffslide"))
    readable = [f.name for f in FORMATS if f.reader not in unloaded]
    unreadable = [f.name for f in FORMATS if f.name not in readable]
    detail = f"{', '.join(v for v in found.values() if v) or 'no slide reader'}; reads {', '.join(readable)}"
    if unreadable:
        detail += f"; cannot read {', '.join(unreadable)}"
    rows.insert(0, Check("slides", OK if not unreadable else WARN, detail,
                         "" if not unreadable else "install OpenSlide (see the line above)",
                         {"readers": found, "formats": readable}))
    return rows


def check_shm(ctx: Context) -> list[Check]:
    """/dev/shm against what ``--workers`` loader processes pass through it."""
    needed = ctx.workers * SHM_PER_WORKER_BYTES
    try:
        usage = shutil.disk_usage("/dev/shm")
    except OSError as exc:
        return [Check("shm", WARN, f"/dev/shm unavailable ({exc.strerror})",
                      "run with --workers 0, or give the container a /dev/shm (docker --shm-size 8g)")]
    facts = {"total_gib": round(usage.total / GiB, 2), "free_gib": round(usage.free / GiB, 2),
             "needed_gib": round(needed / GiB, 2), "workers": ctx.workers}
    detail = (f"/dev/shm {usage.free / GiB:.1f} GiB free of {usage.total / GiB:.1f}; --workers {ctx.workers} "
              f"needs {needed / GiB:.1f} GiB")
    if usage.free < needed:
        return [Check("shm", WARN, detail, f"lower --workers to {max(0, usage.free // SHM_PER_WORKER_BYTES)}, or "
                      "enlarge /dev/shm (docker --shm-size, or mount -o remount,size=8G /dev/shm)", facts)]
    return [Check("shm", OK, detail, facts=facts)]


def check_store(ctx: Context) -> list[Check]:
    """The store: writable, free space, how many entries."""
    from pathtwt.io.store.layout import Store
    from pathtwt.io.store.maintenance import scan

    path = Path(ctx.store)
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    free = shutil.disk_usage(existing).free
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".doctor-"):
            pass
        writable = True
    except OSError:
        writable = False
    entries = sum(1 for _ in scan(Store(path))) if path.is_dir() else 0
    facts = {"path": str(path), "exists": path.is_dir(), "writable": writable, "free_gib": round(free / GiB, 1),
             "entries": entries}
    detail = (f"{path}{'' if path.is_dir() else ' (made at the first run)'}: {entries} entries, "
              f"{free / GiB:.1f} GiB free")
    if not writable:
        return [Check("store", FAIL, f"{detail}; {existing} is not writable",
                      "give a writable folder with --store (or the config's store: key)", facts)]
    if free < 10 * GiB:
        return [Check("store", WARN, detail, "free space: features of one cohort take GiBs (pathtwt store gc)", facts)]
    return [Check("store", OK, detail, facts=facts)]


def check_workflow(ctx: Context) -> list[Check]:
    """Snakemake, its SLURM executor, and whether sbatch is reachable."""
    snakemake, slurm = _version("snakemake"), _version("snakemake-executor-plugin-slurm")
    sbatch = shutil.which("sbatch")
    facts = {"snakemake": snakemake, "slurm_executor": slurm, "sbatch": sbatch}
    if not snakemake:
        return [Check("workflow", WARN, "Snakemake is not installed: single commands only",
                      "pip install -e '.[workflow]'", facts)]
    detail = f"Snakemake {snakemake}, SLURM executor {slurm or 'not installed'}, sbatch {sbatch or 'not on PATH'}"
    if not slurm:
        return [Check("workflow", WARN, detail, "pip install -e '.[workflow]' for --profile slurm", facts)]
    if not sbatch:
        return [Check("workflow", WARN, detail, "local runs only here; submit from a SLURM login node", facts)]
    return [Check("workflow", OK, detail, facts=facts)]


def check_cpu(ctx: Context) -> list[Check]:
    """The CPU's matrix units and what --precision auto resolves to on it."""
    from pathtwt.bench.cpu import cpu_flags, cpu_units
    from pathtwt.models.precision import resolve_precision

    flags = cpu_flags()
    units = {key: value for key, value in cpu_units().items() if key != "model"}
    auto = resolve_precision("auto", "cpu")
    mode = "bf16 autocast" if auto.autocast else auto.weights
    from pathtwt.devices import available_cores

    cores = available_cores()
    have = [f"{label} {'yes' if units[key] else 'no'}" for key, label in
            (("avx2", "AVX2"), ("avx512f", "AVX512F"), ("avx512_bf16", "AVX512-BF16"), ("amx", "AMX"))]
    facts = {**units, "cores": cores, "precision_auto": mode}
    detail = f"{cores} cores, {', '.join(have)}; --precision auto on cpu: {mode}"
    if not units["avx2"] and flags:
        return [Check("cpu", WARN, detail, "no AVX2: CPU extraction is several times slower; use a GPU", facts)]
    return [Check("cpu", OK, detail, facts=facts)]


CHECKS: list[Callable[[Context], list[Check]]] = [
    check_python, check_torch, check_driver, check_gpus, check_decoders, check_slide_readers, check_shm,
    check_store, check_workflow, check_cpu,
]


def run_checks(ctx: Context) -> list[Check]:
    """Every check of :data:`CHECKS`, in order; one that raises is a FAIL row naming its error."""
    rows: list[Check] = []
    for check in CHECKS:
        name = check.__name__.removeprefix("check_")
        try:
            rows += check(ctx)
        except Exception as exc:  # noqa: BLE001 - one broken library must not hide the other checks
            rows.append(Check(name, FAIL, f"the check failed: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}",
                              "reinstall: pip install -c constraints.txt -e ."))
    return rows


def as_json(rows: list[Check]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


def exit_code(rows: list[Check]) -> int:
    """1 if any check failed, else 0."""
    return int(any(r.status == FAIL for r in rows))
