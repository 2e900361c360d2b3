"""WDPruning-style depth pruning as the paper ran it: the inference extractor is the
teacher's first K layers (with its final norm) plus ONE probe on the pooled tile embedding
e = concat(CLS, mean patch), trained together with the kept layers on the final-feature
loss, MSE(probe(e_student), e_teacher) against the teacher's full-depth embedding.

The probe (:class:`~pathtwt.models.variant_layers.EmbeddingProbe`) is a residual two-layer
MLP 2D -> H -> 2D; with the default H = 2048 on ViT-B (2D = 1536) it holds
2 x 1536 x 2048 + 2048 + 1536 = 6,295,040 parameters and costs 6.29 M MACs per tile (it
sees one vector per tile, not every token), which is the paper's 42.40 M / 35.31 M for
5 / 4 layers of H0-mini. ``--option probe_hidden=H`` changes H. Its second layer starts at
zero, so step 0 is plain truncation.

Export: the blocks and the final norm are plain timm modules; the probe's tensors are
``embedding_probe.*`` in the same file (``layer_patches: {"embedding_probe": {"hidden":
H}}``). pathtwt rebuilds the whole extractor; timm alone loads the backbone part with
``strict=False`` (the probe keys are the only unexpected ones) and gives the K-layer
truncated backbone's tokens, to which a user applies ``e + fc2(gelu(fc1(e)))`` after pooling.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from pathtwt.compress.method_options import METHOD_OPTIONS, method_option
from pathtwt.compress.methods.common import seeded
from pathtwt.errors import ConfigError
from pathtwt.models.variant_layers import EmbeddingProbe

if TYPE_CHECKING:
    from pathtwt.compress.calibration import CalibrationSet
    from pathtwt.compress.pipeline import CompressOptions
    from pathtwt.models.registry import Backbone

DEFAULT_PROBE_HIDDEN = METHOD_OPTIONS["probe_hidden"].default  # 2048: the paper's 6.29 M-parameter probe on ViT-B


def add_embedding_probe(student: nn.Module, hidden: int) -> nn.Module:
    """Attach an identity-initialised probe on the pooled embedding (in place)."""
    device = next(student.parameters()).device
    student.embedding_probe = EmbeddingProbe(2 * student.embed_dim, int(hidden)).to(device)
    return student


def build_wdpruning_student(teacher: Backbone, depth: int, hidden: int = DEFAULT_PROBE_HIDDEN) -> nn.Module:
    from pathtwt.compress.methods.truncation import truncated_student

    return add_embedding_probe(truncated_student(teacher, depth), hidden)


class FinalEmbeddingLoss:
    """The final-feature loss on what the extractor outputs: MSE between the student's
    probed tile embedding and the teacher's tile embedding."""

    def __init__(self, num_prefix_tokens: int) -> None:
        self.num_prefix_tokens = int(num_prefix_tokens)

    def _embedding(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        from pathtwt.compress.student import block_outputs
        from pathtwt.models.embedding import pool_model_tokens

        return pool_model_tokens(model, model.norm(block_outputs(model, x)[-1]), self.num_prefix_tokens)

    def targets(self, teacher: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
        return [self._embedding(teacher, x)]

    def loss(self, student: nn.Module, x: torch.Tensor, targets: list[torch.Tensor], step: int) -> tuple[torch.Tensor, dict[str, float]]:
        loss = nn.functional.mse_loss(self._embedding(student, x), targets[0])
        return loss, {"final": loss.detach()}


def compress(teacher: Backbone, calib: CalibrationSet, options: CompressOptions) -> Path | None:
    """Registry entry (``--method wdpruning``): first K layers + probe, distilled on the
    final embedding, exported."""
    from pathtwt.compress.pipeline import distill_and_export

    num_layers = len(teacher.model.blocks)
    if options.depth is None or not 1 <= options.depth < num_layers:
        raise ConfigError(f"--method wdpruning needs --depth K with 1 <= K < {num_layers} (the layers kept)")
    hidden = int(method_option(options.extra, "probe_hidden"))
    if hidden < 1:
        raise ConfigError(f"--option probe_hidden={hidden}: must be a positive integer")
    depth = int(options.depth)
    with seeded(options.distill.seed):  # the probe's layers
        student = build_wdpruning_student(teacher, depth, hidden)
    probe_params = sum(p.numel() for p in student.embedding_probe.parameters())
    return distill_and_export(
        teacher, calib, options, method="wdpruning", student=student,
        objective=FinalEmbeddingLoss(teacher.spec.num_prefix_tokens), boundaries=list(range(1, depth + 1)),
        layer_patches={"embedding_probe": {"hidden": hidden}},
        extra={"kept_layers": list(range(1, depth + 1)),
               "probe": {"form": "e + fc2(gelu(fc1(e))) on e = concat(CLS, mean patch), once per tile",
                         "hidden": hidden, "params": int(probe_params)},
               "loss": "MSE(probe(student embedding), teacher embedding)"},
    )
