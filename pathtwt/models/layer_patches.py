"""Structural edits to a timm ViT recorded in a variant's ``model.json`` as
``layer_patches``, so that comparison methods that are not a plain ViT are rebuilt
from data.

``{"attention_free": [i, ...]}`` (0-based block indices, NOSE-style): block i computes
x = x + x, then its MLP as usual, i.e. x' = 2x + MLP(LN(2x)) (LayerNorm makes LN(2x) =
LN(x) up to its epsilon). Implemented by replacing ``norm1``, ``attn`` and ``ls1`` with
identities, so the block stays a timm ``Block`` (``forward_intermediates`` works) and its
state dict simply lacks those three modules.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from pathtwt.errors import WeightsError
from pathtwt.models.variant_layers import BASELINE_PATCHES, apply_baseline_patches

# the comparison methods' own patches (BASELINE_PATCHES: linear_blocks, embedding_probe,
# layer_time_scale, tied_blocks) are defined and documented in pathtwt.models.variant_layers
KNOWN_PATCHES = ("attention_free",) + BASELINE_PATCHES


class PassThrough(nn.Module):
    """Returns its input; accepts the keyword arguments timm passes to attention."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return x


def make_attention_free(block: nn.Module) -> None:
    block.norm1 = nn.Identity()
    block.attn = PassThrough()
    block.ls1 = nn.Identity()


def apply_layer_patches(model: nn.Module, patches: Mapping[str, Any]) -> nn.Module:
    unknown = [k for k in patches if k not in KNOWN_PATCHES]
    if unknown:
        raise WeightsError(f"unknown layer_patches {unknown}; known: {list(KNOWN_PATCHES)}")
    depth = len(model.blocks)
    for index in patches.get("attention_free", []):
        if not 0 <= int(index) < depth:
            raise WeightsError(f"layer_patches attention_free index {index} outside 0..{depth - 1}")
        make_attention_free(model.blocks[int(index)])
    if any(k in patches for k in BASELINE_PATCHES):
        apply_baseline_patches(model, patches)
    return model
