"""Parameter and MAC counting (pathtwt.models.flops) against the paper's figures and an
independent operator-level count."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from pathtwt.models.registry import build_timm_model, create_backbone, get_spec
from pathtwt.models.flops import count_macs, count_params, describe_cost, meta_model
from pathtwt.models.layer_patches import apply_layer_patches


@pytest.fixture(scope="module")
def h0_mini_meta():
    return meta_model("h0-mini")


def test_h0_mini_matches_paper_params_and_macs(h0_mini_meta):
    # The paper: 85.74 M parameters, 23.56 G (MACs) for the 12-layer H0-mini.
    assert round(count_params(h0_mini_meta) / 1e6, 2) == 85.74
    assert count_macs(h0_mini_meta) == pytest.approx(23.56e9, rel=0.01)


def test_five_layer_h0_mini_has_36_11_m_params():
    model = meta_model("h0-mini", depth=5)
    assert round(count_params(model) / 1e6, 2) == 36.11
    cost = describe_cost(model)
    assert cost["depth"] == 5 and cost["params"] == count_params(model)


def test_vit_s_and_hibou_counts():
    assert count_params(meta_model("hibou-b")) == count_params(meta_model("h0-mini"))
    assert round(count_params(meta_model("vit-s14-imgfocus")) / 1e6, 2) == 21.63


def _operator_macs(model: nn.Module, size: int) -> int:
    # Unfused attention so that QK^T and AV appear as matmuls the counter sees.
    for blk in model.blocks:
        if hasattr(blk.attn, "fused_attn"):
            blk.attn.fused_attn = False
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        model.forward_features(torch.zeros(1, 3, size, size))
    return counter.get_total_flops() // 2


@pytest.mark.parametrize("name", ["h0-mini-tiny", "vit-s14-tiny"])
def test_analytic_macs_equal_operator_count(name):
    model = create_backbone(name, pretrained=False).model
    assert count_macs(model) == _operator_macs(model, 56)
    # another input size (more tokens, quadratic attention term): the count for 84 px
    # asked of the 56 px model equals the operator count of the model built for 84 px
    spec = get_spec(name)
    big = build_timm_model(dataclasses.replace(spec, timm_kwargs={**spec.timm_kwargs, "img_size": 84}))
    assert count_macs(model, input_size=84) == _operator_macs(big, 84) > count_macs(model)


def test_attention_free_block_costs_only_its_mlp():
    model = create_backbone("h0-mini-tiny", pretrained=False).model
    full = count_macs(model)
    tokens, dim = 16 + 5, 64
    attention = tokens * dim * 3 * dim + tokens * dim * dim + 2 * tokens * tokens * dim
    apply_layer_patches(model, {"attention_free": [2, 7]})
    assert count_macs(model) == full - 2 * attention
    assert count_macs(model) == _operator_macs(model, 56)


def test_shared_block_counts_params_once_and_macs_per_use():
    model = create_backbone("vit-s14-tiny", pretrained=False).model
    params, macs = count_params(model), count_macs(model)
    per_block_params = sum(p.numel() for p in model.blocks[1].parameters())
    model.blocks[1] = model.blocks[0]  # block 0 applied twice (weight-shared recurrence)
    assert count_params(model) == params - per_block_params
    assert count_macs(model) == macs


def test_per_tile_modules_cost_in_times_out_once():
    from pathtwt.models.variant_layers import apply_baseline_patches

    spec = get_spec("vit-s14-tiny")
    plain = build_timm_model(spec, depth=2)
    probed = apply_baseline_patches(build_timm_model(spec, depth=2), {"embedding_probe": {"hidden": 10}})
    assert count_macs(probed) - count_macs(plain) == 2 * (128 * 10)  # one pooled vector, not 17 tokens


@pytest.mark.parametrize("name", ["h0-mini-tiny", "vit-s14-tiny"])
def test_paper_counting_adds_norms_and_drops_attention_matmuls(name):
    # the paper's counter: LayerNorm at 5 per element, no QK^T / AV under timm's fused attention
    model = create_backbone(name, pretrained=False).model
    spec = get_spec(name)
    tokens, dim, depth = 16 + spec.num_prefix_tokens, 64, len(model.blocks)
    attention = depth * 2 * tokens * tokens * dim
    norms = (2 * depth + 1) * 5 * tokens * dim
    assert count_macs(model, norms=True, attention=False) == count_macs(model) - attention + norms
    apply_layer_patches(model, {"attention_free": [0, 3]})  # norm1 gone with the attention
    assert count_macs(model, norms=True) == count_macs(model) + norms - 2 * 5 * tokens * dim
