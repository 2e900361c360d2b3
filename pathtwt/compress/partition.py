"""Exact partition of a ViT's depth into contiguous blocks (the TWT merge plan).

Layers are numbered 1..L as in the paper; ``S`` is the L x L matrix of mean cosine
distances between layer outputs (0-indexed: ``S[a - 1, b - 1]`` compares layers a and b).
A block [s, e] covers layers s..e inclusive and its discrepancy is S[s, e], the distance
between its first and last layer (0 for a single layer). Both programmes below are exact
dynamic programmes over prefixes 1..i; they do not assume S grows away from the diagonal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from pathtwt.errors import ConfigError, NumericsError


@dataclass(frozen=True)
class Partition:
    blocks: list[tuple[int, int]]  # 1-indexed inclusive (s, e), contiguous, covering 1..L
    discrepancies: list[float] = field(default_factory=list)
    max_discrepancy: float = 0.0

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    def to_dict(self) -> dict:
        return {
            "blocks": [[s, e] for s, e in self.blocks],
            "discrepancies": [float(d) for d in self.discrepancies],
            "max_discrepancy": float(self.max_discrepancy),
        }


def check_similarity(S: np.ndarray) -> np.ndarray:
    S = np.asarray(S, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] != S.shape[1] or S.shape[0] == 0:
        raise ConfigError(f"similarity matrix must be square and non-empty, got shape {S.shape}")
    if not np.all(np.isfinite(S)):
        raise NumericsError("similarity matrix holds NaN or infinite values; check the backbone outputs")
    return S


def block_discrepancy(S: np.ndarray, s: int, e: int) -> float:
    """Discrepancy of block [s, e] (1-indexed inclusive)."""
    return 0.0 if s == e else float(S[s - 1, e - 1])


def _from_cuts(S: np.ndarray, ends: Sequence[int]) -> Partition:
    blocks, start = [], 1
    for e in ends:
        blocks.append((start, e))
        start = e + 1
    disc = [block_discrepancy(S, s, e) for s, e in blocks]
    return Partition(blocks=blocks, discrepancies=disc, max_discrepancy=max(disc))


def _backtrack(parent: Sequence[int], L: int) -> list[int]:
    ends, i = [], L
    while i > 0:
        ends.append(i)
        i = parent[i]
    return ends[::-1]


def partition_min_blocks(S: np.ndarray, eps: float) -> Partition:
    """Fewest blocks with every discrepancy <= eps; ties broken by the smallest worst
    discrepancy.

    The lexicographic cost (m, max) is optimal-substructure safe: for a fixed last block,
    a lexicographically better prefix never gives a worse whole, because adding the block
    raises m by one for every prefix and max(d, c) is monotone in d.
    """
    S = check_similarity(S)
    if not np.isfinite(eps) or eps < 0:
        raise ConfigError(f"eps must be a finite number >= 0, got {eps}")
    L = S.shape[0]
    # best[i] = (blocks, worst discrepancy) for layers 1..i; parent[i] = end of previous block
    best: list[tuple[float, float]] = [(0, 0.0)] + [(np.inf, np.inf)] * L
    parent = [0] * (L + 1)
    for i in range(1, L + 1):
        for j in range(i):  # last block is [j + 1, i]
            c = block_discrepancy(S, j + 1, i)
            if c > eps or best[j][0] == np.inf:
                continue
            cand = (best[j][0] + 1, max(best[j][1], c))
            if cand < best[i]:
                best[i], parent[i] = cand, j
    return _from_cuts(S, _backtrack(parent, L))


def partition_exact_k(S: np.ndarray, k: int) -> Partition:
    """Exactly ``k`` blocks with the smallest worst discrepancy (min-max DP)."""
    S = check_similarity(S)
    L = S.shape[0]
    if not 1 <= int(k) <= L:
        raise ConfigError(f"depth must be between 1 and the number of layers ({L}), got {k}")
    k = int(k)
    # cost[m][i]: smallest worst discrepancy covering layers 1..i with m blocks
    cost = np.full((k + 1, L + 1), np.inf)
    cost[0, 0] = 0.0
    parent = np.zeros((k + 1, L + 1), dtype=np.int64)
    for m in range(1, k + 1):
        for i in range(m, L - (k - m) + 1):  # leave at least one layer per remaining block
            for j in range(m - 1, i):
                cand = max(cost[m - 1, j], block_discrepancy(S, j + 1, i))
                if cand < cost[m, i]:
                    cost[m, i], parent[m, i] = cand, j
    ends, i = [], L
    for m in range(k, 0, -1):
        ends.append(i)
        i = int(parent[m, i])
    return _from_cuts(S, ends[::-1])


def eps_sweep(S: np.ndarray, eps_values: Iterable[float]) -> list[int]:
    """Number of blocks of the min-blocks partition for each eps."""
    return [partition_min_blocks(S, float(eps)).n_blocks for eps in eps_values]


def default_eps_grid(S: np.ndarray, n: int = 41) -> np.ndarray:
    """Evenly spaced eps from 0 to the largest discrepancy (where one block suffices)."""
    S = check_similarity(S)
    top = float(S.max()) if S.size > 1 else 0.0
    return np.linspace(0.0, top, n)
