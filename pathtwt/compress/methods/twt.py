"""Transformer-Within-Transformer: each block of the merge plan becomes ONE layer.

plan (discovery or ``plan.json``) -> auditioned surrogate per block -> K-layer student
(teacher's embeddings and final norm) -> deep-supervision distillation -> plain timm ViT.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pathtwt.compress.pipeline import CompressOptions, backbone_default, distill_and_export, resolve_plan, total_steps

if TYPE_CHECKING:
    from torch import nn

    from pathtwt.compress.calibration import CalibrationSet
    from pathtwt.models.registry import Backbone


def build_twt_student(teacher: Backbone, calib: CalibrationSet, plan: dict[str, Any],
                      options: CompressOptions) -> tuple[nn.Module, list[dict]]:
    """The stitched K-layer student and the audition report (empty for ``init="random"``)."""
    from pathtwt.models.registry import build_timm_model
    from pathtwt.compress.audition import AuditionOptions, audition
    from pathtwt.compress.method_options import method_option
    from pathtwt.compress.methods.common import seeded
    from pathtwt.compress.ranks import decide
    from pathtwt.compress.student import stitch_student
    from pathtwt.compress.teacher_cache import fit_layer_outputs, held_out_outputs

    spec, blocks = teacher.spec, plan["blocks"]
    if options.init == "random":
        # ablation: timm's own initialisation for the surrogates, everything else copied
        with seeded(options.distill.seed):
            layers, report = list(build_timm_model(spec, depth=len(blocks)).blocks), []
    elif options.init == "audition":
        aopts = AuditionOptions(steps=options.audition_steps, lr=method_option(options.extra, "audition_lr"),
                                # the audition's own fitting batch, at most its default
                                batch_size=min(options.distill.batch_size, AuditionOptions.batch_size),
                                seed=options.distill.seed, device=options.distill.device,
                                precision=options.distill.precision)
        # the teacher's outputs of the fit tiles it fits on and the select tiles it ranks on:
        # computed once per teacher and calibration set (teacher cache), shared with the fit
        # means and the other variants
        outputs = fit_layer_outputs(teacher, calib, n_tiles=aopts.max_fit_tiles)
        held = held_out_outputs(teacher, calib, "select", n_tiles=aopts.max_select_tiles)
        layers, report = audition(teacher.model, blocks, calib.fit, calib.choosing_tiles(), transform=teacher.transform,
                                  options=aopts, fit_outputs=outputs, select_outputs=held)
        # several ranks: rank 0's winners are the record, and its weights everyone's
        # (DistributedDataParallel starts every rank from rank 0's parameters)
        report = decide("the audition's winners", report)
    else:
        raise ValueError(f"unknown init {options.init!r}")
    return stitch_student(teacher.model, layers, spec=spec), report


def compress(teacher: Backbone, calib: CalibrationSet, options: CompressOptions) -> Path | None:
    """Registry entry (``--method twt``): plan, audition, stitch, distil, export."""
    from pathtwt.compress.distill import DeepSupervision
    from pathtwt.compress.schedule import default_alphas
    from pathtwt.compress.student import add_branch_scales

    plan = resolve_plan(teacher, calib, options)
    student, report = build_twt_student(teacher, calib, plan, options)
    use_schedule = backbone_default(options.schedule, teacher.spec)
    use_scalar = backbone_default(options.layer_scale, teacher.spec)
    if use_scalar:
        add_branch_scales(student)
    boundaries = [e for _, e in plan["blocks"]]
    alphas = default_alphas(len(boundaries) + 1, total_steps(options, calib)) if use_schedule else None
    return distill_and_export(
        teacher, calib, options, method="twt", student=student, objective=DeepSupervision(boundaries, alphas),
        boundaries=boundaries,
        # the audition picks each block's surrogate on the held-out tiles
        selection_split=calib.choosing_split() if options.init == "audition" else None,
        extra={"plan": plan, "init": options.init, "audition": report,
               "audition_winners": [r["winner"] for r in report],
               "schedule": {"enabled": use_schedule, "alphas": alphas}, "branch_scalars": use_scalar},
    )

