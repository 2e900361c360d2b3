"""Training-time augmentation of distillation tiles: colour jitter and Gaussian blur, applied
to a whole batch on the device it trains on.

Tiles arrive as uint8 (the DataLoader workers only read and resize them); the batch is
augmented where the model runs, a handful of batched kernels per micro-batch instead of
~10 small ones per tile on a reading core, then normalised with the backbone's own mean
and std (:meth:`pathtwt.models.transform.TileTransform.normalise_batch`). Each tile's parameters come from its own seed,
derived from (run seed, stream position) and drawn on the CPU with a private generator:
a tile is augmented the same whichever rank draws it and whether or not the run was
resumed, and augmentation never touches the global RNG stream.

The colour jitter follows torchvision's ``ColorJitter`` (brightness, contrast, saturation
and hue factors drawn uniformly, applied in a random order per tile); the hue shift is a
rotation of the chroma plane in YIQ space (as NVIDIA DALI's hue operator), one 3 x 3
matrix per tile, rather than a round trip through HSV. The blur is a separable Gaussian
of a drawn sigma, reflect-padded, on a drawn share of the tiles.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from pathtwt.compress.device_copies import to_device

# ITU-R 601 luma, as torchvision's rgb_to_grayscale
LUMA = (0.2989, 0.587, 0.114)
RGB_TO_YIQ = ((0.299, 0.587, 0.114), (0.596, -0.274, -0.322), (0.211, -0.523, 0.312))
OPERATIONS = ("brightness", "contrast", "saturation", "hue")


@dataclass(frozen=True)
class AugmentConfig:
    brightness: float = 0.2
    contrast: float = 0.2
    saturation: float = 0.2
    hue: float = 0.05  # small: H&E colour carries meaning, only stain variation is mimicked
    blur_probability: float = 0.3
    blur_kernel: int = 5
    blur_sigma: tuple[float, float] = (0.1, 1.5)


def step_seed(seed: int, step: int) -> int:
    # Large odd multiplier keeps (seed, step) pairs from colliding for realistic values.
    return (int(seed) * 1_000_003 + int(step)) % (2**63 - 1)


@dataclass(frozen=True)
class TileDraws:
    """One batch's augmentation parameters, a row per tile (CPU tensors)."""

    factors: torch.Tensor  # (N, 4): brightness, contrast, saturation factors and hue shift (turns)
    order: torch.Tensor  # (N, 4): the operations in the order each tile applies them
    blur: torch.Tensor  # (N,) bool
    sigma: torch.Tensor  # (N,)


class BatchAugmenter:
    """Colour jitter (every tile) and Gaussian blur (a fraction of tiles) of a batch."""

    def __init__(self, config: AugmentConfig | None = None) -> None:
        self.config = config or AugmentConfig()

    def draw(self, seeds: Sequence[int]) -> TileDraws:
        """Each tile's parameters from its own seed (see the module doc)."""
        cfg = self.config
        low = torch.tensor([1 - cfg.brightness, 1 - cfg.contrast, 1 - cfg.saturation, -cfg.hue], dtype=torch.float64)
        high = torch.tensor([1 + cfg.brightness, 1 + cfg.contrast, 1 + cfg.saturation, cfg.hue], dtype=torch.float64)
        factors, order, blur, sigma = [], [], [], []
        for seed in seeds:
            g = torch.Generator().manual_seed(int(seed))
            order.append(torch.randperm(4, generator=g))
            factors.append(low + (high - low) * torch.rand(4, generator=g, dtype=torch.float64))
            blur.append(bool(torch.rand((), generator=g) < cfg.blur_probability))
            lo, hi = cfg.blur_sigma
            sigma.append(lo + (hi - lo) * float(torch.rand((), generator=g)))
        return TileDraws(torch.stack(factors).float(), torch.stack(order), torch.tensor(blur, dtype=torch.bool),
                         torch.tensor(sigma, dtype=torch.float32))

    def __call__(self, tiles: torch.Tensor, seeds: Sequence[int]) -> torch.Tensor:
        """uint8 or float (N, 3, H, W) tiles with values in [0, 255] -> augmented float32 in
        [0, 255] on the same device, deterministic in ``seeds`` (one per tile)."""
        if len(seeds) != len(tiles):
            raise ValueError(f"{len(seeds)} seeds for {len(tiles)} tiles")
        draws = self.draw(seeds)
        x = tiles.float() / 255.0
        # The draws reach the device in one copy that does not wait for it, and each
        # operation runs on the whole batch and is kept where drawn (torch.where): picking
        # its tiles on the device (nonzero) would wait for the device at every one of the 16
        # operation slots and the blur. The constants are made once per device.
        packed = torch.cat([draws.factors, draws.order.float(), draws.blur.float()[:, None], draws.sigma[:, None]], 1)
        packed = to_device(packed, x.device)
        factors, order, blur, sigma = packed[:, :4], packed[:, 4:8], packed[:, 8] > 0, packed[:, 9]
        for slot in range(4):
            for op, name in enumerate(OPERATIONS):
                drawn = (order[:, slot] == op).view(-1, 1, 1, 1)
                x = torch.where(drawn, getattr(self, f"_{name}")(x, factors[:, op]), x)
        x = torch.where(blur.view(-1, 1, 1, 1), gaussian_blur(x, sigma, self.config.blur_kernel), x)
        return x * 255.0

    @staticmethod
    def _brightness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        return (x * f.view(-1, 1, 1, 1)).clamp_(0, 1)

    @staticmethod
    def _contrast(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        mean = _grey(x).mean(dim=(-3, -2, -1), keepdim=True)
        return _blend(x, mean, f)

    @staticmethod
    def _saturation(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        return _blend(x, _grey(x), f)

    @staticmethod
    def _hue(x: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
        yiq, yiq_inv = _yiq_matrices(x.dtype, x.device)
        angle = 2 * math.pi * turns
        cos, sin = torch.cos(angle), torch.sin(angle)
        rotation = torch.zeros(len(x), 3, 3, dtype=x.dtype, device=x.device)
        rotation[:, 0, 0] = 1
        rotation[:, 1, 1], rotation[:, 1, 2] = cos, -sin
        rotation[:, 2, 1], rotation[:, 2, 2] = sin, cos
        matrix = yiq_inv @ rotation @ yiq  # (N, 3, 3): RGB -> rotated RGB
        return torch.einsum("nij,njhw->nihw", matrix, x).clamp_(0, 1)


@functools.lru_cache(maxsize=None)
def _yiq_matrices(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """RGB -> YIQ and its inverse on ``device``, made once per dtype and device: inverted on
    the CPU (on a GPU linalg.inv waits for the device to check its status) and copied once,
    not at every micro-batch."""
    yiq = torch.tensor(RGB_TO_YIQ, dtype=dtype)
    return yiq.to(device), torch.linalg.inv(yiq).to(device)


@functools.lru_cache(maxsize=None)
def _luma(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The luma weights (1, 3, 1, 1) on ``device``, copied there once."""
    return torch.tensor(LUMA, dtype=dtype).view(1, 3, 1, 1).to(device)


def _grey(x: torch.Tensor) -> torch.Tensor:
    return (x * _luma(x.dtype, x.device)).sum(dim=1, keepdim=True)


def _blend(x: torch.Tensor, other: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    f = f.view(-1, 1, 1, 1)
    return (f * x + (1 - f) * other).clamp_(0, 1)


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, kernel: int) -> torch.Tensor:
    """(N, C, H, W) blurred by a separable Gaussian of ``kernel`` taps and a sigma per tile,
    reflect-padded (as torchvision's GaussianBlur): one grouped convolution per axis."""
    n, c, h, w = x.shape
    half = (kernel - 1) / 2
    taps = torch.linspace(-half, half, kernel, device=x.device, dtype=x.dtype)
    weights = torch.exp(-0.5 * (taps.view(1, -1) / sigma.view(-1, 1)) ** 2)
    weights = (weights / weights.sum(dim=1, keepdim=True)).repeat_interleave(c, dim=0)  # (N C, k)
    pad = kernel // 2
    y = torch.nn.functional.pad(x.reshape(1, n * c, h, w), (pad, pad, pad, pad), mode="reflect")
    y = torch.nn.functional.conv2d(y, weights.view(n * c, 1, 1, kernel), groups=n * c)
    y = torch.nn.functional.conv2d(y, weights.view(n * c, 1, kernel, 1), groups=n * c)
    return y.view(n, c, h, w)
