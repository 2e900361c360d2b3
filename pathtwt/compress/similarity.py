"""The L x L layer-similarity matrix S[a, b] = mean over tiles of the cosine distance
1 - cos(h_a, h_b) between the outputs of layers a and b.

Token modes: ``all`` (default) takes the cosine per token position and averages over all
tokens (prefix and patches); ``cls`` uses the class token only; ``patch-mean`` the mean of
the patch tokens. Sums are accumulated batch by batch in float64, so only one batch of
layer outputs is ever held in memory.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import numpy as np
import torch

from pathtwt.errors import ConfigError, NumericsError
from pathtwt.io.atomic import atomic_output, write_text_atomic
from pathtwt.compress.intermediates import iter_layer_outputs

TOKEN_MODES = ("all", "cls", "patch-mean")


def token_view(h: torch.Tensor, tokens: str, num_prefix_tokens: int) -> torch.Tensor:
    """(B, T, D) layer output -> (B, T', D) the tokens compared in this mode."""
    if tokens == "all":
        return h
    if tokens == "cls":
        if num_prefix_tokens < 1:
            raise ConfigError("--tokens cls needs a model with a class token; use all or patch-mean")
        return h[:, :1]
    if tokens == "patch-mean":
        return h[:, num_prefix_tokens:].mean(dim=1, keepdim=True)
    raise ConfigError(f"unknown --tokens {tokens!r}; choose one of {', '.join(TOKEN_MODES)}")


class SimilarityAccumulator:
    """Streaming sum of per-token cosines between every pair of layers."""

    def __init__(self, num_layers: int, *, tokens: str = "all", num_prefix_tokens: int = 1):
        if tokens not in TOKEN_MODES:
            raise ConfigError(f"unknown --tokens {tokens!r}; choose one of {', '.join(TOKEN_MODES)}")
        self.num_layers, self.tokens, self.num_prefix_tokens = num_layers, tokens, num_prefix_tokens
        self.cos_sum = np.zeros((num_layers, num_layers), dtype=np.float64)
        self.count = 0  # tiles x token positions seen
        self.n_tiles = 0

    def update(self, outputs: Sequence[torch.Tensor]) -> None:
        if len(outputs) != self.num_layers:
            raise ValueError(f"expected {self.num_layers} layer outputs, got {len(outputs)}")
        views = [token_view(h, self.tokens, self.num_prefix_tokens) for h in outputs]
        # unit vectors per token; per-token cosines in float32 (exact to ~1e-7), summed
        # over tiles and token positions in float64 so 10,000 tiles do not drift
        unit = [torch.nn.functional.normalize(v.float(), dim=-1) for v in views]
        gram = np.zeros((self.num_layers, self.num_layers))
        for a in range(self.num_layers):
            for b in range(a, self.num_layers):
                gram[a, b] = gram[b, a] = float((unit[a] * unit[b]).sum(-1).double().sum())
        if not np.all(np.isfinite(gram)):
            raise NumericsError("layer outputs hold NaN or infinite values; check the backbone weights")
        self.cos_sum += gram
        self.count += views[0].shape[0] * views[0].shape[1]
        self.n_tiles += views[0].shape[0]

    def matrix(self) -> np.ndarray:
        if self.count == 0:
            raise ConfigError("no calibration tiles were seen; check --calibration")
        S = 1.0 - self.cos_sum / self.count
        S = 0.5 * (S + S.T)  # exact symmetry despite rounding
        np.fill_diagonal(S, 0.0)
        return np.clip(S, 0.0, 2.0)


def similarity_matrix(
    model: torch.nn.Module,
    transform: Callable,
    tiles: Sequence[np.ndarray] | np.ndarray,
    *,
    num_prefix_tokens: int,
    tokens: str = "all",
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    progress: Callable | None = None,
) -> np.ndarray:
    """S (L x L, float64) over ``tiles`` (uint8 (N, P, P, 3))."""
    acc = SimilarityAccumulator(len(model.blocks), tokens=tokens, num_prefix_tokens=num_prefix_tokens)
    for outs in iter_layer_outputs(model, transform, tiles, batch_size=batch_size, device=device, progress=progress):
        acc.update(outs)
    return acc.matrix()


def similarity_from_outputs(outputs: Sequence[torch.Tensor], *, num_prefix_tokens: int, tokens: str = "all",
                            batch_size: int = 32) -> np.ndarray:
    """S from the L layer outputs (each (N, T, D)) of the tiles, summed in batches of
    ``batch_size`` as :func:`similarity_matrix` sums them."""
    acc = SimilarityAccumulator(len(outputs), tokens=tokens, num_prefix_tokens=num_prefix_tokens)
    for i in range(0, len(outputs[0]), batch_size):
        acc.update([o[i : i + batch_size] for o in outputs])
    return acc.matrix()


def save_similarity(directory: str | os.PathLike, S: np.ndarray) -> None:
    """``similarity.npy`` and ``similarity.csv`` (layers labelled 1..L)."""
    from pathlib import Path

    directory = Path(directory)
    with atomic_output(directory / "similarity.npy") as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, S)
    L = S.shape[0]
    lines = ["layer," + ",".join(str(i) for i in range(1, L + 1))]
    lines += [f"{a + 1}," + ",".join(f"{v:.6f}" for v in S[a]) for a in range(L)]
    write_text_atomic(directory / "similarity.csv", "\n".join(lines) + "\n")
