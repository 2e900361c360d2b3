"""The distillation loop shared by TWT and the comparison methods.

``distill(student, teacher, tiles, transform=..., objective=..., options=...)`` trains
``student`` against the frozen ``teacher`` on uint8 calibration tiles. What is matched is
the ``objective``: an object with ``targets(teacher, x) -> list[Tensor]`` (computed without
gradients) and ``loss(student, x, targets, step) -> (loss, {term: value})``, the per-step
hook through which every method plugs its own loss. :class:`DeepSupervision` is TWT's.

Exact resumption: the batch at step t is a pure function of (seed, t) (a per-epoch
permutation from a seeded generator), augmentation is seeded by (seed, t), the schedules
are functions of t, and checkpoints hold the student, optimiser, LR scheduler, RNG states
and step. A run killed at any point and rerun with the same options therefore continues
from its last checkpoint to the same numbers as an uninterrupted run (on CPU).
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np
import torch
from torch import nn

from pathtwt.errors import NumericsError, PathtwtError
from pathtwt.io.atomic import atomic_output
from pathtwt.compress.augment import TileAugmenter, step_seed
from pathtwt.compress.intermediates import tiles_to_batch
from pathtwt.compress.schedule import cosine_lr_factor, term_weights
from pathtwt.compress.student import block_outputs

Transform = Callable[[np.ndarray], torch.Tensor]
CHECKPOINT_FORMAT = "pathtwt-distill-checkpoint/1"


@dataclass
class DistillOptions:
    steps: int | None = None  # optimiser steps; None: derived from epochs
    epochs: float | None = None  # passes over the fit tiles (used when steps is None)
    batch_size: int = 32
    lr: float = 3e-4  # peak learning rate (the paper's)
    weight_decay: float = 0.05
    warmup_steps: int = 0
    grad_clip: float = 1.0
    augment: bool = True  # colour jitter + Gaussian blur; off allows caching teacher targets
    seed: int = 0
    device: str = "cpu"
    checkpoint: Path | None = None  # file; resumed from when it exists
    checkpoint_every: int = 100
    stop_after: int | None = None  # stop after this step as if interrupted (checkpoint kept)
    progress: bool = True
    cache_limit_bytes: int = 4 * 2**30  # largest in-memory teacher-target cache

    def resolved_steps(self, n_tiles: int) -> int:
        if self.steps is not None:
            return int(self.steps)
        epochs = 1.0 if self.epochs is None else float(self.epochs)
        return max(1, math.ceil(epochs * steps_per_epoch(n_tiles, self.batch_size)))


@dataclass
class DistillResult:
    steps_done: int
    total_steps: int
    completed: bool
    resumed_from: int
    history: list[dict[str, float]] = field(default_factory=list)


class Objective(Protocol):
    def targets(self, teacher: nn.Module, x: torch.Tensor) -> list[torch.Tensor]: ...

    def loss(self, student: nn.Module, x: torch.Tensor, targets: list[torch.Tensor], step: int) -> tuple[torch.Tensor, dict[str, float]]: ...


@dataclass
class DeepSupervision:
    """TWT's loss: ``sum_j w_j(t) MSE(student block j, teacher layer e_j) + w_{K+1}(t) MSE(final)``.

    ``boundaries`` are the teacher layer numbers e_j (1-indexed) matched by student blocks
    1..K; ``None`` keeps only the final-feature term (truncation's floor). ``alphas`` are the
    activation steps of the K+1 ramps (None: schedule off, all weights 1). Final features are
    the normed token sequence (``model.norm``), prefix tokens included.
    """

    boundaries: Sequence[int] | None
    alphas: Sequence[float] | None = None

    def targets(self, teacher: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
        outs = block_outputs(teacher, x)
        picked = [outs[e] for e in self.boundaries] if self.boundaries is not None else []
        return picked + [teacher.norm(outs[-1])]

    def loss(self, student: nn.Module, x: torch.Tensor, targets: list[torch.Tensor], step: int) -> tuple[torch.Tensor, dict[str, float]]:
        outs = block_outputs(student, x)
        preds = (outs[1:] if self.boundaries is not None else []) + [student.norm(outs[-1])]
        if len(preds) != len(targets):
            raise ValueError(f"student gives {len(preds)} supervised outputs, teacher {len(targets)}")
        weights = term_weights(step, self.alphas, len(preds))
        terms = [nn.functional.mse_loss(p, t) for p, t in zip(preds, targets)]
        loss = sum(w * t for w, t in zip(weights, terms))
        names = [f"b{j + 1}" for j in range(len(preds) - 1)] + ["final"]
        return loss, {n: float(t.detach()) for n, t in zip(names, terms)}


def steps_per_epoch(n_tiles: int, batch_size: int) -> int:
    return max(1, n_tiles // max(1, batch_size))


def batch_indices(step: int, *, n_tiles: int, batch_size: int, seed: int) -> np.ndarray:
    """Tile indices of the batch at ``step``: a seeded permutation per epoch, drop-last."""
    spe = steps_per_epoch(n_tiles, batch_size)
    epoch, i = divmod(int(step), spe)
    g = torch.Generator().manual_seed(step_seed(seed, 10_000_019 * (epoch + 1)))
    perm = torch.randperm(n_tiles, generator=g).numpy()
    b = min(batch_size, n_tiles)
    return np.sort(perm[i * b : (i + 1) * b])


class TargetCache:
    """Teacher targets of every fit tile, computed once in a fixed order (so the values do
    not depend on when a run was resumed), kept in memory."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors

    @classmethod
    def build(cls, teacher: nn.Module, tiles: np.ndarray, *, transform: Transform, objective: Objective, device: str, chunk: int) -> "TargetCache":
        parts: list[list[torch.Tensor]] = []
        with torch.no_grad():
            for i in range(0, len(tiles), chunk):
                x = tiles_to_batch(transform, tiles[i : i + chunk], device)
                parts.append([t.float().cpu() for t in objective.targets(teacher, x)])
        return cls([torch.cat(list(col)) for col in zip(*parts)])

    def get(self, idx: np.ndarray, device: str) -> list[torch.Tensor]:
        index = torch.from_numpy(idx)
        return [t.index_select(0, index).to(device) for t in self.tensors]


def _estimate_target_bytes(teacher: nn.Module, tiles: np.ndarray, transform: Transform, objective: Objective, device: str) -> int:
    with torch.no_grad():
        probe = objective.targets(teacher, tiles_to_batch(transform, tiles[:1], device))
    return sum(t.numel() * 4 for t in probe) * len(tiles)


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def _fingerprint(options: DistillOptions, n_tiles: int, total: int) -> dict[str, Any]:
    # What must match for a checkpoint to continue this very run.
    return {"total_steps": total, "batch_size": options.batch_size, "seed": options.seed, "n_tiles": n_tiles,
            "lr": options.lr, "augment": options.augment}


def save_checkpoint(path: Path, *, student: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, step: int,
                    fingerprint: dict[str, Any], history: list[dict[str, float]]) -> None:
    state = {"format": CHECKPOINT_FORMAT, "step": step, "fingerprint": fingerprint, "student": student.state_dict(),
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": _rng_state(), "history": history}
    with atomic_output(path) as tmp:
        torch.save(state, tmp)


def _load_checkpoint(path: Path, fingerprint: dict[str, Any]) -> dict[str, Any]:
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise PathtwtError(f"{path}: not a pathtwt distillation checkpoint; delete it or choose another --out")
    if state["fingerprint"] != fingerprint:
        raise PathtwtError(
            f"{path}: checkpoint of a different run ({state['fingerprint']} vs {fingerprint}); delete it to start over"
        )
    return state


class _StopRequest:
    signum: int | None = None


@contextlib.contextmanager
def _stop_at_step_end() -> Iterator[_StopRequest]:
    """SIGINT (Ctrl-C) and SIGTERM (sent by SLURM before a kill) ask the loop to stop at
    the end of the current step and checkpoint there, so a saved state is never half an
    optimiser update. A second signal acts as usual (the handler restores the previous one)."""
    request = _StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request  # signals are only delivered to the main thread
        return
    previous: dict[int, Any] = {}

    def handler(signum: int, frame: Any) -> None:
        request.signum = signum
        signal.signal(signum, previous[signum])

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield request
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def distill(
    student: nn.Module,
    teacher: nn.Module,
    tiles: np.ndarray,
    *,
    transform: Transform,
    objective: Objective,
    options: DistillOptions,
    description: str = "distill",
) -> DistillResult:
    """Train ``student`` (in place) to match ``teacher`` under ``objective``; see module doc."""
    from tqdm.auto import tqdm

    if len(tiles) == 0:
        raise PathtwtError("no calibration tiles to distill on; check --calibration")
    device = options.device
    n_tiles = len(tiles)
    total = options.resolved_steps(n_tiles)
    teacher.eval().requires_grad_(False).to(device)
    student.to(device).train()
    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=options.lr, weight_decay=options.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_lr_factor(s, total, options.warmup_steps))
    fingerprint = _fingerprint(options, n_tiles, total)
    history: list[dict[str, float]] = []
    start = 0
    ckpt = Path(options.checkpoint) if options.checkpoint is not None else None
    if ckpt is not None and ckpt.exists():
        state = _load_checkpoint(ckpt, fingerprint)
        student.load_state_dict(state["student"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        _set_rng_state(state["rng"])
        start, history = int(state["step"]), list(state["history"])

    augmenter = TileAugmenter() if options.augment else None
    cache = None
    if augmenter is None and start < total:
        if _estimate_target_bytes(teacher, tiles, transform, objective, device) <= options.cache_limit_bytes:
            cache = TargetCache.build(teacher, tiles, transform=transform, objective=objective, device=device,
                                      chunk=options.batch_size)

    end = total if options.stop_after is None else min(total, max(start, int(options.stop_after)))
    step, saved_at = start, start
    bar = tqdm(total=total, initial=start, desc=description, disable=not options.progress, leave=False)

    def checkpoint_now() -> None:
        nonlocal saved_at
        if ckpt is not None and saved_at != step:
            save_checkpoint(ckpt, student=student, optimizer=optimizer, scheduler=scheduler, step=step,
                            fingerprint=fingerprint, history=history)
            saved_at = step

    with _stop_at_step_end() as stop:
        try:
            while step < end:
                idx = batch_indices(step, n_tiles=n_tiles, batch_size=options.batch_size, seed=options.seed)
                batch = tiles[idx]
                if augmenter is not None:
                    batch = augmenter(batch, seed=step_seed(options.seed, step))
                x = tiles_to_batch(transform, batch, device)
                if cache is not None:
                    targets = cache.get(idx, device)
                else:
                    with torch.no_grad():
                        targets = objective.targets(teacher, x)
                loss, terms = objective.loss(student, x, targets, step)
                if not torch.isfinite(loss):
                    raise NumericsError(f"{description}: loss became {float(loss)} at step {step}; lower --lr or check the calibration tiles")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if options.grad_clip and options.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(params, options.grad_clip)
                optimizer.step()
                scheduler.step()
                step += 1
                history.append({"step": step, "loss": float(loss.detach()), **terms})
                bar.update(1)
                bar.set_postfix({k: f"{v:.3g}" for k, v in history[-1].items() if k != "step"}, refresh=False)
                if ckpt is not None and options.checkpoint_every > 0 and step % options.checkpoint_every == 0:
                    checkpoint_now()
                if stop.signum is not None:
                    checkpoint_now()  # an interrupted run keeps its progress
                    raise KeyboardInterrupt(f"stopped by signal {stop.signum} after step {step}")
        finally:
            bar.close()
    checkpoint_now()
    student.eval()
    return DistillResult(steps_done=step, total_steps=total, completed=step >= total, resumed_from=start, history=history)


def options_dict(options: DistillOptions) -> dict[str, Any]:
    """JSON-friendly copy of the options (for provenance)."""
    out = asdict(options)
    out["checkpoint"] = None if options.checkpoint is None else str(options.checkpoint)
    return out
