"""Training-time augmentation of calibration tiles: colour jitter and Gaussian blur.

Applied to uint8 tiles before the backbone's own transform, so normalisation stays the
backbone's. Randomness comes from a seed derived from (run seed, step), drawn inside a
forked RNG: a resumed run therefore augments step t exactly as an uninterrupted one, and
augmentation never disturbs the global RNG stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


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


class TileAugmenter:
    """Random colour jitter (every tile) and Gaussian blur (a fraction of tiles), per tile."""

    def __init__(self, config: AugmentConfig | None = None) -> None:
        from torchvision.transforms import v2

        self.config = cfg = config or AugmentConfig()
        self._jitter = v2.ColorJitter(brightness=cfg.brightness, contrast=cfg.contrast, saturation=cfg.saturation, hue=cfg.hue)
        self._blur = v2.GaussianBlur(kernel_size=cfg.blur_kernel, sigma=cfg.blur_sigma)

    def __call__(self, tiles: np.ndarray, *, seed: int) -> np.ndarray:
        """``tiles`` uint8 (N, H, W, 3) -> augmented uint8 (N, H, W, 3), deterministic in ``seed``."""
        out = np.empty_like(tiles)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for i, tile in enumerate(tiles):
                t = torch.from_numpy(np.ascontiguousarray(tile)).permute(2, 0, 1)
                t = self._jitter(t)
                if torch.rand(()) < self.config.blur_probability:
                    t = self._blur(t)
                out[i] = t.permute(1, 2, 0).numpy()
        return out
