"""The tile embedding, pooled from the final (normed) ``forward_features`` tokens laid out
[CLS, registers..., patches...]; register tokens are never used. Two recipes:

* ``cls+mean`` (pathtwt's default, the paper's): concat(CLS, mean of the patch tokens),
  2 x width (1536-d for ViT-B, 768-d for ViT-S);
* ``cls``: the CLS token alone, 1 x width, what TRIDENT and most model cards call the
  tile embedding of the same backbones.

The recipe is recorded in every features file (``embedding_recipe``), so two files of one
backbone with different widths say why."""

from __future__ import annotations

import torch

from pathtwt.errors import PathtwtError
from pathtwt.models.recipes import DEFAULT_RECIPE, RECIPES, check_recipe, embedding_dim  # noqa: F401 - the recipes' names

def pool_tokens(tokens: torch.Tensor, num_prefix_tokens: int, recipe: str = DEFAULT_RECIPE) -> torch.Tensor:
    """(B, T, D) tokens laid out [CLS, registers..., patches...] -> (B, 2 * D) float32 for
    ``cls+mean``, (B, D) for ``cls``."""
    check_recipe(recipe)
    if tokens.ndim != 3 or tokens.shape[1] <= num_prefix_tokens:
        raise ValueError(f"expected (B, T, D) tokens with more than {num_prefix_tokens} tokens, got {tuple(tokens.shape)}")
    tokens = tokens.float()  # average in float32 even when the model runs in bf16
    if recipe == "cls":
        return tokens[:, 0]
    return torch.cat([tokens[:, 0], tokens[:, num_prefix_tokens:].mean(dim=1)], dim=1)


def pool_model_tokens(model: torch.nn.Module, tokens: torch.Tensor, num_prefix_tokens: int,
                      recipe: str = DEFAULT_RECIPE) -> torch.Tensor:
    """The tile embedding of ``model`` from its final (normed) tokens: :func:`pool_tokens`,
    then the model's ``embedding_probe`` if it has one (WDPruning's probe, which acts on
    the pooled ``cls+mean`` vector; :mod:`pathtwt.models.variant_layers`)."""
    pooled = pool_tokens(tokens, num_prefix_tokens, recipe)
    probe = getattr(model, "embedding_probe", None)
    if probe is None:
        return pooled
    if recipe != "cls+mean":
        raise PathtwtError(f"this variant's probe (WDPruning) was trained on the cls+mean embedding; "
                           f"use the cls+mean recipe, not {recipe!r}")
    dtype = next(probe.parameters()).dtype
    return probe(pooled.to(dtype)).float()


def embed_tiles(
    model: torch.nn.Module, x: torch.Tensor, num_prefix_tokens: int, recipe: str = DEFAULT_RECIPE
) -> torch.Tensor:
    """Tile embeddings of a normalised batch (B, 3, H, W), cast to the model's dtype."""
    dtype = next(model.parameters()).dtype
    return pool_model_tokens(model, model.forward_features(x.to(dtype)), num_prefix_tokens, recipe)
