"""The tiny ViT teacher the compression tests share: vit-s14-tiny with random weights, whose
LayerScale gammas are redrawn in [0.2, 1.0] (timm's random init leaves them at 1e-5, which
would make every layer nearly the identity and every student trivially close), and a
calibration set of random tiles for it."""

from __future__ import annotations

import torch

from pathtwt.models.registry import Backbone, create_backbone


def tiny_teacher(seed: int) -> Backbone:
    bb = create_backbone("vit-s14-tiny", pretrained=False, init_seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for blk in bb.model.blocks:
            for ls in (blk.ls1, blk.ls2):
                ls.gamma.copy_(torch.rand(ls.gamma.shape, generator=g) * 0.8 + 0.2)
    return bb


def tiny_calibration():
    """Random 56 px calibration tiles for the tiny teacher: 8 fit, 4 select, 4 report."""
    import numpy as np

    from pathtwt.compress.calibration import CalibrationSet

    def tiles(n: int, seed: int) -> np.ndarray:
        return np.random.default_rng(seed).integers(0, 256, size=(n, 56, 56, 3), dtype=np.uint8)

    return CalibrationSet(fit=tiles(8, 1), select=tiles(4, 3), report=tiles(4, 2), patch_size=56, seed=0)
