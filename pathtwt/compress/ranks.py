"""Data-parallel ranks (torch.distributed) as the distillation loop sees them.

A run launched by ``torchrun`` (or ``srun``, one task per GPU) has ``WORLD_SIZE`` > 1 in
its environment; :func:`init_from_env` joins the process group and picks this rank's
device. Every rank computes the same discovery, auditioning and fidelity (cheap next to
distillation) so that they need no communication; only distillation is split, and only
rank 0 writes files.

A GPU run's group has a backend per device type, ``cpu:gloo,cuda:nccl`` (NCCL is RCCL on
ROCm builds): NCCL alone handles CUDA tensors only, and a CPU tensor reaching a plain
``nccl`` group fails every rank with "No backend type associated with device type cpu".
The small reductions of the loop (:func:`all_mean`) run on the rank's own device
(:func:`collective_device`), on NCCL for a GPU run, so the gloo half only serves
collectives that are CPU by nature. A CPU run uses gloo alone.
"""

from __future__ import annotations

import os

import torch


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


# the process group's backends: one per device type on a GPU, gloo alone on CPU
GPU_BACKEND = "cpu:gloo,cuda:nccl"
CPU_BACKEND = "gloo"
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


def init_from_env(device: str) -> str:
    """Join the process group when launched with several ranks; returns this rank's
    device (``cuda:LOCAL_RANK`` on CUDA). A single-process run is left untouched."""
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
    dist.init_process_group(backend=GPU_BACKEND if on_cuda else CPU_BACKEND)
    _device = device
    return device


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
    if world_size() > 1:
        import torch.distributed as dist

        dist.barrier()


def all_mean(values: torch.Tensor) -> torch.Tensor:
    """Mean over ranks of a small float tensor (identity on one rank)."""
    if world_size() == 1:
        return values
    import torch.distributed as dist

    # on the rank's device: a GPU group's NCCL backend takes CUDA tensors only
    out = values.to(collective_device(), copy=True)
    dist.all_reduce(out)
    return (out / world_size()).to(values.device)


def shutdown() -> None:
    import torch.distributed as dist

    global _device
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _device = "cpu"
