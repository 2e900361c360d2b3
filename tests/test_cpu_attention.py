"""bf16 autocast on CPU computes attention explicitly (pathtwt.models.bf16_guard): the
switches are restored afterwards, and the embeddings stay those of fp32 to bf16 rounding."""

from __future__ import annotations

import pytest
import torch

from pathtwt.features.extract import AutoPrecision
from pathtwt.models.bf16_guard import explicit_attention
from pathtwt.models.embedding import embed_tiles
from pathtwt.models.registry import create_backbone


@pytest.fixture(scope="module")
def backbone():
    b = create_backbone("h0-mini-tiny", pretrained=False, init_seed=3, precision="fp32")
    # timm's 1e-5 LayerScale makes a random ViT nearly the identity; larger gains make the
    # attention matter to the output
    with torch.no_grad():
        for blk in b.model.blocks:
            blk.ls1.gamma.fill_(0.5)
            blk.ls2.gamma.fill_(0.5)
    return b


def _switches(model):
    return [m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")]


def test_switches_are_restored_even_after_an_error(backbone):
    before = _switches(backbone.model)
    assert before and all(before)  # timm fuses by default
    with pytest.raises(RuntimeError, match="boom"):
        with explicit_attention(backbone.model):
            assert not any(_switches(backbone.model))
            raise RuntimeError("boom")
    assert _switches(backbone.model) == before


def test_auto_precision_uses_explicit_attention_on_cpu_only_in_bf16(backbone):
    model = backbone.model
    with AutoPrecision(bf16=True).context("cpu", model):
        assert torch.is_autocast_enabled("cpu") and not any(_switches(model))
    assert all(_switches(model)) and not torch.is_autocast_enabled("cpu")
    with AutoPrecision(bf16=False).context("cpu", model):
        assert all(_switches(model)) and not torch.is_autocast_enabled("cpu")


def test_explicit_bf16_embeddings_match_fp32_and_fused_bf16(backbone):
    torch.manual_seed(0)
    x = torch.randn(6, 3, 56, 56)
    prefix = backbone.spec.num_prefix_tokens
    with torch.inference_mode():
        ref = embed_tiles(backbone.model, x, prefix)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fused = embed_tiles(backbone.model, x, prefix).float()
        with AutoPrecision(bf16=True).context("cpu", backbone.model):
            explicit = embed_tiles(backbone.model, x, prefix).float()
    assert not torch.equal(explicit, fused)  # the other path was taken
    cos = torch.nn.functional.cosine_similarity
    assert float(cos(explicit, ref, dim=1).min()) > 0.999
    assert float(cos(explicit, fused, dim=1).min()) > 0.999
