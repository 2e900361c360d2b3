"""bf16 autocast over fp32 weights, and the guards that keep it only where its numbers agree
with fp32: the one place a run switches precision.

Whether a run asks for bf16 at all is :func:`pathtwt.models.precision.resolve_precision`'s
decision. Here:

* :func:`autocast` and :func:`bf16_attention` (training) and :meth:`AutoPrecision.context`
  (inference): bf16 autocast, with timm's attention computed explicitly on CPU
  (:func:`explicit_attention`). timm calls ``F.scaled_dot_product_attention``, whose fused
  CPU kernel takes as long in bf16 as in fp32 (``torch.profiler``, ViT-S, one thread: ~240
  ms per 4-tile forward either way, 13 % of the fp32 forward, 28 % of the bf16 one), while
  q @ k^T and @ v as explicit bf16 matrix multiplies (softmax in fp32 under autocast) run
  on the bf16 matrix units (a ViT-S distillation step 1.34x faster;
  ``benchmarks/cpu_precision.py`` measures both). Nothing changes in fp32 or on GPUs.
* :func:`check_bf16_on` (extraction and the tile probe): the run's first
  :data:`BF16_CHECK_TILES` tiles embedded in fp32 and in bf16; bf16 is kept when every
  tile's cosine is at least :data:`BF16_MIN_COSINE`, else the run falls back to fp32 and
  says so.
* distillation's own guard, the first step's loss in fp32 and in bf16, is
  :mod:`pathtwt.compress.bf16_step`.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

from pathtwt.models.embedding import embed_tiles

# bf16 autocast is kept only when its embeddings of the run's first tiles agree with fp32
# ones at least this well (cosine, worst tile)
BF16_MIN_COSINE = 0.999
# the first tiles a run embeds twice (fp32 and bf16) to decide: enough to catch a model or
# kernel whose bf16 numerics break, few enough that a job does not pay a full fp32 batch
# (ViT-S on 2 CPU cores: about 0.2 s a tile in fp32)
BF16_CHECK_TILES = 8
log = logging.getLogger(__name__)


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


def autocast(device: str, precision: str) -> Any:
    """bf16 autocast on ``device``'s type, or nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def bf16_attention(modules: list[nn.Module], device: str, precision: str) -> contextlib.ExitStack:
    """Within the block, bf16 on CPU computes the attention of ``modules`` explicitly (see
    the module doc). Nothing changes in fp32 or on GPUs."""
    stack = contextlib.ExitStack()
    if precision == "bf16" and torch.device(device).type == "cpu":
        for module in modules:
            stack.enter_context(explicit_attention(module))
    return stack


@dataclass
class AutoPrecision:
    """The precision a run embeds in: bf16 autocast over the fp32 model, or plain fp32,
    decided once per run by :func:`check_bf16_on` on its first tiles."""

    bf16: bool = False
    note: str = "not checked"

    def context(self, device: Any, model: torch.nn.Module | None = None):
        """bf16 autocast; on CPU also ``model``'s attention computed explicitly."""
        if not self.bf16:
            return contextlib.nullcontext()
        kind = torch.device(device).type
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast(device_type=kind, dtype=torch.bfloat16))
        if kind == "cpu" and model is not None:
            stack.enter_context(explicit_attention(model))
        return stack

    def job_context(self, device: Any, model: torch.nn.Module):
        """:meth:`context` for a whole job of forward passes: also the weights autocast
        would cast to bf16 on every forward (those of linear and convolution layers) cast
        once, for the job (:func:`weights_cast_once`)."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.context(device, model))
        if self.bf16:
            stack.enter_context(weights_cast_once(model))
        return stack

    def attrs(self) -> dict[str, Any]:
        return {"precision": "bf16-autocast" if self.bf16 else "fp32", "precision_check": self.note}


@contextlib.contextmanager
def weights_cast_once(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, the fp32 weights and biases of ``model``'s linear and convolution
    layers are bf16 copies. Autocast casts exactly these to bf16 at every forward (linear
    and convolution are on its bf16 list, and a bf16 tensor is left as it is), so the
    outputs are bit for bit those of plain autocast, without a cast of every weight per
    forward pass (on a GPU, a kernel per weight per batch). The model's first parameter is
    left alone: it sets the dtype inputs are given (:func:`pathtwt.models.embedding.embed_tiles`)."""
    first = next(model.parameters(), None)
    swapped: list[tuple[nn.Parameter, torch.Tensor]] = []
    try:
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
                for param in module.parameters(recurse=False):
                    if param is not first and param.dtype == torch.float32:
                        swapped.append((param, param.data))
                        param.data = param.data.to(torch.bfloat16)
        yield model
    finally:
        for param, data in swapped:
            param.data = data


def check_bf16_on(model: torch.nn.Module, x: torch.Tensor, num_prefix_tokens: int, *, where: str,
                  tool: str) -> AutoPrecision:
    """Embed the batch ``x`` (its first :data:`BF16_CHECK_TILES` tiles) in fp32 and under
    bf16 autocast; bf16 is kept if every tile's cosine is at least BF16_MIN_COSINE, else the
    run falls back to fp32 and says so. ``where`` names the tiles in the log line (the
    returned note names only the outcome: a file must not depend on which tiles a possibly
    resumed run checked first); ``tool`` prefixes the printed fall-back line."""
    x = x[:BF16_CHECK_TILES]
    with torch.inference_mode():
        ref = embed_tiles(model, x, num_prefix_tokens).float()
        with AutoPrecision(bf16=True).context(x.device, model):
            low = embed_tiles(model, x, num_prefix_tokens).float()
    cosine = float(torch.nn.functional.cosine_similarity(ref, low, dim=1).min())
    measured = f"worst cosine to fp32 {cosine:.6f} on the first {len(x)} tiles of {where}"
    if cosine >= BF16_MIN_COSINE:
        log.info("bf16 autocast kept: %s", measured)
        return AutoPrecision(bf16=True, note=f"bf16 autocast kept: first-tiles cosine to fp32 >= {BF16_MIN_COSINE}")
    log.warning("fell back to fp32: bf16 autocast %s < %s", measured, BF16_MIN_COSINE)
    print(f"{tool}: fell back to fp32: bf16 autocast {measured} < {BF16_MIN_COSINE}", flush=True)
    return AutoPrecision(bf16=False, note=f"fell back to fp32: first-tiles bf16 cosine to fp32 < {BF16_MIN_COSINE}")
