"""TWT building blocks: the stitched student, branch scalars and their folding, auditioning,
the loss-weight schedule and the method registry."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from pathtwt.models.registry import create_backbone
from pathtwt.compress.audition import AuditionOptions, audition, averaged_layer
from pathtwt.compress.pipeline import read_plan
from pathtwt.compress.registry import get_method, known_methods
from pathtwt.compress.schedule import cosine_lr_factor, default_alphas, ramp_weight, term_weights
from pathtwt.compress.student import (
    ScaledBlock,
    add_branch_scales,
    block_outputs,
    clone_layers,
    fold_branch_scales,
    stitch_student,
)
from pathtwt.errors import ConfigError


def _tiles(n: int, size: int = 56, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)


def _inputs(backbone, n: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.stack([backbone.transform(t) for t in _tiles(n, backbone.spec.input_size, seed)])


def _set_gammas(model: torch.nn.Module, value: float | None, *, seed: int = 0) -> None:
    """Give every LayerScale a real effect (random init leaves them at 1e-5)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for blk in model.blocks:
            for ls in (blk.ls1, blk.ls2):
                ls.gamma.copy_(torch.rand(ls.gamma.shape, generator=g) * 0.8 + 0.2 if value is None else torch.full_like(ls.gamma, value))


@pytest.fixture(scope="module")
def teacher():
    bb = create_backbone("vit-s14-tiny", pretrained=False)
    _set_gammas(bb.model, None)
    return bb


def _randomise_scalars(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for j, blk in enumerate(model.blocks):
            blk.attn_scale.fill_(0.6 + 0.1 * j)
            blk.mlp_scale.fill_(1.4 - 0.15 * j)


@pytest.mark.parametrize("layer_scale", [True, False], ids=["into-gamma", "into-proj-fc2"])
def test_folding_branch_scalars_changes_no_output(teacher, layer_scale):
    spec = teacher.spec
    if not layer_scale:
        spec = dataclasses.replace(spec, timm_kwargs={**spec.timm_kwargs, "init_values": None})
    layers = clone_layers(teacher.model, [0, 5, 11])
    if not layer_scale:
        from pathtwt.models.registry import build_timm_model

        torch.manual_seed(1)
        layers = list(build_timm_model(spec, depth=3).blocks)
        with torch.no_grad():  # timm's init makes the branches tiny; give them weight
            for blk in layers:
                blk.attn.proj.weight.mul_(30)
                blk.mlp.fc2.weight.mul_(30)
    student = stitch_student(teacher.model, layers, spec=spec)
    add_branch_scales(student)
    assert all(isinstance(b, ScaledBlock) for b in student.blocks)
    _randomise_scalars(student)
    x = _inputs(teacher)
    with torch.no_grad():
        wrapped = student.forward_features(x)
        fold_branch_scales(student)
        folded = student.forward_features(x)
    assert not any(isinstance(b, ScaledBlock) for b in student.blocks)
    assert torch.allclose(wrapped, folded, atol=1e-5, rtol=0)
    # the scalars really acted (not all ones): the unscaled student differs far more
    plain = stitch_student(teacher.model, layers, spec=spec)
    with torch.no_grad():
        effect = float((plain.forward_features(x) - folded).abs().max())
    assert effect > 1e-4 and effect > 20 * float((wrapped - folded).abs().max())


def test_student_with_all_teacher_layers_is_the_teacher(teacher):
    student = stitch_student(teacher.model, clone_layers(teacher.model, range(12)), spec=teacher.spec)
    x = _inputs(teacher)
    with torch.no_grad():
        assert torch.equal(student.forward_features(x), teacher.model.forward_features(x))
        outs = block_outputs(teacher.model, x)
        # the plain block loop agrees with timm's forward_intermediates
        ref = teacher.model.forward_intermediates(x, norm=False, output_fmt="NLC", intermediates_only=True,
                                                  return_prefix_tokens=True)
    assert len(outs) == 13
    for mine, (patch, prefix) in zip(outs[1:], ref):
        assert torch.allclose(mine, torch.cat([prefix, patch], dim=1), atol=1e-6)


def test_averaged_layer_averages_weights_but_not_norms(teacher):
    avg = averaged_layer(teacher.model, 3, 5)
    blocks = [teacher.model.blocks[i] for i in (2, 3, 4)]
    expect = torch.stack([b.attn.qkv.weight for b in blocks]).mean(0)
    assert torch.allclose(avg.attn.qkv.weight, expect)
    assert torch.allclose(avg.mlp.fc2.bias, torch.stack([b.mlp.fc2.bias for b in blocks]).mean(0))
    assert torch.equal(avg.ls1.gamma, blocks[-1].ls1.gamma)  # LayerScale of the last layer
    assert torch.equal(avg.norm1.weight, blocks[-1].norm1.weight)


@pytest.mark.parametrize("steps", [0, 2])
def test_audition_picks_the_planted_best_layer(steps):
    # Block [2, 4]: layers 2 and 4 are made identities (LayerScale 0) and layer 3 does the
    # real work, so h_4 = layer3(h_1) exactly: layer 3 must win, the average (whose
    # LayerScale comes from layer 4) and the identities must lose.
    bb = create_backbone("vit-s14-tiny", pretrained=False, init_seed=3)
    _set_gammas(bb.model, None, seed=3)
    with torch.no_grad():
        for i in (1, 3):
            bb.model.blocks[i].ls1.gamma.zero_()
            bb.model.blocks[i].ls2.gamma.zero_()
    fit, held = _tiles(12, seed=1), _tiles(6, seed=2)
    winners, report = audition(bb.model, [[1, 1], [2, 4], [5, 12]], fit, held, transform=bb.transform,
                               options=AuditionOptions(steps=steps, batch_size=6))
    assert [r["block"] for r in report] == [[1, 1], [2, 4], [5, 12]]
    ranking = report[1]["ranking"]
    assert report[1]["winner"] == "layer 3"
    assert {r["candidate"] for r in ranking} == {"layer 2", "layer 3", "layer 4", "average 2-4"}
    assert ranking[0]["select_mse"] < 1e-3 * ranking[1]["select_mse"]
    assert [r["select_mse"] for r in ranking] == sorted(r["select_mse"] for r in ranking)
    assert len(report[2]["ranking"]) == 9 and len(winners) == 3


def test_ramp_weight_values():
    assert ramp_weight(0, 100) == 0.0
    assert ramp_weight(50, 100) == pytest.approx(0.5)
    assert ramp_weight(25, 100) == pytest.approx((1 - math.cos(math.pi / 4)) / 2)
    assert ramp_weight(100, 100) == 1.0 and ramp_weight(500, 100) == 1.0
    alphas = default_alphas(5, 1000)  # K = 4 blocks + final features
    assert alphas == pytest.approx([100, 200, 300, 400, 500])
    w = term_weights(150, alphas, 5)
    assert w[0] == 1.0 and 0 < w[1] < 1 and w[2] < w[1] and w[4] < w[3]  # shallow blocks first
    assert term_weights(0, None, 3) == [1.0, 1.0, 1.0]


def test_cosine_lr_factor():
    assert cosine_lr_factor(0, 100) == 1.0
    assert cosine_lr_factor(50, 100) == pytest.approx(0.5)
    assert cosine_lr_factor(100, 100) == pytest.approx(0.0)
    assert cosine_lr_factor(0, 100, warmup_steps=10) == pytest.approx(0.1)
    assert cosine_lr_factor(10, 100, warmup_steps=10) == pytest.approx(1.0)


def test_registry_names_methods_and_fails_clearly():
    assert {"twt", "truncation", "raptor", "nose"} <= set(known_methods())
    assert callable(get_method("twt")) and callable(get_method("truncation"))
    with pytest.raises(ConfigError, match="known methods: .*truncation.*twt"):
        get_method("distillbert")


def test_read_plan_checks_coverage(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text('{"blocks": [[1, 3], [4, 12]]}')
    assert read_plan(p, 12)["blocks"] == [[1, 3], [4, 12]]
    with pytest.raises(ConfigError, match="the backbone has 13"):
        read_plan(p, 13)
    p.write_text('{"blocks": [[1, 3], [5, 12]]}')
    with pytest.raises(ConfigError, match="not contiguous"):
        read_plan(p, 12)


def test_method_options_parse_and_refuse_unknown_keys():
    from pathtwt.cli.compress import parse_method_options
    from pathtwt.errors import ConfigError

    got = parse_method_options(["ridge=1e-3", "search_budget=20", "random_control=true"])
    assert got == {"ridge": 1e-3, "search_budget": 20, "random_control": True}
    assert isinstance(got["search_budget"], int)
    with pytest.raises(ConfigError, match="ridge"):
        parse_method_options(["ridg=1"])
    with pytest.raises(ConfigError, match="not a number"):
        parse_method_options(["ridge=abc"])
