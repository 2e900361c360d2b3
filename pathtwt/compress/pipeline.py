"""What every compression method shares: its options, the distillation budget, the merge
plan, and the distil -> fold -> measure -> export sequence."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pathtwt.errors import ConfigError

if TYPE_CHECKING:
    from pathtwt.compress.distill import DistillOptions


@dataclass
class CompressOptions:
    out: Path
    depth: int | None = None  # exactly K blocks
    eps: float | None = None  # fewest blocks with discrepancy <= eps
    plan: Path | None = None  # a discovery plan.json (overrides depth/eps)
    tokens: str = "all"  # token mode of the similarity matrix when discovering here
    steps: int | None = None  # distillation budget in optimiser steps ...
    epochs: float | None = None  # ... or in passes over the training tiles (default 1 epoch)
    batch_size: int = 32  # global micro-batch (split over the ranks)
    accumulate: int = 1  # micro-batches per optimiser step
    precision: str = "fp32"  # distillation autocast: fp32 | bf16
    workers: int = 0  # DataLoader workers reading the training tiles
    lr: float = 3e-4
    warmup_steps: int = 0
    audition_steps: int = 50
    schedule: bool | None = None  # None: the backbone's default (off for pathology models)
    layer_scale: bool | None = None  # None: the backbone's default (off for pathology models)
    augment: bool = True
    loss_norm: str = "variance"  # distillation loss terms: variance (each over its teacher variance) | none (plain MSE)
    init: str = "audition"  # "audition" | "random" (ablation: random surrogate layers)
    seed: int = 0
    device: str = "cpu"
    checkpoint: Path | None = None  # default: OUT/checkpoint.pt
    checkpoint_every: int = 100
    keep_checkpoint: bool = False
    stop_after: int | None = None
    progress: bool = True
    command: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # method-specific settings

    def checkpoint_path(self) -> Path:
        return Path(self.checkpoint) if self.checkpoint is not None else Path(self.out) / "checkpoint.pt"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


def distill_options(options: CompressOptions) -> "DistillOptions":
    """The distillation settings every method uses for the same budget."""
    from pathtwt.compress.distill import DistillOptions

    return DistillOptions(
        steps=options.steps, epochs=options.epochs, batch_size=options.batch_size, accumulate=options.accumulate,
        precision=options.precision, workers=options.workers, lr=options.lr, warmup_steps=options.warmup_steps, augment=options.augment,
        loss_norm=options.loss_norm, seed=options.seed, device=options.device,
        checkpoint=options.checkpoint_path(), checkpoint_every=options.checkpoint_every,
        stop_after=options.stop_after, progress=options.progress,
    )


def budget_record(method: str, options: CompressOptions, n_fit: int, spec: Any, *, trains: bool = True) -> dict[str, Any]:
    """What ``model.json`` says about the training budget: the run's own (steps or epochs as
    given, and the optimiser steps they came to) beside Appendix B's for the method."""
    from pathtwt.compress.registry import PAPER_BUDGETS

    paper = PAPER_BUDGETS.get(method)
    if paper is not None and isinstance(paper.get("epochs"), dict):  # per backbone
        paper = {"epochs": paper["epochs"].get(spec.base_backbone or spec.name)}
    run: dict[str, Any] = {"steps": options.steps, "epochs": options.epochs}
    if trains:
        run["resolved_steps"] = distill_options(options).resolved_steps(n_fit)
        run["unit"] = "steps" if options.steps is not None else "epochs"
    else:
        run["unit"] = None  # closed form or no training
    return {"run": run, "paper": paper}


def training_tiles(calib: Any) -> Any:
    """What distillation trains on: the streamed training cohort when one was attached to
    the calibration set (``calib.training``, see pathtwt compress --train-coords), else the
    in-memory fit tiles."""
    streamed = getattr(calib, "training", None)
    return calib.fit if streamed is None else streamed


def training_record(calib: Any) -> dict[str, Any]:
    """model.json's account of the training tiles: source, count, the slides held out."""
    streamed = getattr(calib, "training", None)
    if streamed is None:
        return {"source": "in-memory calibration fit tiles", "tiles": int(len(calib.fit))}
    return streamed.describe()


def backbone_default(option: bool | None, spec: Any) -> bool:
    """The paper's per-backbone default for the schedule and the scalar: off for pathology
    backbones, on for natural-image ones; an explicit option wins."""
    return (not bool(getattr(spec, "pathology", False))) if option is None else bool(option)


def read_plan(path: Path, num_layers: int) -> dict[str, Any]:
    """A discovery ``plan.json``, checked to cover layers 1..num_layers contiguously."""
    try:
        plan = json.loads(Path(path).read_text())
        blocks = [tuple(int(v) for v in b) for b in plan["blocks"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a readable discovery plan ({exc}); rerun pathtwt discover") from exc
    expected = 1
    for s, e in blocks:
        if s != expected or e < s:
            raise ConfigError(f"{path}: blocks {blocks} are not contiguous from layer 1; rerun pathtwt discover")
        expected = e + 1
    if expected != num_layers + 1:
        raise ConfigError(f"{path}: blocks cover layers 1..{expected - 1}, the backbone has {num_layers}; use this backbone's plan")
    plan["blocks"] = [list(b) for b in blocks]
    return plan


def resolve_plan(teacher: Any, calib: Any, options: CompressOptions) -> dict[str, Any]:
    """The merge plan: ``options.plan`` if given, else discovery on the fit tiles for
    ``options.depth`` (exactly K blocks) or ``options.eps`` (fewest blocks)."""
    num_layers = len(teacher.model.blocks)
    if options.plan is not None:
        return read_plan(options.plan, num_layers)
    if (options.depth is None) == (options.eps is None):
        raise ConfigError("give exactly one of --depth, --eps or --plan")
    if options.depth is not None and not 1 <= options.depth <= num_layers:
        raise ConfigError(f"--depth {options.depth}: must be between 1 and the backbone's {num_layers} layers")
    from pathtwt.compress.partition import default_eps_grid, eps_sweep, partition_exact_k, partition_min_blocks
    from pathtwt.compress.similarity import similarity_matrix

    S = similarity_matrix(teacher.model, teacher.transform, calib.fit, num_prefix_tokens=teacher.spec.num_prefix_tokens,
                          tokens=options.tokens, batch_size=options.batch_size, device=options.device)
    part = partition_exact_k(S, options.depth) if options.depth is not None else partition_min_blocks(S, options.eps)
    grid = default_eps_grid(S)
    return {"eps": options.eps, "depth": options.depth, "num_layers": num_layers, **part.to_dict(),
            "tokens": options.tokens, "eps_sweep": [[float(e), int(n)] for e, n in zip(grid, eps_sweep(S, grid))]}


def distill_and_export(
    teacher: Any,
    calib: Any,
    options: CompressOptions,
    *,
    method: str,
    student: Any,
    objective: Any,
    boundaries: list[int] | None,
    extra: dict[str, Any],
    layer_patches: dict[str, Any] | None = None,
    selection_split: str | None = None,
) -> Path | None:
    """Distill ``student`` with the shared budget, fold any branch scalars, measure fidelity
    on the report split before and after (with ``boundaries``: teacher layer matched by each
    student block, for the per-block R^2), and export. None when ``--stop-after`` ended the
    run early.
    ``selection_split`` names the split the method chose anything on (None: nothing)."""
    from pathtwt.compress.distill import distill, options_dict
    from pathtwt.compress.export import export_backbone
    from pathtwt.compress.fidelity import fidelity_record, measure
    from pathtwt.compress.student import fold_branch_scales

    def fidelity() -> dict[str, Any]:
        return measure(student, teacher, calib, on="report", boundaries=boundaries, device=options.device,
                       batch_size=options.batch_size)

    initial = fidelity()
    dopts = distill_options(options)
    result = distill(student, teacher.model, training_tiles(calib), transform=teacher.transform, objective=objective, options=dopts,
                     description=f"{method}-{len(student.blocks)}")
    if not result.completed:
        return None
    from pathtwt.compress.ranks import is_writer

    if not is_writer():
        return Path(options.out)  # rank 0 measures and writes
    fold_branch_scales(student)
    final = fidelity()
    last = result.history[-1] if result.history else {}
    out = export_backbone(
        options.out, student, teacher=teacher, method=method, layer_patches=layer_patches,
        calibration_sources=list(getattr(calib, "sources", [])),
        options={**options.to_dict(), "distill": options_dict(dopts)},
        extra={
            **extra,
            "budget": budget_record(method, options, len(training_tiles(calib)), teacher.spec),
            "selection_split": selection_split,
            "fidelity": fidelity_record(teacher, calib, initial=initial, final=final, device=options.device,
                                        batch_size=options.batch_size, seed=options.seed),
            "distillation": {"steps": result.total_steps, "resumed_from": result.resumed_from, "last": last,
                             "training": training_record(calib)},
        },
    )
    if not options.keep_checkpoint:
        options.checkpoint_path().unlink(missing_ok=True)
    return out
