"""Every layer's output tokens of a frozen timm ViT, through timm's own
``forward_intermediates`` (no forward hooks, so the tokens are exactly what the next
block receives). Outputs keep the prefix tokens (CLS and registers) in front of the patch
tokens, and no final norm is applied.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch


def layer_outputs(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The L block outputs, each (B, T, D) with T = prefix + patch tokens."""
    outs = model.forward_intermediates(
        x, indices=None, norm=False, output_fmt="NLC", intermediates_only=True, return_prefix_tokens=True
    )
    # timm returns (patch, prefix) pairs when the model has prefix tokens, tensors otherwise
    return [torch.cat([o[1], o[0]], dim=1) if isinstance(o, tuple) else o for o in outs]


def block_input(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Tokens entering block 1: patch embedding, position embedding and prefix tokens, as in
    timm's forward_features up to the first block."""
    x = model.patch_embed(x)
    x = model._pos_embed(x)
    x = model.patch_drop(x)
    return model.norm_pre(x)


def tiles_to_batch(
    transform: Callable, tiles: np.ndarray, device: torch.device, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """uint8 (B, P, P, 3) tiles -> normalised (B, 3, H, W) through the backbone's own
    transform, so the model never sees a mismatched normalisation."""
    return torch.stack([transform(np.ascontiguousarray(t)) for t in tiles]).to(device=device, dtype=dtype)


def iter_batches(tiles: Sequence[np.ndarray] | np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    for i in range(0, len(tiles), batch_size):
        yield np.asarray(tiles[i : i + batch_size])


@torch.inference_mode()
def iter_layer_outputs(
    model: torch.nn.Module,
    transform: Callable,
    tiles: Sequence[np.ndarray] | np.ndarray,
    *,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    with_input: bool = False,
    progress: Callable[[int], Any] | None = None,
) -> Iterator[list[torch.Tensor]]:
    """Yield, batch by batch, the float32 layer outputs (on ``device``) of a frozen model.

    With ``with_input`` the first list entry is the input to block 1, so entry l is the
    input of block l + 1 and the output of block l. ``progress`` is called with the
    number of tiles of each batch once it has been consumed (e.g. a tqdm bar's update).
    """
    device = torch.device(device)
    model.eval().to(device)
    dtype = next(model.parameters()).dtype  # bf16/fp16 backbones take inputs of their dtype
    for batch in iter_batches(tiles, batch_size):
        x = tiles_to_batch(transform, batch, device, dtype)
        outs = [o.float() for o in layer_outputs(model, x)]
        if with_input:
            outs = [block_input(model, x).float()] + outs
        yield outs
        if progress is not None:
            progress(len(batch))
