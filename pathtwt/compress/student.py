"""The K-layer student: a plain timm ``VisionTransformer`` whose blocks are surrogate layers.

The student is built from the teacher's own timm name and keyword arguments
(``pathtwt.models.registry.build_timm_model``) with only ``depth`` changed, so the exported model is loadable with timm alone. Everything that is
not a block (patch embedding, class/register tokens, position embedding, final norm) is
copied from the teacher.

During training each surrogate may carry two learnable scalars, one per residual branch
(attention and MLP), initialised to 1: :class:`ScaledBlock` wraps a timm ``Block`` for that.
At export the scalars are folded into the block's own weights (the LayerScale ``gamma``
if the block has one, else the last linear layer of the branch), so no wrapper survives.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Iterable, Sequence

import torch
from torch import nn

from pathtwt.compress.intermediates import block_input

if TYPE_CHECKING:
    from pathtwt.models.spec import BackboneSpec


def non_block_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of the model's state that does not belong to a transformer block."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith("blocks.")}


def stitch_student(teacher: nn.Module, layers: Sequence[nn.Module], *, spec: BackboneSpec) -> nn.Module:
    """A ``len(layers)``-layer timm ViT of the teacher's ``spec`` (a ``BackboneSpec``) with the
    teacher's embeddings and final norm and copies of ``layers`` (timm ``Block`` modules,
    possibly :class:`ScaledBlock`-wrapped: their scalars are folded first) as its blocks."""
    from pathtwt.models.registry import build_timm_model

    student = build_timm_model(spec, depth=len(layers))
    state = non_block_state(teacher)
    for j, layer in enumerate(layers):
        plain = fold_block(layer) if isinstance(layer, ScaledBlock) else layer
        for key, value in plain.state_dict().items():
            state[f"blocks.{j}.{key}"] = value
    student.load_state_dict(state, strict=True)
    return student


class ScaledBlock(nn.Module):
    """A timm ``Block`` with one learnable scalar per residual branch (both start at 1):
    ``x + a * ls1(attn(norm1 x))`` then ``x + b * ls2(mlp(norm2 x))``."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block
        ref = next(block.parameters())
        self.attn_scale = nn.Parameter(torch.ones((), dtype=ref.dtype, device=ref.device))
        self.mlp_scale = nn.Parameter(torch.ones((), dtype=ref.dtype, device=ref.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.block
        x = x + b.drop_path1(self.attn_scale * b.ls1(b.attn(b.norm1(x))))
        x = x + b.drop_path2(self.mlp_scale * b.ls2(b.mlp(b.norm2(x))))
        return x


def _fold_branch(layer_scale: nn.Module, last_linear: nn.Linear, scale: torch.Tensor) -> None:
    # Both branches end in "... -> last linear -> LayerScale -> * scalar": the scalar can be
    # absorbed into gamma when there is one, else into the linear layer's weight and bias.
    if hasattr(layer_scale, "gamma"):
        layer_scale.gamma.mul_(scale)
        return
    last_linear.weight.mul_(scale)
    if last_linear.bias is not None:
        last_linear.bias.mul_(scale)


@torch.no_grad()
def fold_block(scaled: ScaledBlock) -> nn.Module:
    """A plain copy of the wrapped block with both scalars folded into its weights."""
    block = copy.deepcopy(scaled.block)
    _fold_branch(block.ls1, block.attn.proj, scaled.attn_scale.detach())
    _fold_branch(block.ls2, block.mlp.fc2, scaled.mlp_scale.detach())
    return block


def add_branch_scales(model: nn.Module) -> nn.Module:
    """Wrap every block of ``model`` (in place) in a :class:`ScaledBlock`; returns ``model``."""
    model.blocks = nn.Sequential(*(b if isinstance(b, ScaledBlock) else ScaledBlock(b) for b in model.blocks))
    return model


def fold_branch_scales(model: nn.Module) -> nn.Module:
    """Undo :func:`add_branch_scales` (in place) by folding every scalar into its block."""
    model.blocks = nn.Sequential(*(fold_block(b) if isinstance(b, ScaledBlock) else b for b in model.blocks))
    return model


def block_outputs(model: nn.Module, x: torch.Tensor, *, blocks: Iterable[nn.Module] | None = None) -> list[torch.Tensor]:
    """``[h_0, h_1, ..., h_K]``: the embedded tokens then every block's output (prefix
    tokens included, no final norm). A plain loop over the blocks, so it works the same for
    a teacher, a student and a student whose blocks are :class:`ScaledBlock` wrappers."""
    h = block_input(model, x)
    outs = [h]
    for blk in model.blocks if blocks is None else blocks:
        h = blk(h)
        outs.append(h)
    return outs


def clone_layers(model: nn.Module, indices: Iterable[int]) -> list[nn.Module]:
    """Deep copies of ``model.blocks[i]`` (0-based) for each index."""
    return [copy.deepcopy(model.blocks[i]) for i in indices]
