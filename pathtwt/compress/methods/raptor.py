"""Raptor (block-recurrent ViT): one shared layer per discovered block [s_j, e_j], applied
k_j = e_j - s_j + 1 times, so the model keeps the teacher's depth and MACs while storing
about TWT's parameters (one layer per block).

Stage 1 trains each block's shared layer alone from the teacher's block input h_{s-1}:
the loss mixes the teacher-forced one-step loss (mean over i of MSE(f(h_{i-1}), h_i)) with
the autoregressive rollout loss (z_0 = h_{s-1}, z_i = f(z_{i-1}), mean of MSE(z_i, h_i));
the rollout weight p rises linearly from 0 to 1 over the first ``rollout_ramp`` (default
0.25) of stage 1, then stays 1. All blocks train at once, each from teacher inputs, so
this is the same as training them one by one. Stage 2 trains the whole recurrent model
end to end with a loss at every layer (TWT's deep supervision, every layer a boundary).
Stage 1 takes ``stage1_fraction`` (default 0.3) of the method's budget, stage 2 the rest.
Each shared layer starts as the teacher's first layer of its block.

Per-block parameters, as in the Raptor code (its ``Block`` with ``t_scale``): each shared
layer carries a small MLP g of its layer number t (1 -> 16 -> 3D: 16 + 16 + 16 x 3D + 3D =
39,200 parameters at D = 768) that scales the attention branch, the MLP branch and the
block output, ``(s1, s2, s3) = 1 + g(t)``, so the same weights can act differently at each
depth. g starts at zero (the plain shared layer). On H0-mini this gives the paper's
36.30 M (5 blocks) and 29.17 M (4 blocks); ``--option time_scale=false`` leaves it out
(then 36.11 M / 29.02 M, the TWT count).

Export: a timm ViT of the teacher's depth whose layers within a block hold identical
tensors (the shared layer really runs k_j times, and the MAC counter walks every layer),
with the ``layer_time_scale`` patch adding each layer's g as ``blocks.{i}.t_proj.*``.
``model.json`` records ``shared_blocks``, the parameters counted once, and the
``tied_blocks`` patch that ties the layers again on load, so the reloaded model counts each
shared layer once too. timm alone loads the file with ``strict=False`` (the ``t_proj``
keys are the only unexpected ones) and then runs the shared layers without their
layer-dependent scales; with ``time_scale=false`` the file is a plain timm ViT
(``strict=True``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import nn

from pathtwt.compress.method_options import method_option
from pathtwt.compress.methods.common import seeded, side_run_options, untied_copy, variant_name
from pathtwt.compress.pipeline import CompressOptions, distill_student, export_variant, report_fidelity, total_steps
from pathtwt.models.variant_layers import add_layer_time_scale, tie_blocks

if TYPE_CHECKING:
    from pathtwt.compress.calibration import CalibrationSet
    from pathtwt.models.registry import Backbone

Blocks = Sequence[Sequence[int]]


class BlockwiseRollout:
    """Stage 1's objective: every block's shared layer against the teacher's layer outputs
    inside that block, teacher-forced and rolled out, mixed by the step. Only the blocks
    are trained: the embeddings and the final norm get no gradient."""

    leaves_parameters_unused = True  # DistributedDataParallel looks for them each step

    def __init__(self, blocks: Blocks, ramp_steps: int) -> None:
        self.blocks = [(int(s), int(e)) for s, e in blocks]
        self.ramp_steps = max(1, int(ramp_steps))

    def targets(self, teacher: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
        from pathtwt.compress.student import block_outputs

        return block_outputs(teacher, x)  # [h_0, ..., h_L]

    def rollout_weight(self, step: int) -> float:
        return min(1.0, step / self.ramp_steps)

    def loss(self, student: nn.Module, x: torch.Tensor, targets: list[torch.Tensor], step: int) -> tuple[torch.Tensor, dict[str, float]]:
        mse = nn.functional.mse_loss
        p = self.rollout_weight(step)
        total, forced_sum, rolled_sum = 0.0, 0.0, 0.0
        for s, e in self.blocks:
            # layer i is the block's shared module (run at layer number i when conditioned)
            forced = sum(mse(student.blocks[i - 1](targets[i - 1]), targets[i]) for i in range(s, e + 1)) / (e - s + 1)
            z, rolled = targets[s - 1], 0.0
            for i in range(s, e + 1):
                z = student.blocks[i - 1](z)
                rolled = rolled + mse(z, targets[i])
            rolled = rolled / (e - s + 1)
            total = total + (1 - p) * forced + p * rolled
            # float64 tensors (the sums Python floats would give), read by the loop once a step
            forced_sum = forced_sum + forced.detach().double()
            rolled_sum = rolled_sum + rolled.detach().double()
        return total, {"forced": forced_sum, "rollout": rolled_sum, "rollout_weight": p}


def build_recurrent_student(teacher: Backbone, blocks: Blocks, time_scale: bool = True) -> nn.Module:
    """The teacher's depth, layers s..e of each block one shared module (initialised as the
    teacher's layer s), conditioned on the layer number unless ``time_scale`` is False."""
    from pathtwt.compress.methods.truncation import truncated_student

    student = truncated_student(teacher, len(teacher.model.blocks))
    if time_scale:
        add_layer_time_scale(student)
        device = next(student.parameters()).device
        student.blocks.to(device)
    return tie_blocks(student, blocks)


def compress(teacher: Backbone, calib: CalibrationSet, options: CompressOptions) -> Path | None:
    """Registry entry (``--method raptor``): plan, stage 1, stage 2, export."""
    from pathtwt.compress.distill import DeepSupervision, distill
    from pathtwt.models.flops import count_params
    from pathtwt.compress.pipeline import resolve_plan

    plan = resolve_plan(teacher, calib, options)
    blocks = [[int(s), int(e)] for s, e in plan["blocks"]]
    num_layers = len(teacher.model.blocks)
    time_scale = bool(method_option(options.extra, "time_scale"))
    with seeded(options.distill.seed):  # the time scales' hidden layer
        student = build_recurrent_student(teacher, blocks, time_scale)
    every_layer = list(range(1, num_layers + 1))
    initial = report_fidelity(student, teacher, calib, options, every_layer)  # each block's first layer, recurrent
    total = total_steps(options, calib)
    stage1 = int(round(float(method_option(options.extra, "stage1_fraction")) * total))
    ramp = int(float(method_option(options.extra, "rollout_ramp")) * stage1)
    # a stage-2 checkpoint already holds what stage 1 produced, so a resumed run skips it
    if stage1 > 0 and not options.checkpoint_path().exists():
        distill(student, teacher.model, calib.training_tiles(), transform=teacher.transform, objective=BlockwiseRollout(blocks, ramp),
                options=side_run_options(options, steps=stage1), description="raptor stage 1")
    run = distill_student(student, teacher, calib, options, steps=total - stage1, description="raptor stage 2",
                          objective=DeepSupervision(boundaries=list(range(1, num_layers + 1))))
    if not run.completed:
        return None
    params = count_params(student)  # tied: each shared layer once
    multi = [b for b in blocks if b[1] > b[0]]
    patches: dict[str, Any] = {"layer_time_scale": True} if time_scale else {}
    if multi:
        patches["tied_blocks"] = multi
    return export_variant(
        untied_copy(student), teacher, calib, options, method="raptor", run=run, initial=initial, earlier_steps=stage1,
        layer_patches=patches or None, selection_split=None, boundaries=every_layer,
        name=variant_name(teacher, "raptor", len(blocks)), params=int(params),
        extra={"plan": plan, "shared_blocks": blocks, "recurrence": [e - s + 1 for s, e in blocks], "layer_time_scale": time_scale,
               "stages": {"stage1_steps": stage1, "rollout_ramp_steps": ramp, "stage2_steps": total - stage1}},
    )
