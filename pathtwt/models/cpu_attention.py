"""Explicit attention for bf16 autocast on CPU.

timm's attention calls ``F.scaled_dot_product_attention``; on CPU its fused kernel takes
as long in bf16 as in fp32 (measured with ``torch.profiler``, ViT-S, one thread: ~240 ms
per 4-tile forward either way, 13 % of the fp32 forward, 28 % of the bf16 one), while the
explicit form, q @ k^T and @ v as bf16 matrix multiplies with the softmax in fp32 under
autocast, runs on the bf16 matrix units. ``benchmarks/cpu_precision.py`` measures both.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn


@contextlib.contextmanager
def explicit_attention(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, every timm attention module of ``model`` (those with a
    ``fused_attn`` switch) computes attention explicitly; the switches are restored after."""
    modules = [m for m in model.modules() if hasattr(m, "fused_attn")]
    before = [m.fused_attn for m in modules]
    try:
        for m in modules:
            m.fused_attn = False
        yield model
    finally:
        for m, b in zip(modules, before):
            m.fused_attn = b
