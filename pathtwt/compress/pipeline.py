"""What every compression method shares: its options, the distillation budget, the merge
plan, and the one build -> (distil) -> measure -> export route with one ``model.json``
schema (:data:`SHARED_KEYS`). A method contributes only what differs: its student, its
objective, its stages and its own keys (``extra``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pathtwt.compress.budgets import PAPER_BUDGETS
from pathtwt.compress.defaults import COMPRESS_DEFAULTS as D
from pathtwt.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from pathtwt.compress.calibration import CalibrationSet
    from pathtwt.compress.distill import DistillOptions, DistillResult, Objective
    from pathtwt.models.registry import Backbone
    from pathtwt.models.spec import BackboneSpec


@dataclass
class CompressOptions:
    """What a compression method is asked for: the merge goal, the method's own settings and
    the distillation it runs (``distill``: its own object, read as ``options.distill.steps``;
    nothing merges the two back). Built once where the run starts, from the defaults table
    :data:`pathtwt.compress.defaults.COMPRESS_DEFAULTS` and the command line, with the
    device and the precision already resolved; ``model.json`` records it (:meth:`to_dict`)."""

    out: Path
    distill: "DistillOptions" = field(default_factory=lambda: _distill_options_class()())
    depth: int | None = None  # exactly K blocks
    eps: float | None = None  # fewest blocks with discrepancy <= eps
    plan: Path | None = None  # a discovery plan.json (overrides depth/eps)
    tokens: str = D.tokens  # token mode of the similarity matrix when discovering here
    audition_steps: int = D.audition_steps
    schedule: bool | None = D.schedule  # None: the backbone's default (off for pathology models)
    layer_scale: bool | None = D.layer_scale  # None: the backbone's default (off for pathology models)
    init: str = D.init  # "audition" | "random" (ablation: random surrogate layers)
    keep_checkpoint: bool = False
    command: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # method-specific settings

    @classmethod
    def from_flat(cls, **settings: Any) -> "CompressOptions":
        """Options from one flat set of keywords, each to the dataclass that has the field
        (as model.json's "options" lists them)."""
        names = _distill_options_class().__dataclass_fields__
        distill = _distill_options_class()(**{k: v for k, v in settings.items() if k in names})
        return cls(distill=distill, **{k: v for k, v in settings.items() if k not in names})

    @property
    def forward_batch(self) -> int:
        """Tiles per forward pass of the measurements around the distillation (discovery,
        fidelity, auditioning, the methods' scoring): a rank's share of ``--batch-size``,
        the micro-batch whose memory the rank's device already holds
        (:func:`pathtwt.compress.side_passes.rank_batch`)."""
        from pathtwt.compress.side_passes import rank_batch

        return rank_batch(self.distill.batch_size)

    def checkpoint_path(self) -> Path:
        return Path(self.distill.checkpoint) if self.distill.checkpoint is not None else Path(self.out) / "checkpoint.pt"

    def to_dict(self) -> dict[str, Any]:
        """Flat, as model.json records the options: the method's settings and the distillation's
        (the ``_RECORDED`` keys, each read from the object that holds it)."""
        def value(key: str) -> Any:
            return getattr(self, key) if key in type(self).__dataclass_fields__ else getattr(self.distill, key)

        return {k: (str(v) if isinstance(v, Path) else v) for k, v in ((k, value(k)) for k in _RECORDED)}


# the keys of model.json's "options", in their order (its "distill" entry lists every distillation setting)
_RECORDED = ("out", "depth", "eps", "plan", "tokens", "steps", "epochs", "batch_size", "accumulate", "precision",
             "workers", "lr", "warmup_steps", "audition_steps", "schedule", "layer_scale", "augment", "loss_norm", "init",
             "seed", "device", "checkpoint", "checkpoint_every", "keep_checkpoint", "stop_after", "progress", "command",
             "extra")


def _distill_options_class():
    from pathtwt.compress.distill import DistillOptions  # torch: imported when options are built

    return DistillOptions


def distill_options(options: CompressOptions) -> "DistillOptions":
    """The distillation settings every method uses for the same budget, with the checkpoint
    file resolved."""
    return replace(options.distill, checkpoint=options.checkpoint_path())


def budget_record(method: str, options: CompressOptions, calib: "CalibrationSet", spec: "BackboneSpec", *,
                  trains: bool = True) -> dict[str, Any]:
    """What ``model.json`` says about the training budget: the run's own (steps or epochs as
    given, and the optimiser steps they came to on the tiles it trains on) beside Appendix
    B's for the method."""
    paper = PAPER_BUDGETS.get(method)
    if paper is not None and isinstance(paper.get("epochs"), dict):  # per backbone
        paper = {"epochs": paper["epochs"].get(spec.base_backbone or spec.name)}
    run: dict[str, Any] = {"steps": options.distill.steps, "epochs": options.distill.epochs}
    if trains:
        run["resolved_steps"] = total_steps(options, calib)
        run["unit"] = "steps" if options.distill.steps is not None else "epochs"
    else:
        run["resolved_steps"] = 0
        run["unit"] = None  # closed form or no training
    return {"run": run, "paper": paper}


def total_steps(options: CompressOptions, calib: "CalibrationSet") -> int:
    """The method's whole distillation budget in optimiser steps (``--steps``, or
    ``--epochs`` over the tiles it trains on)."""
    return distill_options(options).resolved_steps(len(calib.training_tiles()))


def backbone_default(option: bool | None, spec: "BackboneSpec") -> bool:
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


def resolve_plan(teacher: "Backbone", calib: "CalibrationSet", options: CompressOptions) -> dict[str, Any]:
    """The merge plan: ``options.plan`` if given, else discovery on the fit tiles for
    ``options.depth`` (exactly K blocks) or ``options.eps`` (fewest blocks); rank 0's
    when several ranks run (each discovers, :func:`pathtwt.compress.ranks.decide`)."""
    from pathtwt.compress.ranks import decide

    return decide("the merge plan", _own_plan(teacher, calib, options))


def _own_plan(teacher: "Backbone", calib: "CalibrationSet", options: CompressOptions) -> dict[str, Any]:
    num_layers = len(teacher.model.blocks)
    if options.plan is not None:
        return read_plan(options.plan, num_layers)
    if (options.depth is None) == (options.eps is None):
        raise ConfigError("give exactly one of --depth, --eps or --plan")
    if options.depth is not None and not 1 <= options.depth <= num_layers:
        raise ConfigError(f"--depth {options.depth}: must be between 1 and the backbone's {num_layers} layers")
    from pathtwt.compress.discovery import discover

    return discover(teacher, calib, depth=options.depth, eps=options.eps, tokens=options.tokens,
                    batch_size=options.forward_batch, device=options.distill.device).plan()


# the keys every model.json holds, whatever the method: the architecture (models.registry.
# variant_metadata), the export's own, and the route's records; a method adds its own keys
EXPORT_KEYS = ("name", "method", "params", "macs_per_tile", "weights_sha256", "teacher_weights_sha256",
               "layer_patches", "provenance")
ROUTE_KEYS = ("budget", "selection_split", "fidelity", "distillation")


def report_fidelity(student: "nn.Module", teacher: "Backbone", calib: "CalibrationSet", options: CompressOptions,
                    boundaries: list[int] | None = None) -> dict[str, Any]:
    """The fidelity record on the report tiles (fit tiles if the set holds none out)."""
    from pathtwt.compress.fidelity import measure

    return measure(student, teacher, calib, on="report", boundaries=boundaries, device=options.distill.device,
                   batch_size=options.forward_batch)


def distill_student(student: "nn.Module", teacher: "Backbone", calib: "CalibrationSet", options: CompressOptions, *,
                    objective: "Objective", description: str, steps: int | None = None) -> "DistillResult":
    """A method's main distillation on the tiles it trains on (checkpointed and resumable);
    ``steps`` overrides the budget (a later stage of a method that trains in stages). The
    result's ``completed`` is False when ``--stop-after`` ended it early."""
    import dataclasses

    from pathtwt.compress.distill import distill

    from pathtwt.compress.teacher_cache import kept_fit_outputs

    dopts = distill_options(options)
    if steps is not None:
        dopts = dataclasses.replace(dopts, steps=int(steps), epochs=None)
    # the teacher's outputs of the first fit tiles, when this job already has them
    # (auditioning read them): the loss normalisation and the targets of those tiles
    outputs = kept_fit_outputs(teacher, calib) if calib.training is None else None
    return distill(student, teacher.model, calib.training_tiles(), transform=teacher.transform, objective=objective,
                   options=dopts, description=description, teacher_outputs=outputs)


def distillation_record(run: "DistillResult | None", calib: "CalibrationSet", earlier_steps: int = 0) -> dict[str, Any]:
    """model.json's ``distillation``: the optimiser steps the whole run took (``earlier_steps``:
    those of stages before the main loop), where it resumed from, the last step's losses and
    the tiles it trained on (a method that does not train: the fit tiles it was fitted on)."""
    if run is None:
        return {"steps": int(earlier_steps), "resumed_from": None, "last": {},
                "training": {"source": "in-memory calibration fit tiles", "tiles": int(len(calib.fit))},
                "precision": None, "bf16_check": None}
    return {"steps": int(earlier_steps) + int(run.total_steps), "resumed_from": run.resumed_from,
            "last": run.history[-1] if run.history else {}, "training": calib.training_record(),
            # what the main loop trained in: bf16 asked for falls back to fp32 when its first
            # step's loss strays from fp32's (bf16_check)
            "precision": run.precision, "bf16_check": run.bf16_check,
            # recorded where fp32 matrix multiplies ran in TF32 (GPUs); absent: full fp32
            **({"fp32_matmul": run.fp32_matmul} if run.fp32_matmul != "ieee" else {})}


def export_variant(
    student: "nn.Module",
    teacher: "Backbone",
    calib: "CalibrationSet",
    options: CompressOptions,
    *,
    method: str,
    run: "DistillResult | None",
    extra: dict[str, Any],
    initial: dict[str, Any] | None = None,
    boundaries: list[int] | None = None,
    layer_patches: dict[str, Any] | None = None,
    selection_split: str | None = None,
    earlier_steps: int = 0,
    name: str | None = None,
    params: int | None = None,
) -> Path:
    """The one export of every method: fold any branch scalars, measure fidelity on the
    report split (with ``boundaries``, the teacher layer each student block matches, for the
    per-block R^2), and write the variant folder with the shared records.

    ``run`` is the main distillation's result (None: the method does not train, and the
    final numbers are also the initial ones unless ``initial`` is given); ``selection_split``
    names the split the method chose anything on (None: nothing); ``name`` and ``params``
    override the depth-derived name and the parameter count (shared layers counted once)."""
    from pathtwt.compress.distill import options_dict
    from pathtwt.compress.export import export_backbone
    from pathtwt.compress.fidelity import fidelity_record
    from pathtwt.compress.ranks import is_writer
    from pathtwt.compress.stopping import raise_if_stopped
    from pathtwt.compress.student import fold_branch_scales

    if not is_writer():
        return Path(options.out)  # rank 0 measures and writes
    raise_if_stopped()  # a stop that came after the loop's last step: the checkpoint holds that step
    clash = sorted(set(extra) & {*EXPORT_KEYS, *ROUTE_KEYS})
    if clash:
        raise ValueError(f"{method}: extra keys {clash} belong to the shared model.json schema")
    fold_branch_scales(student).eval()
    final = report_fidelity(student, teacher, calib, options, boundaries)
    records = {
        "budget": budget_record(method, options, calib, teacher.spec, trains=run is not None),
        "selection_split": selection_split,
        "fidelity": fidelity_record(teacher, calib, initial=final if initial is None else initial, final=final,
                                    device=options.distill.device, seed=options.distill.seed),
        "distillation": distillation_record(run, calib, earlier_steps),
    }
    out = export_backbone(
        options.out, student, teacher=teacher, method=method, layer_patches=layer_patches, name=name, params=params,
        calibration_sources=list(calib.sources),
        options={**options.to_dict(), "distill": options_dict(distill_options(options))},
        extra={**extra, **records},
    )
    if not options.keep_checkpoint:
        options.checkpoint_path().unlink(missing_ok=True)
    return out


def distill_and_export(
    teacher: "Backbone",
    calib: "CalibrationSet",
    options: CompressOptions,
    *,
    method: str,
    student: "nn.Module",
    objective: "Objective",
    boundaries: list[int] | None,
    extra: dict[str, Any],
    layer_patches: dict[str, Any] | None = None,
    selection_split: str | None = None,
) -> Path | None:
    """Measure ``student`` before, distil it with the shared budget, export it
    (:func:`export_variant`). None when ``--stop-after`` ended the run early."""
    initial = report_fidelity(student, teacher, calib, options, boundaries)
    run = distill_student(student, teacher, calib, options, objective=objective, description=f"{method}-{len(student.blocks)}")
    if not run.completed:
        return None
    return export_variant(student, teacher, calib, options, method=method, run=run, extra=extra, initial=initial,
                          boundaries=boundaries, layer_patches=layer_patches, selection_split=selection_split)
