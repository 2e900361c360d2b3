"""The merge-plan dynamic programmes against brute force over every contiguous partition."""

from __future__ import annotations


import numpy as np
import pytest

from pathtwt.compress.partition import (
    default_eps_grid,
    eps_sweep,
    partition_exact_k,
    partition_min_blocks,
)
from pathtwt.errors import ConfigError, NumericsError


def all_partitions(L: int):
    """Every split of 1..L into contiguous blocks: one per subset of the L - 1 cut points."""
    for mask in range(1 << (L - 1)):
        ends = [i for i in range(1, L) if mask >> (i - 1) & 1] + [L]
        start, blocks = 1, []
        for e in ends:
            blocks.append((start, e))
            start = e + 1
        yield blocks


def worst(S, blocks):
    return max(0.0 if s == e else S[s - 1, e - 1] for s, e in blocks)


def random_matrix(rng, L, kind):
    if kind == "distance":  # symmetric, zero diagonal, growing away from the diagonal
        x = np.cumsum(rng.uniform(0, 1, L))
        S = np.abs(x[:, None] - x[None, :]) / x[-1]
    else:  # symmetric, zero diagonal, no structure: far layers can be closer than near ones
        S = rng.uniform(0, 1, (L, L))
        S = (S + S.T) / 2
        np.fill_diagonal(S, 0.0)
    return S


CASES = [(L, kind, seed) for L in (1, 2, 5, 9, 12) for kind in ("distance", "non-monotone") for seed in range(3)]


@pytest.mark.parametrize("L,kind,seed", CASES)
def test_exact_k_matches_brute_force(L, kind, seed):
    rng = np.random.default_rng(seed)
    S = random_matrix(rng, L, kind)
    parts = list(all_partitions(L))
    assert len(parts) == 2 ** (L - 1)
    for k in range(1, L + 1):
        best = min(worst(S, p) for p in parts if len(p) == k)
        got = partition_exact_k(S, k)
        assert got.n_blocks == k
        assert got.blocks in parts  # contiguous and covering 1..L
        assert got.max_discrepancy == pytest.approx(best, abs=1e-12)
        assert worst(S, got.blocks) == pytest.approx(got.max_discrepancy, abs=1e-12)


@pytest.mark.parametrize("L,kind,seed", CASES)
def test_min_blocks_matches_brute_force(L, kind, seed):
    rng = np.random.default_rng(100 + seed)
    S = random_matrix(rng, L, kind)
    parts = list(all_partitions(L))
    for eps in [0.0, *np.quantile(S, [0.2, 0.5, 0.8]), S.max()]:
        feasible = [p for p in parts if worst(S, p) <= eps]
        best = min((len(p), worst(S, p)) for p in feasible)
        got = partition_min_blocks(S, eps)
        assert (got.n_blocks, got.max_discrepancy) == (best[0], pytest.approx(best[1], abs=1e-12))
        assert all(d <= eps for d in got.discrepancies)


def test_tie_break_prefers_smaller_worst_discrepancy():
    # Two 2-block plans fit eps = 0.5: [1-2][3] (worst 0.5) and [1][2-3] (worst 0.1)
    S = np.array([[0, 0.5, 0.9], [0.5, 0, 0.1], [0.9, 0.1, 0]])
    got = partition_min_blocks(S, 0.5)
    assert got.blocks == [(1, 1), (2, 3)]
    assert got.max_discrepancy == pytest.approx(0.1)


@pytest.mark.parametrize("kind", ["distance", "non-monotone"])
def test_eps_sweep_is_monotone(kind):
    for seed in range(5):
        S = random_matrix(np.random.default_rng(seed), 12, kind)
        grid = default_eps_grid(S, n=60)
        counts = eps_sweep(S, grid)
        assert counts[0] == 12  # off-diagonal entries are all > 0: eps = 0 merges nothing
        assert counts[-1] == 1  # the largest discrepancy admits one block
        assert all(a >= b for a, b in zip(counts, counts[1:])), counts


def test_invalid_inputs_raise_one_line_errors():
    S = random_matrix(np.random.default_rng(0), 4, "distance")
    with pytest.raises(ConfigError, match="depth"):
        partition_exact_k(S, 5)
    with pytest.raises(ConfigError, match="eps"):
        partition_min_blocks(S, -0.1)
    S[0, 1] = np.nan
    with pytest.raises(NumericsError):
        partition_exact_k(S, 2)
