"""Deterministic, position-addressed randomness for the synthetic slides.

Every pixel value is a function of its level-0 coordinates and the slide's key, never of
the order in which regions are rendered. That is what lets the TIFF writer render any
tile of any level independently (bounded memory for huge slides), and lets tests compare
a tile read back from the file with the generator's own pixels.
"""

from __future__ import annotations

import cv2
import numpy as np
from scipy import ndimage

_M1 = np.uint32(0x85EBCA6B)
_M2 = np.uint32(0xC2B2AE35)


def hash_uniform(ix: np.ndarray, iy: np.ndarray, *, key: int, channel: int = 0) -> np.ndarray:
    """Uniform [0, 1) float32 values, one per integer lattice point (ix, iy).

    A murmur3-style finaliser over the mixed coordinates: cheap, vectorised, and
    statistically good enough for textures and nucleus placement.
    """
    ix = np.asarray(ix, dtype=np.int64).astype(np.uint32)
    iy = np.asarray(iy, dtype=np.int64).astype(np.uint32)
    salt = np.uint32((key * 0x27D4EB2F + channel * 0x165667B1 + 0x9E3779B9) & 0xFFFFFFFF)
    h = ix * np.uint32(0x8DA6B343) ^ iy * np.uint32(0xD8163841) ^ salt
    h ^= h >> np.uint32(16)
    h *= _M1
    h ^= h >> np.uint32(13)
    h *= _M2
    h ^= h >> np.uint32(16)
    return (h >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / (1 << 24))


def _axis_weights(u: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # Linear interpolation between lattice points floor(u) and floor(u)+1, clamped to the grid.
    i0 = np.floor(u).astype(np.int64)
    f = (u - i0).astype(np.float32)
    return np.clip(i0, 0, n - 1), np.clip(i0 + 1, 0, n - 1), f


def sample_grid(grid: np.ndarray, *, u0: float, v0: float, step: float, w: int, h: int) -> np.ndarray:
    """Bilinear samples of ``grid`` (ny, nx[, C<=4]) at lattice positions
    (u0 + j * step, v0 + i * step) for a (h, w) output; positions outside the grid take
    the nearest edge value. An affine warp, so OpenCV does it in one pass."""
    matrix = np.array([[step, 0.0, u0], [0.0, step, v0]], dtype=np.float64)
    src = np.ascontiguousarray(grid, dtype=np.float32)
    return cv2.warpAffine(
        src, matrix, (w, h), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_REPLICATE
    )


def bilinear_points(grid: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Sample ``grid`` at scattered points (u[k], v[k]) in lattice units."""
    ny, nx = grid.shape[:2]
    x0, x1, fx = _axis_weights(u, nx)
    y0, y1, fy = _axis_weights(v, ny)
    if grid.ndim == 3:
        fx, fy = fx[:, None], fy[:, None]
    top = grid[y0, x0] * (1 - fx) + grid[y0, x1] * fx
    bottom = grid[y1, x0] * (1 - fx) + grid[y1, x1] * fx
    return top * (1 - fy) + bottom * fy


def value_noise(x: float, y: float, *, step: float, w: int, h: int, scale: float, key: int, channel: int) -> np.ndarray:
    """Smooth noise in [0, 1) over a (h, w) output whose pixel (i, j) sits at level-0
    position (x + j * step, y + i * step), with feature size ``scale``: hashed lattice
    values every ``scale`` pixels, interpolated."""
    ix0, iy0 = int(np.floor(x / scale)), int(np.floor(y / scale))
    ix = np.arange(ix0, int(np.floor((x + w * step) / scale)) + 2)
    iy = np.arange(iy0, int(np.floor((y + h * step) / scale)) + 2)
    lattice = hash_uniform(ix[None, :], iy[:, None], key=key, channel=channel)
    return sample_grid(lattice, u0=x / scale - ix0, v0=y / scale - iy0, step=step / scale, w=w, h=h)


def smooth_field(rng: np.random.Generator, shape: tuple[int, int], sigma_cells: float) -> np.ndarray:
    """Gaussian-filtered white noise on the coarse scene grid, rescaled to zero mean and
    unit standard deviation (so thresholds mean the same at every scale). Wide filters
    run on a proportionally coarser grid and are interpolated up: same field statistics,
    a fraction of the cost."""
    factor = max(1.0, sigma_cells / 4.0)
    small = (max(2, int(np.ceil(shape[0] / factor)) + 1), max(2, int(np.ceil(shape[1] / factor)) + 1))
    field = ndimage.gaussian_filter(rng.standard_normal(small).astype(np.float32), sigma=max(sigma_cells / factor, 0.5), mode="reflect")
    if small != shape:
        field = sample_grid(field, u0=0.0, v0=0.0, step=1.0 / factor, w=shape[1], h=shape[0])
    field -= field.mean()
    std = float(field.std())
    return field / std if std > 0 else field


def signed_distance(field: np.ndarray, cell: float) -> np.ndarray:
    """Turn a smooth implicit field (region where > 0) into an approximate signed distance
    in level-0 pixels (field / |gradient|), so edges rendered from it have a fixed width
    in pixels whatever the slope of the field."""
    gy, gx = np.gradient(field.astype(np.float32))
    grad = np.hypot(gx, gy) / cell
    return field / np.maximum(grad, 1e-6 + 0.05 * float(np.median(grad)))
