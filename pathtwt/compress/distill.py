"""The distillation loop shared by TWT and the comparison methods.

``distill(student, teacher, tiles, transform=..., objective=..., options=...)`` trains
``student`` against the frozen ``teacher`` on uint8 calibration tiles. What is matched is
the ``objective``: an object with ``targets(teacher, x) -> list[Tensor]`` (computed without
gradients) and ``loss(student, x, targets, step) -> (loss, {term: value})``, the per-step
hook through which every method plugs its own loss. :class:`DeepSupervision` is TWT's.

Tiles come from memory (the calibration set) or are streamed from the training cohort's
slides by DataLoader workers (:mod:`pathtwt.compress.training_tiles`, which also defines
the order: seeded per-epoch permutations across slides, the sampler state one position).
Budgets are optimiser steps or epochs over the training tiles; an optimiser step is
``accumulate`` micro-batches of ``batch_size`` tiles (global, split over the ranks of a
torch.distributed run). bf16 autocast is optional; master weights and optimiser state
stay float32, and the teacher's targets are computed under ``torch.inference_mode``.

On a GPU a step waits for the device once, to read the loss it logs: tiles, target
indices and augmentation parameters cross through pinned memory without waiting
(:mod:`pathtwt.compress.device_copies`), the target cache moves to the device after the
first step where it fits (:class:`pathtwt.compress.targets.TargetCache`), and the passes
around the steps run at a rank's micro-batch (:mod:`pathtwt.compress.side_passes`).

Exact resumption: the tiles of micro-batch m are a pure function of (seed, m), their
augmentation of (seed, position), the schedules are functions of the step, and
checkpoints hold the student, optimiser, LR scheduler, RNG states, sampler position and
step, as tensors and plain values only. A run killed at any point and rerun with the same
options, on any number of ranks, continues from its last checkpoint to the same numbers
as an uninterrupted run (on CPU; to float rounding of the gradient all-reduce across
different rank counts).
"""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from pathtwt.compress import ranks
from pathtwt.compress.bf16_step import first_step_precision
from pathtwt.compress.distill_options import BF16_LOSS_TOLERANCE, DistillOptions, Objective, Transform  # noqa: F401 - the loop's names
from pathtwt.compress.targets import TargetCache, target_source, teacher_targets
from pathtwt.models.bf16_guard import autocast as _autocast
from pathtwt.models.bf16_guard import bf16_attention, weights_cast_once
from pathtwt.errors import NumericsError, PathtwtError, first_line
from pathtwt.io.atomic import atomic_output
from pathtwt.compress.intermediates import tiles_to_batch
from pathtwt.compress.schedule import cosine_lr_factor, term_weights
from pathtwt.compress.side_passes import named_out_of_memory, rank_batch
from pathtwt.compress.stopping import stop_at_step_end
from pathtwt.compress.student import block_outputs

CHECKPOINT_FORMAT = "pathtwt-distill-checkpoint/1"
TRAINING_PRECISIONS = ("fp32", "bf16")  # what the loop trains in: bf16 as autocast over fp32 weights


@dataclass
class DistillResult:
    steps_done: int
    total_steps: int
    completed: bool
    resumed_from: int
    history: list[dict[str, float]] = field(default_factory=list)
    precision: str = "fp32"  # what the run trained in (bf16 asked for may have fallen back)
    bf16_check: dict[str, Any] | None = None  # the first-step comparison, when bf16 was asked for
    fp32_matmul: str = "ieee"  # "tf32" where the GPU computes fp32 matrix multiplies in TF32
    targets: dict[str, int] | None = None  # where the target cache sat (TargetCache.describe), when there was one


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
    # divisor of each term (K + 1 values, see term_variances); None: plain MSE
    term_scales: Sequence[float] | None = None

    def with_term_scales(self, scales: Sequence[float]) -> "DeepSupervision":
        return DeepSupervision(self.boundaries, self.alphas, [float(v) for v in scales])

    def targets(self, teacher: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
        return self.targets_from_outputs(teacher, block_outputs(teacher, x))

    def targets_from_outputs(self, teacher: nn.Module, outs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The targets from the teacher's layer outputs ``[h_0, ..., h_L]`` of the batch."""
        picked = [outs[e] for e in self.boundaries] if self.boundaries is not None else []
        return picked + [teacher.norm(outs[-1])]

    def loss(self, student: nn.Module, x: torch.Tensor, targets: list[torch.Tensor], step: int) -> tuple[torch.Tensor, dict[str, float]]:
        outs = block_outputs(student, x)
        preds = (outs[1:] if self.boundaries is not None else []) + [student.norm(outs[-1])]
        if len(preds) != len(targets):
            raise ValueError(f"student gives {len(preds)} supervised outputs, teacher {len(targets)}")
        weights = term_weights(step, self.alphas, len(preds))
        terms = [nn.functional.mse_loss(p, t) for p, t in zip(preds, targets)]
        if self.term_scales is not None:
            if len(self.term_scales) != len(terms):
                raise ValueError(f"{len(self.term_scales)} term scales for {len(terms)} loss terms")
            terms = [t / s for t, s in zip(terms, self.term_scales)]
        loss = sum(w * t for w, t in zip(weights, terms))
        names = [f"b{j + 1}" for j in range(len(preds) - 1)] + ["final"]
        return loss, {n: t.detach() for n, t in zip(names, terms)}  # tensors: the loop reads them once a step


LOSS_NORMS = ("none", "variance")
NORM_SAMPLE_TILES = 64  # first training tiles (index order) measuring the term variances


@torch.no_grad()
def term_variances(objective: Objective, teacher: nn.Module, batches: Iterable[torch.Tensor]) -> list[float]:
    """Per loss term, the variance of the teacher's target over the tiles of ``batches``
    (:func:`target_variances` of their fp32 targets)."""
    return target_variances(teacher_targets(objective, teacher, x, "fp32") for x in batches)


@torch.no_grad()
def target_variances(target_batches: Iterable[Sequence[torch.Tensor]]) -> list[float]:
    """Per loss term, the variance of the teacher's target over the tiles of the batches:
    mean over tokens and channels of the squared deviation from the per-position mean over
    tiles (the denominator of fidelity's block R^2, so a normalised term reads as
    1 - R^2); a single tile gives its mean squared value."""
    n, sums, squares = 0, [], []
    for batch in target_batches:
        targets = [t.double() for t in batch]
        sums = [t.sum(0) for t in targets] if not sums else [a + t.sum(0) for a, t in zip(sums, targets)]
        squares = [t.pow(2).sum(0) for t in targets] if not squares else [a + t.pow(2).sum(0) for a, t in zip(squares, targets)]
        n += len(targets[0])
    if n == 0:
        raise PathtwtError("no tiles to measure the loss normalisation on")
    out = []
    for s1, s2 in zip(sums, squares):
        var = s2 / n - (s1 / n).pow(2) if n > 1 else s2
        out.append(max(float(var.clamp_min(0).mean()), 1e-12))
    return out


def normalised_objective(objective: Objective, teacher: nn.Module, source: Any, transform: Transform,
                         options: DistillOptions, teacher_outputs: Sequence[torch.Tensor] | None = None) -> Objective:
    """``objective`` with its terms divided by their teacher variances (``loss_norm
    variance``), measured on the first tiles of ``source`` (index order, no augmentation),
    so a resumed run gets the same divisors. Objectives without per-term scales are
    returned unchanged. ``teacher_outputs``: see :func:`distill`."""
    if options.loss_norm not in LOSS_NORMS:
        raise PathtwtError(f"--loss-norm {options.loss_norm!r}: use one of {', '.join(LOSS_NORMS)}")
    if options.loss_norm == "none" or not hasattr(objective, "with_term_scales"):
        return objective
    n, chunk = min(len(source), NORM_SAMPLE_TILES), rank_batch(options.batch_size)
    with named_out_of_memory("the loss normalisation", chunk, skip="--loss-norm none (no normalisation)"):
        return _measured_scales(objective, teacher, source, transform, options.device, n, chunk, teacher_outputs)


def _measured_scales(objective: Objective, teacher: nn.Module, source: Any, transform: Transform, device: str, n: int,
                     chunk: int, teacher_outputs: Sequence[torch.Tensor] | None) -> Objective:
    if teacher_outputs is not None and len(teacher_outputs[0]) >= n and hasattr(objective, "targets_from_outputs"):
        # the same batches the forward pass below would run, already computed
        with torch.inference_mode():
            batches = [[t.to(torch.float32, copy=True) for t in
                        objective.targets_from_outputs(teacher, [o[i : min(n, i + chunk)].to(device) for o in teacher_outputs])]
                       for i in range(0, n, chunk)]
        return objective.with_term_scales(target_variances(batches))
    batches = (tiles_to_batch(transform, np.stack([source.read(j) for j in range(i, min(n, i + chunk))]), device)
               for i in range(0, n, chunk))
    return objective.with_term_scales(term_variances(objective, teacher, batches))


# Checkpoints hold only tensors and plain values (dicts, lists, numbers, strings) and are
# read with torch.load(weights_only=True), which refuses anything else: loading a file
# never runs code stored in it.

def _rng_state(cuda: list[torch.Tensor] | None = None) -> dict[str, Any]:
    """The RNG states a checkpoint keeps; ``cuda``: each rank's CUDA generator state
    (:func:`_cuda_rng_states`), absent where no rank uses CUDA."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": {"name": str(name), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "python": {"version": int(version), "internal": list(internal), "gauss": gauss},
            **({"cuda": cuda} if cuda else {})}


def _cuda_rng_states() -> list[torch.Tensor] | None:
    """The CUDA generator state of every rank's own GPU, in rank order (a collective when
    several ranks use CUDA, so every rank calls it at the same checkpoint); None where this
    process has not initialised CUDA (a CPU run never touches a GPU for it)."""
    if not torch.cuda.is_initialized():
        return None
    own = torch.cuda.get_rng_state(torch.cuda.current_device())
    if ranks.world_size() == 1:
        return [own]
    import torch.distributed as dist

    device = ranks.collective_device()
    gathered = [torch.empty_like(own, device=device) for _ in range(ranks.world_size())]
    ranks.entering_collective()
    dist.all_gather(gathered, own.to(device))
    return [g.cpu() for g in gathered]


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_initialized():
        # this rank's own GPU takes the state its rank saved (a run resumed on more ranks:
        # the saved ranks' states in turn); a run on the CPU leaves the GPUs alone
        torch.cuda.set_rng_state(cuda[ranks.rank() % len(cuda)], torch.cuda.current_device())
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))


def _fingerprint(options: DistillOptions, n_tiles: int, total: int) -> dict[str, Any]:
    # What must match for a checkpoint to continue this very run (the number of ranks need
    # not: the sampler state is a position in the global stream).
    return {"total_steps": total, "batch_size": options.batch_size, "accumulate": options.accumulate,
            "seed": options.seed, "n_tiles": n_tiles, "lr": options.lr, "augment": options.augment,
            # only when set, so checkpoints written before the option existed still resume
            **({"loss_norm": options.loss_norm} if options.loss_norm != "none" else {})}


def save_checkpoint(path: Path, *, student: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, step: int,
                    fingerprint: dict[str, Any], history: list[dict[str, float]], sampler: dict[str, int],
                    cuda_rng: list[torch.Tensor] | None = None) -> None:
    state = {"format": CHECKPOINT_FORMAT, "step": step, "fingerprint": fingerprint, "student": student.state_dict(),
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": _rng_state(cuda_rng),
             "sampler": sampler, "history": history}
    with atomic_output(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A distillation checkpoint's state, refusing (one line) any file that is not one or
    that holds pickled objects."""
    import pickle

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise PathtwtError(f"{path}: refused, the checkpoint holds pickled objects, not only tensors and plain values "
                           f"({first_line(exc)[:160]}); delete it to start over") from None
    except (OSError, RuntimeError, EOFError) as exc:
        raise PathtwtError(f"{path}: unreadable checkpoint ({first_line(exc)}); "
                           "delete it to start over") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise PathtwtError(f"{path}: not a pathtwt distillation checkpoint; delete it or choose another --out")
    return state


def _load_checkpoint(path: Path, fingerprint: dict[str, Any]) -> dict[str, Any]:
    state = load_checkpoint(path)
    if state["fingerprint"] != fingerprint:
        raise PathtwtError(
            f"{path}: checkpoint of a different run ({state['fingerprint']} vs {fingerprint}); delete it to start over"
        )
    return state


def _float64(value: torch.Tensor | float, device: str) -> torch.Tensor:
    """A loss or a logged term (a tensor, or a number from an objective that logs numbers)
    as a float64 tensor on the device (a number is written there by a fill, not copied)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64)
    return torch.full((), float(value), dtype=torch.float64, device=device)


def _as_source(tiles: Any) -> Any:
    from pathtwt.compress.training_tiles import ArrayTiles

    return ArrayTiles(tiles) if isinstance(tiles, np.ndarray) else tiles


class _StudentLoss(nn.Module):
    """The student and the objective's loss as one module, so DistributedDataParallel sees
    the forward pass it has to synchronise (the objective calls the student's blocks, not
    its forward)."""

    def __init__(self, student: nn.Module, objective: Objective) -> None:
        super().__init__()
        self.student = student
        self.objective = objective

    def forward(self, x: torch.Tensor, targets: list[torch.Tensor], step: int):
        return self.objective.loss(self.student, x, targets, step)


def distill(
    student: nn.Module,
    teacher: nn.Module,
    tiles: Any,
    *,
    transform: Transform,
    objective: Objective,
    options: DistillOptions,
    description: str = "distill",
    teacher_outputs: Sequence[torch.Tensor] | None = None,
) -> DistillResult:
    """Train ``student`` (in place) to match ``teacher`` under ``objective``; see module doc.

    ``tiles``: uint8 tiles in memory (N, P, P, 3) or a streamed source
    (:class:`pathtwt.compress.training_tiles.SlideTiles`). Run under torch.distributed,
    each rank trains on its slice of every global micro-batch (DistributedDataParallel)
    and only rank 0 writes the checkpoint. ``teacher_outputs``: the teacher's fp32 layer
    outputs ``[h_0, ..., h_L]`` of the first in-memory tiles
    (:func:`pathtwt.compress.teacher_cache.kept_fit_outputs`), which spare the loss
    normalisation its forward pass and, when they cover every tile, the target cache its
    pass too (fp32 targets then, whatever the training precision)."""
    from tqdm.auto import tqdm

    from pathtwt.compress.training_tiles import cv2_pool_stopped

    # setup, in this order (each step may draw from the RNGs the checkpoint restores)
    run = _set_up(student, teacher, tiles, transform, objective, options, teacher_outputs)
    train = _optimisation(student, options, run)
    cache = _loop_targets(teacher, tiles, transform, options, run, train.start)
    end = run.total if options.stop_after is None else min(run.total, max(train.start, int(options.stop_after)))
    model, items, batches = _feed(student, run, options, train.start, end)
    bar = tqdm(total=run.total, initial=train.start, desc=description, disable=not (options.progress and run.writer),
               leave=False)
    step = train.start
    with stop_at_step_end() as stop, cv2_pool_stopped(run.workers > 0), \
            bf16_attention([student, teacher], run.device, run.precision), _teacher_weights(teacher, run, cache is None):
        try:
            stream = iter(batches)
            while step < end:
                train.optimizer.zero_grad(set_to_none=True)
                loss_sum, term_sums = _accumulated_loss(model, stream, items, cache, teacher, run, step)
                names = sorted(term_sums)
                shared = _global_means(loss_sum, [term_sums[k] for k in names], stop.signum is not None)
                loss_value = shared[0]
                if not math.isfinite(loss_value):
                    raise NumericsError(f"{description}: loss became {loss_value} at step {step}; lower --lr or check the calibration tiles")
                if options.grad_clip and options.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(train.params, options.grad_clip)
                train.optimizer.step()
                train.scheduler.step()
                step += 1
                if cache is not None and step == train.start + 1:
                    cache.settle(run.device)  # now that the allocator holds a step's peak
                train.history.append({"step": step, "loss": loss_value, **dict(zip(names, shared[1:-1]))})
                bar.update(1)
                bar.set_postfix({k: f"{v:.3g}" for k, v in train.history[-1].items() if k != "step"}, refresh=False)
                if train.ckpt is not None and options.checkpoint_every > 0 and step % options.checkpoint_every == 0:
                    train.checkpoint(student, step, run, options)
                if shared[-1] > 0:
                    train.checkpoint(student, step, run, options)  # an interrupted run keeps its progress
                    # no rank leaves before rank 0's checkpoint is on disk: torchrun signals the
                    # ranks still running as soon as one has exited
                    ranks.barrier()
                    raise KeyboardInterrupt(f"stopped by signal {stop.signum or 'on another rank'} after step {step}")
            # the last checkpoint under the deferred stop too, so that it is written whole on
            # every rank; a stop that came meanwhile ends this rank now, and its notice the others
            train.checkpoint(student, step, run, options)
            if stop.pending():
                raise KeyboardInterrupt(f"stopped by signal {stop.signum} after step {step}")
        finally:
            bar.close()
    student.eval()
    return DistillResult(steps_done=step, total_steps=run.total, completed=step >= run.total, resumed_from=train.start,
                         history=train.history, precision=run.precision, bf16_check=run.bf16_check,
                         fp32_matmul=run.fp32_matmul, targets=None if cache is None else cache.describe())


@dataclass
class _Run:
    """What distillation settles before its first step: where, in what precision, over
    which tiles and ranks, and where the teacher's targets come from."""

    source: Any
    transform: Transform
    n_tiles: int
    device: str
    precision: str  # after the bf16 check
    fp32_matmul: str
    world: int
    writer: bool
    sharding: Any
    accumulate: int
    total: int  # optimiser steps of the whole run
    objective: Objective  # with its loss normalisation
    target_source: str  # one of TARGET_SOURCES
    shared_targets: "TargetCache | None"
    bf16_check: dict[str, Any] | None
    workers: int


def _set_up(student: nn.Module, teacher: nn.Module, tiles: Any, transform: Transform, objective: Objective,
            options: DistillOptions, teacher_outputs: Sequence[torch.Tensor] | None) -> _Run:
    from pathtwt.compress import ranks
    from pathtwt.compress.training_tiles import Sharding
    from pathtwt.models.precision import choose_fp32_matmul

    source = _as_source(tiles)
    n_tiles = len(source)
    if n_tiles == 0:
        raise PathtwtError("no calibration tiles to distill on; check --calibration")
    device = options.device
    precision = options.precision  # resolved where the run starts (cli/compress.py), never here again
    if precision not in TRAINING_PRECISIONS:
        raise PathtwtError(f"DistillOptions.precision {precision!r}: give the resolved precision, one of "
                           f"{', '.join(TRAINING_PRECISIONS)} (pathtwt.models.precision.resolve_precision decides auto)")
    fp32_matmul = choose_fp32_matmul(device)
    world = ranks.world_size()
    sharding = Sharding(batch=int(options.batch_size), world=world, rank=ranks.rank())
    teacher.eval().requires_grad_(False).to(device)
    objective = normalised_objective(objective, teacher, source, transform, options,
                                     teacher_outputs if isinstance(tiles, np.ndarray) else None)
    student.to(device).train()
    source_of_targets = target_source(teacher, tiles, transform, objective, options, teacher_outputs)
    # the teacher's shared fp32 outputs give the targets (no forward pass, the same whatever
    # the precision), so the bf16 check compares only the student's side, as the loop will
    shared_targets = None
    if source_of_targets == "shared outputs":
        shared_targets = TargetCache.from_outputs(teacher, teacher_outputs, objective=objective, n_tiles=n_tiles,
                                                  device=device, chunk=rank_batch(options.batch_size))
    bf16_check = None
    if precision == "bf16":
        with bf16_attention([student, teacher], device, precision):
            bf16_check = first_step_precision(student, teacher, source, transform, objective, options, shared_targets)
        precision = bf16_check["precision"]
    return _Run(source=source, transform=transform, n_tiles=n_tiles, device=device, precision=precision, fp32_matmul=fp32_matmul,
                world=world, writer=ranks.is_writer(), sharding=sharding, accumulate=max(1, int(options.accumulate)),
                total=options.resolved_steps(n_tiles), objective=objective, target_source=source_of_targets,
                shared_targets=shared_targets, bf16_check=bf16_check, workers=max(0, int(options.workers)))


@dataclass
class _Optimisation:
    """The optimiser, its schedule and the run's history, resumed from the checkpoint
    where one of this very run exists."""

    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    fingerprint: dict[str, Any]
    ckpt: Path | None
    start: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    saved_at: int = 0

    def checkpoint(self, student: nn.Module, step: int, run: _Run, options: DistillOptions) -> None:
        """Save the state after ``step`` (rank 0 writes; every rank calls it, at the same
        steps), unless that step is saved already."""
        if self.ckpt is not None and self.saved_at != step:
            cuda = _cuda_rng_states()
            if run.writer:
                save_checkpoint(self.ckpt, student=student, optimizer=self.optimizer, scheduler=self.scheduler, step=step,
                                fingerprint=self.fingerprint, history=self.history,
                                sampler={"position": step * run.accumulate * run.sharding.batch, "seed": options.seed,
                                         "n_tiles": run.n_tiles}, cuda_rng=cuda)
        self.saved_at = step


def _optimisation(student: nn.Module, options: DistillOptions, run: _Run) -> _Optimisation:
    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=options.lr, weight_decay=options.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                  lambda s: cosine_lr_factor(s, run.total, options.warmup_steps))
    ckpt = Path(options.checkpoint) if options.checkpoint is not None else None
    train = _Optimisation(params, optimizer, scheduler, _fingerprint(options, run.n_tiles, run.total), ckpt)
    if ckpt is not None and ckpt.exists():
        state = _load_checkpoint(ckpt, train.fingerprint)
        student.load_state_dict(state["student"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        _set_rng_state(state["rng"])
        train.start, train.history = int(state["step"]), list(state["history"])
        expected = train.start * run.accumulate * run.sharding.batch
        if int(state.get("sampler", {}).get("position", expected)) != expected:
            raise PathtwtError(f"{ckpt}: sampler position {state['sampler']} does not match step {train.start}; delete it to start over")
    if ckpt is not None:
        # each rank reads the checkpoint itself: one that sees another file (a node-local --out) would run other steps
        ranks.agree("the step distillation resumes from", train.start,
                    f"put the checkpoint ({ckpt}) where every rank reads the same file")
    train.saved_at = train.start
    return train


def _loop_targets(teacher: nn.Module, tiles: Any, transform: Transform, options: DistillOptions, run: _Run,
                  start: int) -> "TargetCache | None":
    """The targets the loop reads: the shared outputs', the target cache built now (in the
    precision the bf16 check has just settled), or None (a teacher pass per step)."""
    if run.target_source == "target cache" and start < run.total:
        with bf16_attention([teacher], run.device, run.precision), _teacher_weights(teacher, run):
            return TargetCache.build(teacher, tiles, transform=transform, objective=run.objective, device=run.device,
                                     chunk=rank_batch(options.batch_size), precision=run.precision)
    return run.shared_targets


def _teacher_weights(teacher: nn.Module, run: _Run, used: bool = True) -> Any:
    """Within the block, when the teacher computes targets under bf16 autocast, its linear
    and convolution weights are bf16 copies made once (autocast would cast them again at
    every forward pass, a kernel per weight per micro-batch; the targets are the same bit
    for bit: :func:`pathtwt.models.bf16_guard.weights_cast_once`)."""
    return weights_cast_once(teacher) if used and run.precision == "bf16" else contextlib.nullcontext()


def _feed(student: nn.Module, run: _Run, options: DistillOptions, start: int, end: int):
    """The model the loop calls (the student and its loss; under DDP with several ranks),
    the training items and this rank's micro-batches from ``start`` to ``end``."""
    from pathtwt.compress.training_tiles import EpochOrder, MicroBatches, TrainingItems, loader

    model: nn.Module = _StudentLoss(student, run.objective)
    if run.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [torch.device(run.device).index] if run.device.startswith("cuda") else None
        model = DistributedDataParallel(model, device_ids=device_ids,
                                        find_unused_parameters=finds_unused_parameters(run.objective))
    items = TrainingItems(run.source, run.transform, augment=options.augment, seed=options.seed)
    order = EpochOrder(run.n_tiles, options.seed)
    batches = loader(items, MicroBatches(order, run.sharding, start * run.accumulate, end * run.accumulate),
                     workers=run.workers, pin_memory=run.device.startswith("cuda"))
    return model, items, batches


def finds_unused_parameters(objective: Objective) -> bool:
    """Whether DistributedDataParallel must look for parameters the step left unused: only
    for an objective that says it leaves some (``leaves_parameters_unused``: Raptor's
    block-wise stage, NOSE once diluted). They then keep no gradient, as in a single
    process, so AdamW treats them identically; for every other objective the search would
    cost a graph walk, an extra reduction and a device-to-host copy each step."""
    return bool(getattr(objective, "leaves_parameters_unused", False))


def _accumulated_loss(model: nn.Module, stream: Any, items: Any, cache: "TargetCache | None", teacher: nn.Module,
                      run: _Run, step: int) -> tuple[torch.Tensor | float, dict[str, torch.Tensor | float]]:
    """One optimiser step's ``accumulate`` micro-batches, forward and backward; the loss and
    its terms averaged over them, summed on the device in float64 (as Python floats would
    be) and read once a step: a float() per term would wait for the device at every
    micro-batch."""
    loss_sum, term_sums = 0.0, {}
    for micro in range(run.accumulate):
        positions, idx, tiles_u8, errors = next(stream)
        bad = next((i for i, e in enumerate(errors) if e), None)
        if bad is not None:
            raise items.failure(int(idx[bad]), errors[bad])
        x = items.to_model_input(positions, tiles_u8, run.device)
        targets = cache.get(idx, run.device) if cache is not None else \
            teacher_targets(run.objective, teacher, x, run.precision)
        sync = run.world == 1 or micro == run.accumulate - 1
        with (contextlib.nullcontext() if sync else model.no_sync()), _autocast(run.device, run.precision):
            loss, terms = model(x, targets, step)
            if sync and run.world > 1:
                ranks.entering_collective()  # the backward's gradient all-reduce
            (loss / run.accumulate).backward()
        loss_sum = loss_sum + _float64(loss, run.device) / run.accumulate
        for k, v in terms.items():
            term_sums[k] = term_sums.get(k, 0.0) + _float64(v, run.device) / run.accumulate
    return loss_sum, term_sums


def _global_means(loss_sum: torch.Tensor, terms: list[torch.Tensor], stopping: bool) -> list[float]:
    """One small all-reduce per step: the logged numbers are the global means, and a stop
    request seen by any rank (the last value) stops every rank at the same step. Its
    ``tolist`` is the step's one wait for the device (the stop flag is written there by a
    fill, not copied)."""
    from pathtwt.compress import ranks

    flag = torch.full((), 1.0 if stopping else 0.0, dtype=torch.float64, device=loss_sum.device)
    return ranks.all_mean(torch.stack([loss_sum, *terms, flag])).tolist()


def plan_summary(options: DistillOptions, n_tiles: int, *, world: int = 1) -> str:
    """The budget in words, printed before training starts."""
    total = options.resolved_steps(n_tiles)
    epochs = total * options.effective_batch / max(1, n_tiles)
    return (f"distillation: {n_tiles} training tiles, {total} optimiser steps of {options.effective_batch} tiles "
            f"({options.batch_size} x {options.accumulate} accumulated, {world} rank(s) x {options.batch_size // max(1, world)}) "
            f"= {epochs:.3g} epochs, precision {options.precision}")


def options_dict(options: DistillOptions) -> dict[str, Any]:
    """JSON-friendly copy of the options (for provenance)."""
    out = asdict(options)
    out["checkpoint"] = None if options.checkpoint is None else str(options.checkpoint)
    return out
