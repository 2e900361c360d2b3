"""ABMIL and TransMIL heads: shapes for any bag size, the Nystrom attention against exact
attention, and no fixed device or dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pathtwt.mil.heads import build_head
from pathtwt.mil.models import ABMIL, NystromAttention, TransMIL, iterative_pinv
from pathtwt.mil.train import torch_threads


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with torch_threads(1):  # tiny heads, one bag per step: threads only add overhead
        yield


@pytest.mark.parametrize("aggregator", ["abmil", "transmil"])
@pytest.mark.parametrize("n_tiles", [1, 2, 5, 17, 70])
def test_heads_return_logits_and_one_score_per_tile(aggregator, n_tiles):
    torch.manual_seed(0)
    head = build_head(aggregator, in_dim=12, n_classes=4, hidden_dim=32, dropout=0.0, heads=4, landmarks=8)
    logits, attention = head(torch.randn(n_tiles, 12))
    assert logits.shape == (1, 4) and attention.shape == (n_tiles,)
    assert torch.isfinite(logits).all() and torch.isfinite(attention).all()
    logits3, _ = head(torch.randn(1, n_tiles, 12))
    assert logits3.shape == (1, 4)
    with pytest.raises(ValueError):
        head(torch.randn(2, n_tiles, 12))  # one bag at a time


def test_abmil_attention_is_a_distribution_and_pools_accordingly():
    torch.manual_seed(0)
    head = ABMIL(in_dim=6, n_classes=3, hidden_dim=16, attention_dim=8, dropout=0.0).eval()
    x = torch.randn(9, 6)
    logits, attention = head(x)
    assert attention.sum().item() == pytest.approx(1.0, abs=1e-6) and (attention >= 0).all()
    expected = head.classifier(attention @ head.project(x))
    assert torch.allclose(logits[0], expected, atol=1e-6)


def test_iterative_pinv_inverts_attention_kernels():
    torch.manual_seed(0)
    kernel = torch.softmax(torch.randn(3, 16, 16, dtype=torch.float64), dim=-1)
    approx = iterative_pinv(kernel, iterations=30)
    assert torch.allclose(approx, torch.linalg.pinv(kernel), atol=1e-6)


def test_nystrom_attention_is_exact_when_every_token_is_a_landmark():
    torch.manual_seed(0)
    dim, heads, n = 16, 2, 12
    layer = NystromAttention(dim=dim, heads=heads, landmarks=n, pinv_iterations=40, dropout=0.0).double().eval()
    x = torch.randn(1, n, dim, dtype=torch.float64)
    out, row = layer(x, attend_from=3)
    q, k, v = (t.reshape(1, n, heads, dim // heads).transpose(1, 2) for t in layer.to_qkv(x).chunk(3, dim=-1))
    exact_attention = torch.softmax(q * layer.scale @ k.transpose(-1, -2), dim=-1)
    exact = exact_attention @ v + layer.value_conv(v)
    exact = layer.to_out(exact.transpose(1, 2).reshape(1, n, dim))
    assert torch.allclose(out, exact, atol=1e-6)
    assert torch.allclose(row[0], exact_attention[0, :, 3].mean(0), atol=1e-6)


def test_nystrom_pads_to_landmark_multiple_and_keeps_length():
    layer = NystromAttention(dim=8, heads=2, landmarks=4, dropout=0.0)
    out, row = layer(torch.randn(1, 10, 8), attend_from=0)
    assert out.shape == (1, 10, 8) and row.shape == (1, 10)


def test_no_fixed_device_or_dtype():
    # meta tensors carry no data: any tensor created on a hard-coded device would clash
    for head in (ABMIL(in_dim=8, n_classes=2, hidden_dim=16), TransMIL(in_dim=8, n_classes=2, hidden_dim=16, heads=2, landmarks=4)):
        meta_logits, meta_attention = head.to("meta")(torch.randn(11, 8, device="meta"))
        assert meta_logits.device.type == "meta" and meta_attention.device.type == "meta"
        logits, _ = head.to_empty(device="cpu").double()(torch.randn(11, 8, dtype=torch.float64))
        assert logits.dtype == torch.float64


def test_feature_standardizer_uses_pooled_instance_statistics():
    from pathtwt.mil.models import FeatureStandardizer

    rng = np.random.default_rng(0)
    bags = [rng.normal(5.0, 3.0, size=(n, 4)).astype(np.float32) for n in (7, 11, 2)]
    bags[0][:, 3] = 1.0  # a constant dimension keeps unit scale
    for bag in bags[1:]:
        bag[:, 3] = 1.0
    scaler = FeatureStandardizer(4)
    scaler.fit(bags)
    pooled = np.concatenate(bags)
    assert np.allclose(scaler.mean.numpy(), pooled.mean(0), atol=1e-5)
    assert np.allclose(scaler.std.numpy()[:3], pooled.std(0)[:3], atol=1e-4)
    assert scaler.std[3].item() == 1.0
    out = scaler(torch.from_numpy(pooled)).numpy()
    assert np.allclose(out[:, :3].mean(0), 0.0, atol=1e-5) and np.allclose(out[:, :3].std(0), 1.0, atol=1e-4)
    # the statistics are buffers: they travel with the head's state dict
    head = build_head("abmil", in_dim=4, n_classes=2, hidden_dim=8, dropout=0.0)
    head.standardize.fit(bags)
    assert torch.equal(head.state_dict()["standardize.mean"], scaler.mean)
