"""Slide heads in plain torch, each registered by name in :mod:`pathtwt.mil.heads`. Both
take one bag of tile features (N, D) (or (1, N, D)) and return ``(logits (1, C), attention
(N,))``: the per-tile attention scores used for heatmaps. Neither fixes a device: they run wherever their parameters are moved.

- :class:`ABMIL`: gated attention pooling (Ilse et al., 2018).
- :class:`TransMIL`: projection, class token, square-grid padding, two Nystrom-attention
  layers with the PPEG position encoder between them, layer norm, classifier
  (Shao et al., 2021).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

def _as_bag(features: torch.Tensor) -> torch.Tensor:
    if features.dim() == 2:
        features = features.unsqueeze(0)
    if features.dim() != 3 or features.shape[0] != 1:
        raise ValueError(f"expected one bag (N, D) or (1, N, D), got shape {tuple(features.shape)}")
    return features


class FeatureStandardizer(nn.Module):
    """Per-dimension standardisation of tile features with statistics of the training
    bags. Frozen ViT embeddings mix dimensions of very different scale (final-norm gains,
    CLS next to patch means), which otherwise dominates a head's first layer and its early
    updates. The statistics are buffers, so they travel with every checkpoint."""

    def __init__(self, in_dim: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(in_dim))
        self.register_buffer("std", torch.ones(in_dim))

    @torch.no_grad()
    def fit(self, bags) -> None:
        """Set the statistics from an iterable of (N, D) arrays or tensors."""
        total, total_sq, count = None, None, 0
        for bag in bags:
            # a copy: cached bags are read-only arrays, which torch would only share with a warning
            x = (bag if isinstance(bag, torch.Tensor) else torch.tensor(bag)).to(torch.float64).reshape(-1, self.mean.shape[0])
            total = x.sum(0) if total is None else total + x.sum(0)
            total_sq = (x * x).sum(0) if total_sq is None else total_sq + (x * x).sum(0)
            count += x.shape[0]
        if not count:
            return
        mean = total / count
        var = (total_sq / count - mean * mean).clamp_min(0.0)
        self.mean.copy_(mean.to(self.mean.dtype))
        # dimensions that never vary keep unit scale instead of dividing by ~0
        self.std.copy_(torch.where(var > 1e-12, var.sqrt(), torch.ones_like(var)).to(self.std.dtype))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return (features - self.mean) / self.std


class ABMIL(nn.Module):
    """Gated attention MIL: h = ReLU(W x); a = softmax(w^T (tanh(V h) * sigmoid(U h)));
    slide = sum a_i h_i; logits = classifier(slide)."""

    def __init__(self, *, in_dim: int, n_classes: int, hidden_dim: int = 512, attention_dim: int = 256, dropout: float = 0.25):
        super().__init__()
        self.standardize = FeatureStandardizer(in_dim)
        self.project = nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.ReLU(), nn.Dropout(dropout))
        self.attention_tanh = nn.Sequential(nn.Linear(hidden_dim, attention_dim), nn.Tanh(), nn.Dropout(dropout))
        self.attention_gate = nn.Sequential(nn.Linear(hidden_dim, attention_dim), nn.Sigmoid(), nn.Dropout(dropout))
        self.attention_score = nn.Linear(attention_dim, 1)
        self.classifier = nn.Linear(hidden_dim, n_classes)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.project(self.standardize(_as_bag(features)[0]))  # (N, H)
        scores = self.attention_score(self.attention_tanh(h) * self.attention_gate(h)).squeeze(-1)  # (N,)
        attention = torch.softmax(scores, dim=0)
        slide = attention @ h  # (H,)
        return self.classifier(slide).unsqueeze(0), attention


def iterative_pinv(matrix: torch.Tensor, iterations: int = 6) -> torch.Tensor:
    """Moore-Penrose pseudo-inverse of a batch of square matrices by the iterative scheme
    of Razavi et al. (2014) used by Nystromformer; matrix products only, so it is cheap on
    the (landmarks x landmarks) kernel and differentiable."""
    abs_m = matrix.abs()
    # initial guess Z0 = M^T / (||M||_1 ||M||_inf) guarantees convergence
    scale = abs_m.sum(dim=-1).amax() * abs_m.sum(dim=-2).amax()
    z = matrix.transpose(-1, -2) / scale
    identity = torch.eye(matrix.shape[-1], device=matrix.device, dtype=matrix.dtype)
    for _ in range(iterations):
        mz = matrix @ z
        z = 0.25 * z @ (13 * identity - mz @ (15 * identity - mz @ (7 * identity - mz)))
    return z


class NystromAttention(nn.Module):
    """Multi-head self-attention approximated with the Nystrom method (Xiong et al., 2021):
    softmax(QK^T) V ~ softmax(Q K~^T) pinv(softmax(Q~ K~^T)) softmax(Q~ K^T) V with
    landmarks Q~, K~ the means of contiguous segments of the sequence. Memory and time
    grow linearly with the sequence length. A depthwise convolution over the sequence of
    values is added as a residual, as in the TransMIL reference."""

    def __init__(self, *, dim: int, heads: int = 8, landmarks: int = 256, pinv_iterations: int = 6, residual_kernel: int = 33, dropout: float = 0.1):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads, self.landmarks, self.pinv_iterations = heads, landmarks, pinv_iterations
        self.head_dim = dim // heads
        self.scale = self.head_dim**-0.5
        self.to_qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.to_out = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(dropout))
        self.value_conv = nn.Conv2d(heads, heads, (residual_kernel, 1), padding=(residual_kernel // 2, 0), groups=heads, bias=False)

    def forward(self, x: torch.Tensor, *, attend_from: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x`` (B, n, dim) -> (B, n, dim); with ``attend_from=i`` also the approximate
        attention row of token i over all n tokens, averaged over heads (B, n)."""
        b, n, dim = x.shape
        # pad at the front to a multiple of the landmark count so segments are equal
        pad = (-n) % self.landmarks
        if pad:
            x = F.pad(x, (0, 0, pad, 0))
        q, k, v = (t.reshape(b, -1, self.heads, self.head_dim).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
        q = q * self.scale
        segment = x.shape[1] // self.landmarks
        q_land = q.reshape(b, self.heads, self.landmarks, segment, self.head_dim).mean(dim=3)
        k_land = k.reshape(b, self.heads, self.landmarks, segment, self.head_dim).mean(dim=3)
        kernel_q = torch.softmax(q @ k_land.transpose(-1, -2), dim=-1)  # (B, h, n, m)
        kernel_land = iterative_pinv(torch.softmax(q_land @ k_land.transpose(-1, -2), dim=-1), self.pinv_iterations)
        kernel_k = torch.softmax(q_land @ k.transpose(-1, -2), dim=-1)  # (B, h, m, n)
        out = (kernel_q @ kernel_land) @ (kernel_k @ v) + self.value_conv(v)
        out = self.to_out(out.transpose(1, 2).reshape(b, -1, dim))[:, -n:]
        row = None
        if attend_from is not None:
            row = ((kernel_q[:, :, pad + attend_from : pad + attend_from + 1] @ kernel_land) @ kernel_k)[:, :, 0, pad:]
            row = row.mean(dim=1)
        return out, row


class TransLayer(nn.Module):
    def __init__(self, *, dim: int, heads: int, landmarks: int, dropout: float):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attention = NystromAttention(dim=dim, heads=heads, landmarks=landmarks, dropout=dropout)

    def forward(self, x: torch.Tensor, *, attend_from: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, row = self.attention(self.norm(x), attend_from=attend_from)
        return x + out, row


class PPEG(nn.Module):
    """Pyramid position encoding: depthwise 7x7, 5x5 and 3x3 convolutions over the tokens
    laid out on a square grid, added to the identity; the class token passes through."""

    def __init__(self, *, dim: int):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(dim, dim, k, padding=k // 2, groups=dim) for k in (7, 5, 3))

    def forward(self, x: torch.Tensor, side: int) -> torch.Tensor:
        b, _, dim = x.shape
        cls_token, tokens = x[:, :1], x[:, 1:]
        grid = tokens.transpose(1, 2).reshape(b, dim, side, side)
        grid = grid + sum(conv(grid) for conv in self.convs)
        return torch.cat([cls_token, grid.flatten(2).transpose(1, 2)], dim=1)


class TransMIL(nn.Module):
    """TransMIL. The per-tile attention is the class token's attention row, as the Nystrom
    approximation applies it, in the first layer (where the class token gathers from the
    tiles; by the second it already holds the slide summary), averaged over heads. The
    scores of the tokens repeated to fill the square grid are added to the tiles they copy.
    Being an approximation, single scores can be slightly negative."""

    def __init__(self, *, in_dim: int, n_classes: int, hidden_dim: int = 512, heads: int = 8, landmarks: int | None = None, dropout: float = 0.1):
        super().__init__()
        self.standardize = FeatureStandardizer(in_dim)
        self.project = nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.ReLU())
        self.cls_token = nn.Parameter(torch.randn(1, 1, hidden_dim))
        landmarks = hidden_dim // 2 if landmarks is None else landmarks
        self.layer1 = TransLayer(dim=hidden_dim, heads=heads, landmarks=landmarks, dropout=dropout)
        self.position = PPEG(dim=hidden_dim)
        self.layer2 = TransLayer(dim=hidden_dim, heads=heads, landmarks=landmarks, dropout=dropout)
        self.norm = nn.LayerNorm(hidden_dim)
        self.classifier = nn.Linear(hidden_dim, n_classes)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.project(self.standardize(_as_bag(features)))  # (1, N, H)
        n = h.shape[1]
        side = math.ceil(math.sqrt(n))
        fill = side * side - n
        if fill:
            # repeat the first tokens (cyclically, for bags smaller than the gap)
            h = torch.cat([h, h[:, torch.arange(fill, device=h.device) % n]], dim=1)
        h = torch.cat([self.cls_token.expand(h.shape[0], -1, -1), h], dim=1)
        h, row = self.layer1(h, attend_from=0)
        h = self.position(h, side)
        h, _ = self.layer2(h)
        logits = self.classifier(self.norm(h)[:, 0])
        tiles = row[0, 1:]  # drop the class token's attention to itself
        attention = tiles[:n].clone()
        if fill:
            attention.index_add_(0, torch.arange(fill, device=h.device) % n, tiles[n:])
        return logits, attention


# The registry's builders (pathtwt.mil.heads): every head is called with the same keywords
# and takes the ones it has.


def build_abmil(*, in_dim: int, n_classes: int, hidden_dim: int, dropout: float, **_: object) -> ABMIL:
    return ABMIL(in_dim=in_dim, n_classes=n_classes, hidden_dim=hidden_dim, attention_dim=max(1, hidden_dim // 2), dropout=dropout)


def build_transmil(*, in_dim: int, n_classes: int, hidden_dim: int, dropout: float, heads: int = 8,
                   landmarks: int | None = None, **_: object) -> TransMIL:
    return TransMIL(in_dim=in_dim, n_classes=n_classes, hidden_dim=hidden_dim, heads=heads, landmarks=landmarks, dropout=dropout)
