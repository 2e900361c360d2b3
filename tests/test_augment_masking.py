"""The batch augmentation applies each drawn operation by masking on the device
(torch.where over the whole batch) instead of gathering the drawn tiles (a nonzero, which
waits for the device): the tiles come out bit for bit as when each operation is applied
to exactly the tiles that drew it, in their drawn order."""

from __future__ import annotations

import torch

from pathtwt.compress.augment import OPERATIONS, BatchAugmenter, gaussian_blur


def _per_drawn_tiles(augmenter: BatchAugmenter, tiles: torch.Tensor, seeds: list[int]) -> torch.Tensor:
    draws = augmenter.draw(seeds)
    x = tiles.float() / 255.0
    for slot in range(4):
        for op, name in enumerate(OPERATIONS):
            rows = torch.nonzero(draws.order[:, slot] == op).flatten()
            if len(rows):
                x[rows] = getattr(augmenter, f"_{name}")(x[rows], draws.factors[rows, op])
    rows = torch.nonzero(draws.blur).flatten()
    if len(rows):
        x[rows] = gaussian_blur(x[rows], draws.sigma[rows], augmenter.config.blur_kernel)
    return x * 255.0


def test_masked_augmentation_equals_the_per_tile_one_bit_for_bit():
    augmenter = BatchAugmenter()
    generator = torch.Generator().manual_seed(0)
    tiles = torch.randint(0, 256, (12, 3, 40, 40), dtype=torch.uint8, generator=generator)
    seeds = [7919 * i + 3 for i in range(len(tiles))]
    draws = augmenter.draw(seeds)
    assert 0 < int(draws.blur.sum()) < len(tiles)  # both branches of the blur mask are exercised
    expected = _per_drawn_tiles(augmenter, tiles, seeds)
    assert torch.equal(augmenter(tiles, seeds), expected)
    assert not torch.equal(expected, tiles.float())  # the check is not vacuous
