"""Two-NN intrinsic dimension (Facco, d'Errico, Rodriguez & Laio, Sci. Rep. 2017), and the
representations it is measured on at block boundaries.

For each point, mu = r2 / r1 (second over first nearest-neighbour distance) follows a
Pareto law with exponent d, so -log(1 - F(mu)) = d log(mu). The estimate is the slope
through the origin of that line over the empirical F(mu_i) = i / N, after discarding the
largest ``discard_fraction`` of the ratios (the noisy tail).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
import numpy as np
import torch

from pathtwt.errors import NumericsError

log = logging.getLogger(__name__)

REPRESENTATIONS = ("cls", "patch-mean", "patch-seq")


@dataclass(frozen=True)
class TwoNNResult:
    dimension: float
    n_points: int  # points given
    n_used: int  # ratios entering the fit (distinct points minus the discarded tail)
    n_duplicates: int  # points dropped because they coincide with another (zero distance)


def _two_nearest(X: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Distances to the first and second nearest neighbours (float64), in row blocks so
    a few thousand points of 100k dimensions never need an n x n x D array."""
    sq = (X * X).sum(1)
    r1, r2 = [], []
    for i in range(0, len(X), 1024):
        d2 = (sq[i : i + 1024, None] + sq[None, :] - 2.0 * X[i : i + 1024] @ X.T).clamp_min_(0.0)
        d2[torch.arange(len(d2)), torch.arange(i, i + len(d2))] = float("inf")  # not its own neighbour
        two = torch.topk(d2, 2, dim=1, largest=False).values.sqrt()
        r1.append(two[:, 0])
        r2.append(two[:, 1])
    return torch.cat(r1).numpy(), torch.cat(r2).numpy()


def two_nn_details(X: np.ndarray | torch.Tensor, discard_fraction: float = 0.1) -> TwoNNResult:
    """Two-NN estimate with its bookkeeping. Identical points are dropped before the
    neighbour search (a zero first distance makes the ratio undefined), and counted."""
    if not 0.0 <= discard_fraction < 1.0:
        raise ValueError(f"discard_fraction must be in [0, 1), got {discard_fraction}")
    X = torch.as_tensor(np.asarray(X) if not isinstance(X, torch.Tensor) else X).detach().cpu().double()
    X = X.reshape(len(X), -1)
    if not torch.isfinite(X).all():
        raise NumericsError("intrinsic dimension: the representations hold NaN or infinite values")
    n_points = len(X)
    X = torch.unique(X, dim=0)
    n_duplicates = n_points - len(X)
    if n_duplicates:
        log.warning("two_nn: dropped %d duplicate points (zero nearest-neighbour distance)", n_duplicates)
    if len(X) < 3:
        raise NumericsError(f"intrinsic dimension needs at least 3 distinct points, got {len(X)}")
    # centre so the Gram trick keeps its precision for points far from the origin
    r1, r2 = _two_nearest(X - X.mean(0))
    ok = r1 > 0  # distinct rows can still round to zero distance in float64
    n_duplicates += int((~ok).sum())
    mu = np.sort(r2[ok] / r1[ok])
    n = len(mu)
    # the largest ratio has F = 1, i.e. -log(1 - F) = inf: it is always left out
    keep = min(int(np.floor(n * (1.0 - discard_fraction))), n - 1)
    x = np.log(mu[:keep])
    y = -np.log(1.0 - np.arange(1, keep + 1) / n)
    denom = float(x @ x)
    if denom <= 0:
        raise NumericsError("intrinsic dimension: all nearest-neighbour ratios are 1 (degenerate points)")
    return TwoNNResult(dimension=float(x @ y / denom), n_points=n_points, n_used=keep, n_duplicates=n_duplicates)


def two_nn(X: np.ndarray | torch.Tensor, discard_fraction: float = 0.1) -> float:
    """Two-NN intrinsic dimension of (n_points, n_features) data."""
    return two_nn_details(X, discard_fraction).dimension


def representation(h: torch.Tensor, kind: str, num_prefix_tokens: int) -> torch.Tensor:
    """(B, T, D) layer output -> (B, F): the class token, the mean patch token, or the
    flattened patch sequence (registers are excluded from the patch views)."""
    if kind == "cls":
        return h[:, 0]
    patches = h[:, num_prefix_tokens:]
    if kind == "patch-mean":
        return patches.mean(1)
    if kind == "patch-seq":
        return patches.reshape(len(h), -1)
    raise ValueError(f"unknown representation {kind!r}; choose one of {', '.join(REPRESENTATIONS)}")
