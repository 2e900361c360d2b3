"""Two-NN intrinsic dimension on data of known dimension, and against a plain reference."""

from __future__ import annotations

import numpy as np
import pytest

from pathtwt.analysis.intrinsic_dim import two_nn, two_nn_details

AMBIENT = 64


def linear_subspace(d: int, n: int, rng) -> np.ndarray:
    basis = np.linalg.qr(rng.standard_normal((AMBIENT, d)))[0]  # orthonormal d-frame in R^64
    return rng.standard_normal((n, d)) @ basis.T + 3.0  # offset: away from the origin


def curved_manifold(d: int, n: int, rng) -> np.ndarray:
    """Uniform points on the unit d-sphere (curved, no boundary), rotated into R^64."""
    x = rng.standard_normal((n, d + 1))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    rotation = np.linalg.qr(rng.standard_normal((AMBIENT, AMBIENT)))[0]
    return x @ rotation[: d + 1]


def reference_two_nn(X: np.ndarray, discard_fraction: float) -> float:
    """Facco et al. written out literally: all pairwise distances, sort each row."""
    n = len(X)
    mus = []
    for i in range(n):
        dist = sorted(float(np.linalg.norm(X[i] - X[j])) for j in range(n) if j != i)
        mus.append(dist[1] / dist[0])
    mus.sort()
    keep = min(int(np.floor(n * (1 - discard_fraction))), n - 1)  # F = 1 would be infinite
    xs = [np.log(mus[i]) for i in range(keep)]
    ys = [-np.log(1 - (i + 1) / n) for i in range(keep)]
    return sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)


@pytest.mark.parametrize("d", [2, 5, 10])
@pytest.mark.parametrize("generator", [linear_subspace, curved_manifold])
def test_recovers_known_dimension_within_10_percent(d, generator):
    X = generator(d, 2000, np.random.default_rng(d))
    assert two_nn(X) == pytest.approx(d, rel=0.10)


@pytest.mark.parametrize("discard", [0.0, 0.1, 0.3])
def test_agrees_with_reference_computation(discard):
    X = curved_manifold(3, 150, np.random.default_rng(7))
    got = two_nn(X, discard_fraction=discard)
    assert np.isfinite(got)
    assert got == pytest.approx(reference_two_nn(X, discard), rel=1e-9)


def test_duplicates_are_dropped_and_counted():
    rng = np.random.default_rng(0)
    X = linear_subspace(4, 300, rng)
    with_dups = np.concatenate([X, X[:25]])  # 25 points repeated exactly
    res = two_nn_details(with_dups)
    assert res.n_points == 325 and res.n_duplicates == 25
    assert res.dimension == pytest.approx(two_nn(X), rel=1e-12)
    assert np.isfinite(res.dimension)


def test_high_dimensional_flattened_features_work():
    # the flattened patch sequence is ~100k wide: a 3-d manifold in 20k dimensions
    rng = np.random.default_rng(1)
    X = curved_manifold(3, 400, rng) @ rng.standard_normal((AMBIENT, 20_000))
    assert two_nn(X) == pytest.approx(3, rel=0.15)
