"""Layer patches of the comparison methods whose layers are not plain timm ViT blocks.

A variant's ``model.json`` carries ``layer_patches``; applied to a freshly built timm
``VisionTransformer`` of the variant's depth they give the exact module layout of the
saved ``model.safetensors``, so loading stays ``strict=True``. Each patch keeps timm's key
names for the parameters it keeps and adds as few keys as possible. Block indices are
0-based, as in the ``blocks.{i}`` keys. ``attention_free`` (NOSE) lives in
:mod:`pathtwt.models.layer_patches`; this module adds:

- ``{"linear_blocks": [i, ...]}`` (linear surrogate): block i is the per-token affine map
  ``x -> x W^T + b``, keys ``blocks.{i}.proj.weight`` / ``blocks.{i}.proj.bias``.
- ``{"probe": true}`` (WDPruning): the final norm is followed by a linear map on every
  token; keys ``norm.weight`` / ``norm.bias`` (the probe's LayerNorm, in the place of the
  teacher's final norm) plus ``norm.proj.weight`` / ``norm.proj.bias``.
- ``{"tied_blocks": [[s, e], ...]}`` (Raptor, optional; 1-based inclusive layer numbers):
  layers s..e become one module run e - s + 1 times. Raptor's file stores the duplicated
  (identical) tensors so timm alone loads it; tying on load makes the parameter count of
  the reloaded model the unique count recorded in model.json.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn

from pathtwt.errors import WeightsError

BASELINE_PATCHES = ("linear_blocks", "probe", "tied_blocks")


class LinearBlock(nn.Module):
    """A per-token affine map standing in for a whole block of layers."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, attn_mask: Any = None, is_causal: bool = False) -> torch.Tensor:
        return self.proj(x)


class ProbeNorm(nn.LayerNorm):
    """LayerNorm followed by a linear map on every token (the WDPruning probe). Subclassing
    LayerNorm keeps the norm's keys at ``norm.weight`` / ``norm.bias``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps=eps)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(super().forward(x))


class DilutedAttentionBlock(nn.Module):
    """Training-time bridge from a timm block to its attention-free form: the attention
    branch is blended with the identity, ``(1 - a) attn_branch(x) + a x``; ``a`` moves from
    0 to 1 during the dilution phase, after which the block computes exactly
    ``x = 2x; x = x + ls2(mlp(norm2(x)))``."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block
        self.register_buffer("alpha", torch.zeros(()), persistent=False)

    def forward(self, x: torch.Tensor, attn_mask: Any = None, is_causal: bool = False) -> torch.Tensor:
        b, a = self.block, self.alpha
        if float(a) >= 1.0:
            branch = x
        else:
            branch = (1 - a) * b.drop_path1(b.ls1(b.attn(b.norm1(x)))) + a * x
        x = x + branch
        return x + b.drop_path2(b.ls2(b.mlp(b.norm2(x))))


def tie_blocks(model: nn.Module, blocks: Sequence[Sequence[int]]) -> nn.Module:
    """Make layers s..e (1-based, inclusive) one module, the block's first; returns ``model``."""
    for s, e in blocks:
        for i in range(int(s), int(e)):
            model.blocks[i] = model.blocks[int(s) - 1]
    return model


def _indices(model: nn.Module, key: str, indices: Sequence[int]) -> list[int]:
    depth = len(model.blocks)
    bad = [i for i in indices if not 0 <= int(i) < depth]
    if bad:
        raise WeightsError(f"layer_patches.{key} names blocks {bad} but the model has {depth}; the model.json is inconsistent")
    return [int(i) for i in indices]


def apply_baseline_patches(model: nn.Module, patches: Mapping[str, Any]) -> nn.Module:
    """Apply the entries of :data:`BASELINE_PATCHES` found in ``patches`` (others are ignored
    here); returns ``model``."""
    dim = model.embed_dim
    for i in _indices(model, "linear_blocks", patches.get("linear_blocks", [])):
        model.blocks[i] = LinearBlock(dim)
    if patches.get("probe"):
        model.norm = ProbeNorm(dim, eps=getattr(model.norm, "eps", 1e-6))
    tied = [[int(s), int(e)] for s, e in patches.get("tied_blocks", [])]
    _indices(model, "tied_blocks", [i - 1 for b in tied for i in b])
    return tie_blocks(model, tied)
