"""Token norm growth across depth and the residual-to-output ratio ||f(h) - h|| / ||h||
of every layer (f: the whole block, attention and MLP branches with their residuals).

A ratio that falls with depth while norms grow says late layers only nudge a large
residual stream: the reason TWT offers a learnable scalar per surrogate branch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from pathtwt.compress.intermediates import iter_layer_outputs


@dataclass
class NormProfile:
    layers: list[int]  # 1..L
    patch_norm: list[float]  # mean L2 norm of patch tokens at each layer output
    cls_norm: list[float]
    patch_residual_ratio: list[float]  # mean over patch tokens of ||out - in|| / ||in||
    cls_residual_ratio: list[float]

    @property
    def patch_growth(self) -> float:
        """Last layer's patch-token norm over the first layer's."""
        return self.patch_norm[-1] / self.patch_norm[0]

    def rows(self) -> list[dict[str, float]]:
        return [
            {
                "layer": layer,
                "patch_norm": self.patch_norm[i],
                "cls_norm": self.cls_norm[i],
                "patch_norm_vs_layer1": self.patch_norm[i] / self.patch_norm[0],
                "patch_residual_ratio": self.patch_residual_ratio[i],
                "cls_residual_ratio": self.cls_residual_ratio[i],
            }
            for i, layer in enumerate(self.layers)
        ]


def _token_stats(h_in: torch.Tensor, h_out: torch.Tensor) -> tuple[float, float]:
    """Sums over tokens of the output norm and of the residual-to-input ratio."""
    norm_in = h_in.double().norm(dim=-1).clamp_min(1e-12)
    return float(h_out.double().norm(dim=-1).sum()), float(((h_out - h_in).double().norm(dim=-1) / norm_in).sum())


def norm_profile(
    model: torch.nn.Module,
    transform: Callable,
    tiles: Sequence[np.ndarray] | np.ndarray,
    *,
    num_prefix_tokens: int,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    progress: Callable[[int], object] | None = None,
) -> NormProfile:
    """Streamed over batches: only one batch of layer outputs is held at a time."""
    L = len(model.blocks)
    sums = np.zeros((4, L))  # patch norm, patch ratio, cls norm, cls ratio
    n_patch = n_cls = 0
    for outs in iter_layer_outputs(model, transform, tiles, batch_size=batch_size, device=device, with_input=True,
                                   progress=progress):
        for layer in range(L):
            h_in, h_out = outs[layer], outs[layer + 1]
            sums[0:2, layer] += _token_stats(h_in[:, num_prefix_tokens:], h_out[:, num_prefix_tokens:])
            if num_prefix_tokens:
                sums[2:4, layer] += _token_stats(h_in[:, :1], h_out[:, :1])
        n_patch += outs[0].shape[0] * (outs[0].shape[1] - num_prefix_tokens)
        n_cls += outs[0].shape[0]
    patch = sums[0:2] / max(n_patch, 1)
    cls = sums[2:4] / n_cls if num_prefix_tokens and n_cls else np.full((2, L), np.nan)
    return NormProfile(
        layers=list(range(1, L + 1)),
        patch_norm=patch[0].tolist(),
        cls_norm=cls[0].tolist(),
        patch_residual_ratio=patch[1].tolist(),
        cls_residual_ratio=cls[1].tolist(),
    )
