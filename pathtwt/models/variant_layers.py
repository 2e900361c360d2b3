"""Layer patches of the comparison methods whose layers are not plain timm ViT blocks.

A variant's ``model.json`` carries ``layer_patches``; applied to a freshly built timm
``VisionTransformer`` of the variant's depth they give the exact module layout of the
saved ``model.safetensors``, so loading stays ``strict=True``. Each patch keeps timm's key
names for the parameters it keeps and adds as few keys as possible. Block indices are
0-based, as in the ``blocks.{i}`` keys. ``attention_free`` (NOSE) lives in
:mod:`pathtwt.models.layer_patches`; this module adds:

- ``{"linear_blocks": [i, ...]}`` (linear surrogate): block i is the per-token affine map
  ``x -> x W^T + b``, keys ``blocks.{i}.proj.weight`` / ``blocks.{i}.proj.bias``.
- ``{"embedding_probe": {"hidden": H}}`` (WDPruning): a residual two-layer MLP on the
  pooled tile embedding e = concat(CLS, mean patch) (2D wide), ``e + fc2(gelu(fc1(e)))``,
  keys ``embedding_probe.fc1.*`` (2D -> H) and ``embedding_probe.fc2.*`` (H -> 2D). It runs
  once per tile, after pooling (:func:`pathtwt.models.embedding.pool_model_tokens`); the
  blocks and the final norm are the teacher's plain timm modules.
- ``{"layer_time_scale": true}`` (Raptor): every block i (0-based) runs as a
  :class:`TimeScaledBlock` conditioned on its layer number t = i + 1, as in the Raptor
  code: ``(s1, s2, s3) = 1 + g(t)`` with g a 1 -> 16 -> 3D MLP,
  ``x = x + s1 * attn_branch(x); x = x + s2 * mlp_branch(x); x = s3 * x``; the block keeps
  timm's keys and adds ``blocks.{i}.t_proj.fc1.*`` / ``blocks.{i}.t_proj.fc2.*``.
- ``{"tied_blocks": [[s, e], ...]}`` (Raptor, optional; 1-based inclusive layer numbers):
  layers s..e become one module run e - s + 1 times (with ``layer_time_scale``: one set of
  weights, including g, each layer keeping its own t). Raptor's file stores the duplicated
  (identical) tensors so timm loads it; tying on load makes the parameter count of the
  reloaded model the unique count recorded in model.json.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn

from pathtwt.errors import WeightsError

BASELINE_PATCHES = ("linear_blocks", "embedding_probe", "layer_time_scale", "tied_blocks")


class LinearBlock(nn.Module):
    """A per-token affine map standing in for a whole block of layers."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, attn_mask: Any = None, is_causal: bool = False) -> torch.Tensor:
        return self.proj(x)


class EmbeddingProbe(nn.Module):
    """WDPruning's probe on the pooled tile embedding: ``e + fc2(gelu(fc1(e)))``. ``fc2``
    starts at zero, so an untrained probe is the identity (plain truncation)."""

    runs_per_tile = True  # one pooled vector per tile: the MAC counter charges in * out

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        nn.init.zeros_(self.fc2.weight)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        return e + self.fc2(nn.functional.gelu(self.fc1(e)))


class LayerTimeScale(nn.Module):
    """Raptor's layer-index conditioning g: t -> (s1, s2, s3) = 1 + MLP(t), 1 -> 16 -> 3D.
    ``fc2`` starts at zero, so the block starts as the plain shared layer."""

    runs_per_tile = True  # a function of the layer number only

    def __init__(self, dim: int, hidden: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(1, hidden)
        self.fc2 = nn.Linear(hidden, 3 * dim)
        nn.init.zeros_(self.fc2.weight)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, t: float, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tt = torch.full((1, 1), float(t), dtype=like.dtype, device=like.device)
        return (1 + self.fc2(nn.functional.silu(self.fc1(tt)))).reshape(3, -1).unbind(0)


class TimeScaledBlock(nn.Module):
    """A timm block run as Raptor's layer-conditioned block at layer number ``layer``. It
    holds the block's own submodules (so the keys stay timm's) plus ``t_proj``."""

    def __init__(self, block: nn.Module, layer: int, t_proj: LayerTimeScale | None = None) -> None:
        super().__init__()
        for name in ("norm1", "attn", "ls1", "drop_path1", "norm2", "mlp", "ls2", "drop_path2"):
            setattr(self, name, getattr(block, name))
        self.t_proj = t_proj if t_proj is not None else LayerTimeScale(block.norm2.normalized_shape[-1])
        self.layer = int(layer)

    def at_layer(self, layer: int) -> "TimeScaledBlock":
        """The same weights (``t_proj`` included) run at another layer number."""
        return TimeScaledBlock(self, layer, self.t_proj)

    def forward(self, x: torch.Tensor, attn_mask: Any = None, is_causal: bool = False) -> torch.Tensor:
        s1, s2, s3 = self.t_proj(self.layer, x)
        x = x + s1 * self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal)))
        x = x + s2 * self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return s3 * x


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
    """Make layers s..e (1-based, inclusive) one module, the block's first (layer-conditioned
    blocks share their weights and keep their own layer number); returns ``model``."""
    for s, e in blocks:
        first = model.blocks[int(s) - 1]
        for i in range(int(s), int(e)):
            model.blocks[i] = first.at_layer(i + 1) if isinstance(first, TimeScaledBlock) else first
    return model


def add_layer_time_scale(model: nn.Module) -> nn.Module:
    """Every block becomes a :class:`TimeScaledBlock` at its own layer number (untied)."""
    for i in range(len(model.blocks)):
        if not isinstance(model.blocks[i], TimeScaledBlock):
            model.blocks[i] = TimeScaledBlock(model.blocks[i], i + 1)
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
    probe = patches.get("embedding_probe")
    if probe:
        hidden = probe.get("hidden") if isinstance(probe, Mapping) else None
        if not isinstance(hidden, int) or hidden < 1:
            raise WeightsError(f"layer_patches.embedding_probe needs a positive integer 'hidden', got {probe!r}")
        model.embedding_probe = EmbeddingProbe(2 * dim, hidden)
    if patches.get("layer_time_scale"):
        add_layer_time_scale(model)
    tied = [[int(s), int(e)] for s, e in patches.get("tied_blocks", [])]
    _indices(model, "tied_blocks", [i - 1 for b in tied for i in b])
    return tie_blocks(model, tied)
