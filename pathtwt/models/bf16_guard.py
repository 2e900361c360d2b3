"""``--precision auto`` on hardware with native bf16: bf16 autocast over an fp32 model,
kept for a run only when its embeddings of the run's first tiles agree with fp32 ones.

Extraction (:func:`pathtwt.features.extract.check_bf16`) and the tile probe decide this
once per run on their first :data:`BF16_CHECK_TILES` tiles; a run whose bf16 numerics
break (a model, a kernel) falls back to fp32 and says so. The distillation's own guard on
its first step's loss is :mod:`pathtwt.compress.bf16_check`."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import torch

from pathtwt.models.embedding import embed_tiles

# bf16 autocast is kept only when its embeddings of the run's first tiles agree with fp32
# ones at least this well (cosine, worst tile)
BF16_MIN_COSINE = 0.999
# the first tiles a run embeds twice (fp32 and bf16) to decide: enough to catch a model or
# kernel whose bf16 numerics break, few enough that a job does not pay a full fp32 batch
# (ViT-S on 2 CPU cores: about 0.2 s a tile in fp32)
BF16_CHECK_TILES = 8

log = logging.getLogger(__name__)


@dataclass
class AutoPrecision:
    """The precision a run embeds in: bf16 autocast over the fp32 model, or plain fp32,
    decided once per run by :func:`check_bf16_on` on its first tiles."""

    bf16: bool = False
    note: str = "not checked"

    def context(self, device: Any, model: torch.nn.Module | None = None):
        """bf16 autocast; on CPU also ``model``'s attention computed explicitly, whose bf16
        matrix multiplies beat the fused kernel (:mod:`pathtwt.models.cpu_attention`)."""
        if not self.bf16:
            return contextlib.nullcontext()
        kind = torch.device(device).type
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast(device_type=kind, dtype=torch.bfloat16))
        if kind == "cpu" and model is not None:
            from pathtwt.models.cpu_attention import explicit_attention

            stack.enter_context(explicit_attention(model))
        return stack

    def attrs(self) -> dict[str, Any]:
        return {"precision": "bf16-autocast" if self.bf16 else "fp32", "precision_check": self.note}


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
