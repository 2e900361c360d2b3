"""NOSE-style attention removal: selected layers lose their attention branch.

Form: in an attention-free layer the attention branch is replaced by the identity of the
residual stream, so the layer computes ``x = 2x; x = x + ls2(mlp(norm2(x)))``, the issue's
``x = 2x + MLP(LN(x))`` (LayerNorm makes LN(2x) = LN(x) up to its epsilon); exported as
``layer_patches: {"attention_free": [...]}`` (0-based block indices,
:mod:`pathtwt.models.layer_patches`).

Selection (the documented criterion): each layer's attention is removed alone from the
teacher and the embedding R^2 to the unmodified teacher is measured on the select tiles
(never the report tiles); the L - K layers whose removal changes the final embedding
least lose their attention. So
``--depth K`` is the number of layers that keep attention; the model keeps all L layers.

Distillation: the whole model is trained against the teacher with a loss at every layer
(TWT's deep-supervision loss with every layer a boundary). During the first
``dilute_fraction`` (default 0.3) of the budget the selected layers' attention branch is
diluted, ``(1 - a) attn_branch(x) + a x`` with ``a = t / T_dilute``; afterwards it is gone.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Sequence

import torch

from pathtwt.errors import ConfigError
from pathtwt.compress.methods.common import distill_main, drop_checkpoint, export_with_fidelity, fit_steps, report_fidelity, select_r2, variant_name
from pathtwt.models.variant_layers import DilutedAttentionBlock


def attention_removal_costs(teacher: Any, calib: Any, options: Any) -> list[float]:
    """Per layer: 1 - select-split embedding R^2 when only that layer's attention is removed."""
    probe = copy.deepcopy(teacher.model)
    costs = []
    for i, block in enumerate(list(probe.blocks)):
        probe.blocks[i] = make_attention_free_copy(block)
        costs.append(1.0 - select_r2(probe, teacher, calib, options))
        probe.blocks[i] = block
    return costs


def make_attention_free_copy(block: torch.nn.Module) -> torch.nn.Module:
    from pathtwt.models.layer_patches import make_attention_free

    block = copy.deepcopy(block)
    make_attention_free(block)
    return block


def select_attention_free(costs: Sequence[float], keep_attention: int) -> list[int]:
    """The ``L - keep_attention`` layers (0-based, sorted) with the smallest removal cost."""
    order = sorted(range(len(costs)), key=lambda i: (costs[i], i))
    return sorted(order[: len(costs) - keep_attention])


class DilutedDeepSupervision:
    """TWT's deep supervision at every layer, moving the dilution coefficient each step."""

    def __init__(self, blocks: Sequence[DilutedAttentionBlock], dilute_steps: int, num_layers: int) -> None:
        from pathtwt.compress.distill import DeepSupervision

        self.blocks, self.dilute_steps = list(blocks), max(1, int(dilute_steps))
        self.inner = DeepSupervision(boundaries=list(range(1, num_layers + 1)))

    def targets(self, teacher: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
        return self.inner.targets(teacher, x)

    def loss(self, student: torch.nn.Module, x: torch.Tensor, targets: list[torch.Tensor], step: int) -> tuple[torch.Tensor, dict[str, float]]:
        a = min(1.0, step / self.dilute_steps)
        for b in self.blocks:
            b.alpha.fill_(a)
        loss, terms = self.inner.loss(student, x, targets, step)
        return loss, {**terms, "dilution": a}


def finish_attention_free(student: torch.nn.Module, chosen: Sequence[int]) -> torch.nn.Module:
    """Replace each diluted wrapper by its block in the exported attention-free form."""
    from pathtwt.models.layer_patches import make_attention_free

    for i in chosen:
        wrapper = student.blocks[i]
        block = wrapper.block if isinstance(wrapper, DilutedAttentionBlock) else wrapper
        make_attention_free(block)
        student.blocks[i] = block
    return student


def compress(teacher: Any, calib: Any, options: Any) -> Path | None:
    """Registry entry (``--method nose``): select, dilute, distill, export."""
    from pathtwt.compress.methods.truncation import truncated_student

    num_layers = len(teacher.model.blocks)
    if options.depth is None or not 0 <= options.depth < num_layers:
        raise ConfigError(f"--method nose needs --depth K, the layers that keep attention (0 <= K < {num_layers})")
    costs = attention_removal_costs(teacher, calib, options)
    chosen = select_attention_free(costs, int(options.depth))
    student = truncated_student(teacher, num_layers)  # a trainable copy of the whole teacher
    diluted = [DilutedAttentionBlock(student.blocks[i]) for i in chosen]
    for i, b in zip(chosen, diluted):
        student.blocks[i] = b
    for b in diluted:  # the starting point: attention already removed, nothing trained yet
        b.alpha.fill_(1.0)
    every_layer = list(range(1, num_layers + 1))
    initial = report_fidelity(student, teacher, calib, options, every_layer)
    for b in diluted:
        b.alpha.fill_(0.0)
    dilute_steps = int(float(options.extra.get("dilute_fraction", 0.3)) * fit_steps(options, len(calib.fit)))
    result = distill_main(student, teacher=teacher, calib=calib, options=options, description="nose",
                          objective=DilutedDeepSupervision(diluted, dilute_steps, num_layers))
    if not result.completed:
        return None
    finish_attention_free(student, chosen)
    out = export_with_fidelity(
        student, teacher=teacher, calib=calib, options=options, method="nose", initial=initial, layer_patches={"attention_free": chosen},
        boundaries=every_layer,
        extra={"name": variant_name(teacher, "nose", int(options.depth)), "attention_layers": int(options.depth), "attention_free_layers": [i + 1 for i in chosen],
               "criterion": "1 - embedding R^2 on the select split with only that layer's attention removed",
               "selection_split": "select",
               "removal_costs": [round(c, 6) for c in costs], "dilute_steps": dilute_steps,
               "distillation": {"steps": result.total_steps, "resumed_from": result.resumed_from}},
    )
    drop_checkpoint(options)
    return out
