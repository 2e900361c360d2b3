"""The tile embedding: concat(CLS output, mean of the patch-token outputs) of the final
(normed) ``forward_features`` tokens; register tokens are left out. 1536-d for ViT-B,
768-d for ViT-S."""

from __future__ import annotations

import torch

RECIPE = "concat(cls, mean(patch))"


def pool_tokens(tokens: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """(B, T, D) tokens laid out [CLS, registers..., patches...] -> (B, 2 * D) float32."""
    if tokens.ndim != 3 or tokens.shape[1] <= num_prefix_tokens:
        raise ValueError(f"expected (B, T, D) tokens with more than {num_prefix_tokens} tokens, got {tuple(tokens.shape)}")
    tokens = tokens.float()  # average in float32 even when the model runs in bf16
    return torch.cat([tokens[:, 0], tokens[:, num_prefix_tokens:].mean(dim=1)], dim=1)


def pool_model_tokens(model: torch.nn.Module, tokens: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """The tile embedding of ``model`` from its final (normed) tokens: :func:`pool_tokens`,
    then the model's ``embedding_probe`` if it has one (WDPruning's probe, which acts on
    the pooled vector; :mod:`pathtwt.models.variant_layers`)."""
    pooled = pool_tokens(tokens, num_prefix_tokens)
    probe = getattr(model, "embedding_probe", None)
    if probe is None:
        return pooled
    dtype = next(probe.parameters()).dtype
    return probe(pooled.to(dtype)).float()


def embed_tiles(model: torch.nn.Module, x: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """Tile embeddings of a normalised batch (B, 3, H, W), cast to the model's dtype."""
    dtype = next(model.parameters()).dtype
    return pool_model_tokens(model, model.forward_features(x.to(dtype)), num_prefix_tokens)
