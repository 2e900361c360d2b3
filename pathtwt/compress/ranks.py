"""Data-parallel ranks (torch.distributed) as the distillation loop sees them.

A run launched by ``torchrun`` (or ``srun``, one task per GPU) has ``WORLD_SIZE`` > 1 in
its environment; :func:`init_from_env` joins the process group and picks this rank's
device. Every rank computes the same discovery, auditioning and fidelity (cheap next to
distillation); only distillation is split, and only rank 0 writes files. What a rank
computes alone and what decides what runs next (the merge plan, the audition's winners,
NOSE's layers, the subset search's choice, the precision) is then taken from rank 0 by
:func:`decide`, so the ranks never go on with different choices (a near tie of two floats
can fall differently on two GPUs); what must simply be the same everywhere (the settings,
the step a run resumes from) is compared by :func:`agree`, whose mismatch is one line on
every rank instead of a hang.

A rank that fails leaves the group with :func:`abort`, never :func:`shutdown`
(:mod:`pathtwt.compress.rank_failures`). Each rank counts the collectives it has entered
(:func:`progress`): the ranks' watchers compare the counts, and a rank that stays behind
the others for ``--rank-timeout`` is named as the one that stopped answering. The group's
own timeout (:func:`group_timeout`, NCCL's watchdog) is set later than that, so the job
ends with the project's line before NCCL's watchdog would abort the process in its words.

A GPU run's group is plain ``nccl`` (RCCL on ROCm builds): every collective of the run
(the loop's reductions, :func:`gather_json`, DDP) runs on the rank's own device
(:func:`collective_device`), so no gloo half is connected; a gloo group would connect at
init over the host name's address, which fails between nodes whose name resolves to
127.0.1.1 (pytorch/gloo#223). A run of CPU ranks uses gloo alone. torch parses the
string with ``distributed_c10d.BackendConfig``: ``nccl`` maps CUDA alone, ``gloo`` the CPU.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import timedelta
from typing import Any, Callable

import torch

from pathtwt.compress.defaults import COMPRESS_DEFAULTS
from pathtwt.errors import PathtwtError

log = logging.getLogger(__name__)


def _env_int(*names: str, default: int) -> int:
    for name in names:
        if os.environ.get(name, "").strip().isdigit():
            return int(os.environ[name])
    return default


def launched_world_size() -> int:
    """Ranks the launcher started: torchrun's WORLD_SIZE; under plain ``srun`` (no
    torchrun) SLURM's task count, when MASTER_ADDR says where rank 0 listens."""
    if "WORLD_SIZE" not in os.environ and os.environ.get("MASTER_ADDR") and "SLURM_PROCID" in os.environ:
        os.environ["WORLD_SIZE"] = os.environ.get("SLURM_NTASKS", "1")
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ.setdefault("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
        os.environ.setdefault("MASTER_PORT", "29500")
    return _env_int("WORLD_SIZE", default=1)


# the process group's backend: NCCL alone for GPU ranks, gloo for CPU ranks (module doc)
GPU_BACKEND = "nccl"
CPU_BACKEND = "gloo"
# how long an abort may take before the rank leaves without it (see abort)
ABORT_WAIT_S = 10.0
# where the loop's reductions run: this rank's device once the group is joined
_device = "cpu"


def check_rendezvous() -> None:
    """Several ranks need the address and port rank 0 listens on (torchrun and srun with
    MASTER_ADDR set give both): refuse in one line rather than wait for torch's timeout
    or fail with its multi-line traceback."""
    from pathtwt.errors import ConfigError

    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name, "").strip()]
    if missing:
        raise ConfigError(
            f"WORLD_SIZE={os.environ.get('WORLD_SIZE')} ranks but {' and '.join(missing)} not set: launch with "
            "torchrun (e.g. torchrun --standalone --nproc-per-node N -m pathtwt compress ...) or export "
            "MASTER_ADDR and MASTER_PORT of rank 0's node"
        )


def init_from_env(device: str, timeout_minutes: float = COMPRESS_DEFAULTS.rank_timeout) -> str:
    """Join the process group when launched with several ranks; returns this rank's
    device (``cuda:LOCAL_RANK`` on CUDA). A single-process run is left untouched.
    ``timeout_minutes`` (``--rank-timeout``) is when the watchers end the job; the group's
    own timeout comes later (:func:`group_timeout`), instead of torch's 30 minutes."""
    import torch.distributed as dist

    global _device
    if launched_world_size() <= 1 or dist.is_initialized():
        return device
    check_rendezvous()
    on_cuda = str(device).startswith("cuda")
    local = _env_int("LOCAL_RANK", "SLURM_LOCALID", default=0)
    if on_cuda:
        # one GPU visible per task (srun --gpus-per-task) or all of the node's (torchrun)
        local %= max(1, torch.cuda.device_count())
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if not timeout_minutes > 0:
        from pathtwt.errors import ConfigError

        raise ConfigError(f"--rank-timeout {timeout_minutes}: give the minutes a rank waits for the others, above 0")
    dist.init_process_group(backend=backend_for(device), timeout=group_timeout(timeout_minutes))
    _device = device
    return device


def backend_for(device: str) -> str:
    """The process group's backend for ranks on ``device`` (module doc)."""
    return GPU_BACKEND if str(device).startswith("cuda") else CPU_BACKEND


def group_timeout(rank_timeout_minutes: float) -> timedelta:
    """The group's own timeout for ``--rank-timeout`` minutes: later than the watchers'
    deadline by half of it, and a minute at least, so a rank that stopped answering is
    named by the watchers (:mod:`pathtwt.compress.rank_failures`) before NCCL's watchdog
    ends the processes. With torch's defaults (``TORCH_NCCL_ASYNC_ERROR_HANDLING`` 3,
    SkipCleanUp, ``TORCH_NCCL_BLOCKING_WAIT`` off; torchrun exports 1, TearDown)
    ProcessGroupNCCL's watchdog thread throws on a timeout and the process dies of
    SIGABRT: no exception reaches Python (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp,
    ``ErrorHandlingMode`` and ``TORCH_NCCL_BLOCKING_WAIT``; ProcessGroupNCCL.cpp,
    ``Watchdog::run``). Blocking wait would raise in Python, but makes every collective a
    host wait; the watchers' deadline gives the line without it."""
    minutes = float(rank_timeout_minutes)
    return timedelta(minutes=minutes + max(1.0, minutes / 2))


_entered = 0  # collectives this rank has entered (progress)


def entering_collective() -> None:
    """Count a collective this rank is about to enter (one integer add: no store call)."""
    global _entered
    _entered += 1


def progress() -> int:
    """How many collectives this rank has entered: what its watcher reports."""
    return _entered


def collective_device() -> torch.device:
    """The device the loop's reductions run on: this rank's GPU under NCCL, else the CPU."""
    return torch.device(_device)


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_writer() -> bool:
    """Only rank 0 writes checkpoints, exports and summaries."""
    return rank() == 0


def barrier() -> None:
    """Wait for every rank: a one-value reduction on this rank's device (NCCL's own barrier
    guesses the GPU from the rank number)."""
    all_mean(torch.zeros(1, dtype=torch.float64))


def all_mean(values: torch.Tensor) -> torch.Tensor:
    """Mean over ranks of a small float tensor (identity on one rank)."""
    if world_size() == 1:
        return values
    import torch.distributed as dist

    # on the rank's device: a GPU group's NCCL backend takes CUDA tensors only
    out = values.to(collective_device(), copy=True)
    entering_collective()
    dist.all_reduce(out)
    return (out / world_size()).to(values.device)


def decide(name: str, value: Any) -> Any:
    """Rank 0's ``value`` (JSON: tuples come back as lists) on every rank: a choice each
    rank computed alone, made once for all. A rank whose own value differed says so."""
    if world_size() == 1:
        return json.loads(json.dumps(value))  # the same types as several ranks get
    values = gather_json(value, default=None)
    if json.dumps(values[rank()]) != json.dumps(values[0]):
        log.warning("rank %d: %s differs from rank 0's; rank 0's is used", rank(), name)
    return values[0]


def gather_json(value: Any, default: Callable[[Any], Any] | None = str) -> list[Any]:
    """Every rank's ``value``, in rank order (two small all-gathers). ``default`` encodes
    what JSON has no form for (``json.dumps``'s; None refuses it)."""
    import torch.distributed as dist

    device, n = collective_device(), world_size()
    data = json.dumps(value, default=default).encode()
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(n)]
    entering_collective()
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=device))
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8, device=device)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    gathered = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(gathered, mine)
    return [json.loads(bytes(g[: int(s.item())].cpu().numpy())) for g, s in zip(gathered, sizes)]


def agree(name: str, value: Any, remedy: str) -> None:
    """Every rank must hold the same ``value`` (JSON-able): on a mismatch every rank raises
    the same one line naming ``name``, the ranks that differ from rank 0 and how."""
    if world_size() == 1:
        return
    values = gather_json(value)
    differ = [r for r, v in enumerate(values) if v != values[0]]
    if differ:
        first = differ[0]
        raise PathtwtError(f"the ranks disagree on {name}: rank(s) {', '.join(map(str, differ))} differ from rank 0 "
                           f"({_difference(values[0], values[first], first)}); {remedy}")


def _difference(ours: Any, theirs: Any, other: int) -> str:
    """What rank ``other`` holds that rank 0 does not, shortly: the keys that differ."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        keys = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        return "; ".join(f"{k}: rank 0 {ours.get(k)!r:.60}, rank {other} {theirs.get(k)!r:.60}" for k in keys[:4])
    return f"rank 0 {ours!r:.80}, rank {other} {theirs!r:.80}"


def shutdown() -> None:
    """Leave the group after a run that ended well: every collective has completed, so
    destroying it (NCCL: ncclCommFinalize, which waits for them) returns at once."""
    import torch.distributed as dist

    global _device
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _device = "cpu"


def abort() -> bool:
    """Leave the group after an error: abort it, waiting at most :data:`ABORT_WAIT_S`;
    False when the abort did not end in that time (the caller then exits without it).

    What an abort does depends on the backend. NCCL's (``ProcessGroupNCCL::abort``,
    ncclCommAbort on each communicator) cancels this rank's pending collectives instead of
    waiting for them, as destroying the group would (ncclCommFinalize waits for a
    collective the other ranks never complete). It can itself wait, for the watchdog up to
    the group's timeout and for the node's other ranks inside NCCL (NVIDIA/nccl#863,
    #1777), hence the bound. Gloo's abort does nothing (``Backend::abort`` is a no-op for
    it, torch/csrc/distributed/c10d/Backend.hpp): the other ranks learn of this one when
    its connections close, as this process exits."""
    import threading

    import torch.distributed as dist

    global _device
    _device = "cpu"
    if not (dist.is_available() and dist.is_initialized()):
        return True

    def run() -> None:
        try:
            dist.distributed_c10d._abort_process_group()
        except Exception as exc:  # noqa: BLE001 - leaving anyway; the error being raised is the one to show
            log.warning("aborting the process group failed (%s); leaving without it", exc)

    thread = threading.Thread(target=run, name="pathtwt-abort", daemon=True)
    thread.start()
    thread.join(ABORT_WAIT_S)
    return not thread.is_alive()
