"""The backbone an extraction embeds with, loaded as its request says: the one place
`pathtwt extract` and `pathtwt predict` build it, so a slide embedded by either gets the
same features."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pathtwt.models.registry import Backbone


@dataclass(frozen=True)
class BackboneRequest:
    name: str  # a registry name or timm:NAME
    weights: str | None = None  # a local file or snapshot folder; None: the registry's
    random_init: bool = False  # the architecture with random weights (tests, offline demos)
    precision: str = "auto"  # auto | fp32 | bf16 | fp16 (pathtwt.models.precision)
    mean: tuple[float, float, float] | None = None  # of [0, 1] RGB; None: the registry's
    std: tuple[float, float, float] | None = None


def load_backbone(request: BackboneRequest, device: Any) -> tuple[Backbone, bool]:
    """(backbone, bf16 autocast?): with precision auto on native bf16 hardware, fp32 weights
    under bf16 autocast, guarded by the run's first tiles (pathtwt.models.bf16_guard)."""
    from pathtwt.models.registry import create_backbone

    backbone = create_backbone(request.name, weights=request.weights, pretrained=not request.random_init,
                               device=device, precision=request.precision, mean=request.mean, std=request.std)
    return backbone, backbone.bf16_autocast
