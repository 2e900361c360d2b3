"""WDPruning-style depth pruning: keep the teacher's first K layers and add a probe, a
LayerNorm followed by a linear map on every token of layer K's output, trained (with the
kept layers) to match the teacher's final features (its normed last-layer tokens) under
the same distillation budget as every other method.

The probe starts as the teacher's final norm followed by the identity map, so step 0 is
plain truncation. In the export the probe takes the final norm's place
(``layer_patches: {"probe": true}``, see :mod:`.patches`), so ``forward_features`` - and
therefore the tile embedding - includes it. Its linear map is outside the blocks, where
the shared MAC counter does not look, so its T * D * D MACs are added here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pathtwt.errors import ConfigError
from pathtwt.models.variant_layers import ProbeNorm


@torch.no_grad()
def add_probe(student: torch.nn.Module) -> torch.nn.Module:
    """Replace the final norm (in place) by a probe initialised to that norm + identity."""
    old = student.norm
    probe = ProbeNorm(student.embed_dim, eps=getattr(old, "eps", 1e-6)).to(old.weight.device)
    probe.weight.copy_(old.weight)
    probe.bias.copy_(old.bias)
    probe.proj.weight.copy_(torch.eye(student.embed_dim))
    probe.proj.bias.zero_()
    student.norm = probe
    return student


def build_wdpruning_student(teacher: Any, depth: int) -> torch.nn.Module:
    from pathtwt.compress.methods.truncation import truncated_student

    return add_probe(truncated_student(teacher, depth))


def compress(teacher: Any, calib: Any, options: Any) -> Path | None:
    """Registry entry (``--method wdpruning``): first K layers + probe, distilled on the
    final features only, exported."""
    from pathtwt.compress.distill import DeepSupervision
    from pathtwt.models.flops import count_macs
    from pathtwt.compress.pipeline import distill_and_export

    num_layers = len(teacher.model.blocks)
    if options.depth is None or not 1 <= options.depth < num_layers:
        raise ConfigError(f"--method wdpruning needs --depth K with 1 <= K < {num_layers} (the layers kept)")
    depth = int(options.depth)
    student = build_wdpruning_student(teacher, depth)
    macs = count_macs(student)  # the probe's per-token linear map included
    # DeepSupervision(None): the only loss term is the probe's output against the teacher's
    # final features; the boundaries only say where fidelity is measured per block
    return distill_and_export(
        teacher, calib, options, method="wdpruning", student=student, objective=DeepSupervision(None),
        boundaries=list(range(1, depth + 1)),
        layer_patches={"probe": True},
        extra={"macs_per_tile": int(macs), "kept_layers": list(range(1, depth + 1)),
               "probe": "LayerNorm + Linear(D, D) on every token, in place of the final norm"},
    )
