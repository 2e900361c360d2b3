"""The tiny ViT teacher the compression tests share: vit-s14-tiny with random weights, whose
LayerScale gammas are redrawn in [0.2, 1.0] (timm's random init leaves them at 1e-5, which
would make every layer nearly the identity and every student trivially close)."""

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
