"""The comparison methods (pathtwt.compress.methods: linear, raptor, wdpruning, nose,
subset) on a tiny backbone: the closed-form linear surrogate (exact on a block that is
itself linear), the layer patches their variants are exported with
(pathtwt.models.variant_layers), and every method end to end (a few
distillation steps, the variant folder, its parameter and MAC accounting, and the round
trip through ``create_backbone``: the reloaded model reproduces the fidelity measured at
export)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from torch import nn

from pathtwt.models.registry import build_timm_model, create_backbone, get_spec
from pathtwt.compress.methods.linear import GramAccumulator, fit_linear_maps
from pathtwt.compress.methods.nose import DilutedDeepSupervision, finish_attention_free
from pathtwt.models.variant_layers import (DilutedAttentionBlock, EmbeddingProbe, LinearBlock, TimeScaledBlock, apply_baseline_patches,
                                          tie_blocks)
from pathtwt.compress.methods.raptor import BlockwiseRollout, build_recurrent_student
from pathtwt.compress.calibration import CalibrationSet
from pathtwt.models.flops import count_macs, count_params
from pathtwt.compress.intermediates import iter_layer_outputs
from pathtwt.compress.pipeline import CompressOptions
from pathtwt.compress.registry import get_method
from pathtwt.errors import ConfigError, PathtwtError, WeightsError
from tiny_teacher import tiny_teacher

D, TOKENS, L = 64, 17, 12  # vit-s14-tiny: width 64, CLS + 16 patches, 12 layers


def _tiles(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 56, 56, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def teacher():
    return tiny_teacher(7)


@pytest.fixture(scope="module")
def calib():
    return CalibrationSet(fit=_tiles(8, 1), select=_tiles(4, 3), report=_tiles(4, 2), patch_size=56, seed=0)


# ---------------------------------------------------------------------------- linear surrogate, patches


def _layer_outputs(model, transform, tiles):
    return next(iter_layer_outputs(model, transform, tiles, batch_size=len(tiles), with_input=True))


def test_linear_surrogate_is_exact_on_a_linear_block(teacher):
    import copy

    model = copy.deepcopy(teacher.model)
    for blk in model.blocks[2:5]:  # layers 3..5 become affine: no attention, no norm, no activation
        blk.ls1.gamma.data.zero_()
        blk.norm2 = nn.Identity()
        blk.mlp.act = nn.Identity()
    fit, held = _tiles(12, 1), _tiles(6, 2)
    (w, b), (w_nl, b_nl) = fit_linear_maps(model, teacher.transform, fit, [(3, 5), (6, 8)], ridge=0.0)
    outs = _layer_outputs(model, teacher.transform, held)
    w, b = torch.as_tensor(w, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    pred = outs[2].double() @ w.T + b
    rel = (pred - outs[5].double()).norm() / outs[5].double().norm()
    assert rel < 1e-6
    # the same fit on real (nonlinear) layers 6..8 is far from exact: the check can fail
    w_nl, b_nl = torch.as_tensor(w_nl, dtype=torch.float64), torch.as_tensor(b_nl, dtype=torch.float64)
    rel_nl = (outs[5].double() @ w_nl.T + b_nl - outs[8].double()).norm() / outs[8].double().norm()
    assert rel_nl > 1e3 * rel


def test_ridge_shrinks_the_map():
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(200, 8)))
    y = x @ torch.as_tensor(rng.normal(size=(8, 8))) + 0.5
    acc = GramAccumulator(8, 8)
    acc.update(x[:100], y[:100])
    acc.update(x[100:], y[100:])  # streaming in two batches = one batch
    w0, b0 = acc.solve(0.0)
    assert np.allclose(x.numpy() @ w0.T + b0, y.numpy(), atol=1e-8)
    w1, _ = acc.solve(1.0)
    assert np.linalg.norm(w1) < 0.9 * np.linalg.norm(w0)


# ---------------------------------------------------------------------------- patches


def test_linear_block_patch_costs_and_keys(teacher):
    from pathtwt.models.registry import build_timm_model

    model = apply_baseline_patches(build_timm_model(teacher.spec, depth=3), {"linear_blocks": [1]})
    assert isinstance(model.blocks[1], LinearBlock)
    keys = [k for k in model.state_dict() if k.startswith("blocks.1.")]
    assert keys == ["blocks.1.proj.weight", "blocks.1.proj.bias"]
    plain2 = build_timm_model(teacher.spec, depth=2)
    d, tokens = 64, 17
    assert count_params(model) == count_params(plain2) + d * d + d
    assert count_macs(model) == count_macs(plain2) + tokens * d * d


def test_embedding_probe_acts_once_per_tile_on_the_pooled_embedding(teacher):
    from pathtwt.models.embedding import embed_tiles, pool_tokens

    plain = build_timm_model(teacher.spec, depth=2)
    model = apply_baseline_patches(copy.deepcopy(plain), {"embedding_probe": {"hidden": 24}})
    assert isinstance(model.embedding_probe, EmbeddingProbe)
    extra = {k for k in model.state_dict()} - set(plain.state_dict())
    assert extra == {"embedding_probe.fc1.weight", "embedding_probe.fc1.bias", "embedding_probe.fc2.weight", "embedding_probe.fc2.bias"}
    assert count_params(model) == count_params(plain) + 2 * (2 * D * 24) + 24 + 2 * D
    assert count_macs(model) == count_macs(plain) + 2 * (2 * D * 24)  # one vector per tile, not per token
    x = torch.randn(3, 3, 56, 56)
    with torch.no_grad():
        pooled = pool_tokens(model.forward_features(x), 1)
        assert torch.allclose(embed_tiles(model, x, 1), pooled)  # fc2 starts at zero: identity
        model.embedding_probe.fc2.weight.normal_()
        expect = pooled + model.embedding_probe.fc2(nn.functional.gelu(model.embedding_probe.fc1(pooled)))
        assert torch.allclose(embed_tiles(model, x, 1), expect, atol=1e-5)
    with pytest.raises(PathtwtError, match="cls\\+mean"):  # the probe was trained on the 2D embedding
        embed_tiles(model, x, 1, "cls")
    with pytest.raises(WeightsError):
        apply_baseline_patches(build_timm_model(teacher.spec, depth=2), {"embedding_probe": {"hidden": 0}})


def test_layer_time_scale_block_follows_the_raptor_form(teacher):
    model = apply_baseline_patches(build_timm_model(teacher.spec, depth=12), {"layer_time_scale": True, "tied_blocks": [[2, 5]]})
    blk = model.blocks[2]
    assert isinstance(blk, TimeScaledBlock) and blk.layer == 3
    assert blk.attn is model.blocks[1].attn and blk.t_proj is model.blocks[4].t_proj  # one set of weights, own layer number
    per_block = 16 + 16 + 16 * 3 * D + 3 * D
    assert count_params(model) == count_params(build_timm_model(teacher.spec, depth=9)) + 9 * per_block
    assert count_macs(model) == count_macs(build_timm_model(teacher.spec, depth=12)) + 12 * (16 + 16 * 3 * D)
    x = torch.randn(2, TOKENS, D)
    with torch.no_grad():
        plain = teacher.model.blocks[0]
        wrapped = TimeScaledBlock(copy.deepcopy(plain), layer=7)
        assert torch.allclose(wrapped(x), plain(x), atol=1e-6)  # g = 0: the plain layer
        wrapped.t_proj.fc2.bias.normal_()
        s1, s2, s3 = 1 + wrapped.t_proj.fc2(nn.functional.silu(wrapped.t_proj.fc1(torch.full((1, 1), 7.0)))).reshape(3, D)
        u = x + s1 * plain.ls1(plain.attn(plain.norm1(x)))
        assert torch.allclose(wrapped(x), s3 * (u + s2 * plain.ls2(plain.mlp(plain.norm2(u)))), atol=1e-5)


def test_tied_blocks_share_one_module_and_count_once(teacher):
    from pathtwt.models.registry import build_timm_model

    model = tie_blocks(build_timm_model(teacher.spec, depth=12), [[1, 1], [2, 5], [6, 12]])
    assert len({id(b) for b in model.blocks}) == 3
    assert model.blocks[1] is model.blocks[4] and model.blocks[5] is model.blocks[11]
    assert count_params(model) == count_params(build_timm_model(teacher.spec, depth=3))
    assert count_macs(model) == count_macs(build_timm_model(teacher.spec, depth=12))  # run 12 times
    with pytest.raises(WeightsError):
        apply_baseline_patches(build_timm_model(teacher.spec, depth=4), {"tied_blocks": [[1, 5]]})


# ---------------------------------------------------------------------------- methods end to end


def _compress(method, teacher, calib, out, **kw):
    opts = CompressOptions.from_flat(out=out, steps=2, batch_size=4, progress=False, augment=False, **kw)
    folder = get_method(method)(teacher, calib, opts)
    return folder, json.loads((folder / "model.json").read_text())


def _plain(teacher, depth):
    return build_timm_model(teacher.spec, depth=depth)


def _assert_round_trip(folder, meta, teacher, calib):
    """create_backbone(folder) gives the accounted params and the fidelity measured at export."""
    from pathtwt.compress.fidelity import measure

    back = create_backbone(folder)
    assert count_params(back.model) == meta["params"]
    assert count_macs(back.model) == meta["macs_per_tile"]
    fid = measure(back.model, teacher, calib, on="report")
    assert meta["fidelity"]["on"] == "report" and meta["fidelity"]["splits"] == calib.splits_record()
    for key in ("r2", "cka", "centred_cosine", "cosine"):
        assert fid[key] == pytest.approx(meta["fidelity"]["final"][key], abs=1e-4)
    assert back.weights_sha256 == meta["weights_sha256"]
    return back


def test_raptor_shares_one_layer_per_block_and_costs_teacher_macs(teacher, calib, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"blocks": [[1, 2], [3, 7], [8, 12]]}))
    folder, meta = _compress("raptor", teacher, calib, tmp_path / "raptor", plan=plan)
    assert meta["name"] == "vit-s14-tiny/raptor-3" and meta["timm_kwargs"]["depth"] == L
    assert meta["shared_blocks"] == [[1, 2], [3, 7], [8, 12]] and meta["recurrence"] == [2, 5, 5]
    per_block = 16 + 16 + 16 * 3 * D + 3 * D  # the layer-number conditioning g of each shared layer
    assert meta["params"] == count_params(_plain(teacher, 3)) + 3 * per_block  # one layer per block
    assert meta["macs_per_tile"] == count_macs(teacher.model) + L * (16 + 16 * 3 * D)  # every layer runs
    assert meta["layer_patches"] == {"layer_time_scale": True, "tied_blocks": [[1, 2], [3, 7], [8, 12]]}
    assert meta["budget"]["paper"] == {"stage1_epochs": 1.0, "stage2_epochs": 2.0} and meta["selection_split"] is None
    assert meta["stages"]["stage1_steps"] + meta["stages"]["stage2_steps"] == 2
    assert set(meta["fidelity"]) >= {"initial", "final"}
    back = _assert_round_trip(folder, meta, teacher, calib)
    b = back.model.blocks
    assert b[2].attn is b[6].attn and b[2].t_proj is b[6].t_proj and (b[2].layer, b[6].layer) == (3, 7)
    assert b[2].attn is not b[7].attn
    # timm alone loads the file; the only keys it does not know are the layer conditioning's
    import safetensors.torch
    import timm

    plain = timm.create_model(meta["timm_name"], pretrained=False, **meta["timm_kwargs"])
    result = plain.load_state_dict(safetensors.torch.load_file(folder / "model.safetensors"), strict=False)
    assert not result.missing_keys and result.unexpected_keys
    assert all(".t_proj." in k for k in result.unexpected_keys)
    assert torch.equal(plain.blocks[3].attn.qkv.weight, plain.blocks[6].attn.qkv.weight)


def test_raptor_without_time_scale_is_a_plain_timm_vit(teacher, calib, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"blocks": [[1, 6], [7, 12]]}))
    folder, meta = _compress("raptor", teacher, calib, tmp_path / "raptor", plan=plan, extra={"time_scale": False})
    assert meta["params"] == count_params(_plain(teacher, 2)) and meta["macs_per_tile"] == count_macs(teacher.model)
    assert meta["layer_patches"] == {"tied_blocks": [[1, 6], [7, 12]]}
    import safetensors.torch
    import timm

    plain = timm.create_model(meta["timm_name"], pretrained=False, **meta["timm_kwargs"])
    plain.load_state_dict(safetensors.torch.load_file(folder / "model.safetensors"), strict=True)


def test_raptor_stage1_objective_is_zero_when_the_block_really_repeats(teacher):
    t = copy.deepcopy(teacher)
    for i in range(2, 5):  # layers 3..5 all equal layer 2: a truly recurrent block [2, 5]
        t.model.blocks[i].load_state_dict(t.model.blocks[1].state_dict())
    blocks = [[1, 1], [2, 5], [6, 12]]
    student = build_recurrent_student(t, blocks)
    x = torch.stack([t.transform(tile) for tile in _tiles(2, 3)])
    objective = BlockwiseRollout(blocks, ramp_steps=10)
    with torch.no_grad():
        targets = objective.targets(t.model, x)
        loss, terms = objective.loss(student, x, targets, step=5)
    assert objective.rollout_weight(0) == 0.0 and objective.rollout_weight(5) == 0.5 and objective.rollout_weight(99) == 1.0
    assert terms["forced"] > 0 and terms["rollout"] > 0  # block [6, 12] is not recurrent
    # ... but block [2, 5] contributes nothing: drop the last block and the loss is zero
    loss2, _ = BlockwiseRollout(blocks[:2], ramp_steps=10).loss(student, x, targets, step=5)
    assert float(loss2.detach()) < 1e-10


def test_wdpruning_probe_is_part_of_the_exported_model(teacher, calib, tmp_path):
    folder, meta = _compress("wdpruning", teacher, calib, tmp_path / "wd", depth=4, extra={"probe_hidden": 32})
    assert meta["name"] == "vit-s14-tiny/wdpruning-4" and meta["timm_kwargs"]["depth"] == 4
    assert meta["layer_patches"] == {"embedding_probe": {"hidden": 32}}
    probe = 2 * (2 * D) * 32 + 32 + 2 * D
    assert meta["params"] == count_params(_plain(teacher, 4)) + probe and meta["probe"]["params"] == probe
    assert meta["macs_per_tile"] == count_macs(_plain(teacher, 4)) + 2 * (2 * D) * 32  # once per tile
    assert meta["budget"]["run"] == {"steps": 2, "epochs": None, "resolved_steps": 2, "unit": "steps"}
    assert meta["budget"]["paper"] == {"epochs": 2.0} and meta["selection_split"] is None
    back = _assert_round_trip(folder, meta, teacher, calib)
    assert back.model.embedding_probe.fc2.weight.abs().sum() > 0  # the probe trained (it starts at zero)
    # timm alone: the backbone part loads; the probe's tensors are the only keys left over
    import safetensors.torch
    import timm

    plain = timm.create_model(meta["timm_name"], pretrained=False, **meta["timm_kwargs"])
    result = plain.load_state_dict(safetensors.torch.load_file(folder / "model.safetensors"), strict=False)
    assert not result.missing_keys and all(k.startswith("embedding_probe.") for k in result.unexpected_keys)
    x = torch.stack([teacher.transform(t) for t in calib.report])
    with torch.no_grad():
        assert torch.allclose(plain.eval().forward_features(x), back.model.forward_features(x), atol=1e-6)


@pytest.mark.parametrize("method", ["raptor", "wdpruning"])
def test_layers_a_method_adds_come_from_its_seed(method, teacher, calib, tmp_path):
    # Raptor's time scales and WDPruning's probe are new layers: drawn from --seed, not from
    # whatever the global RNG holds, so the same seed exports the same file
    shas = []
    for i, (seed, global_seed) in enumerate([(0, 1), (0, 2), (1, 1)]):
        torch.manual_seed(global_seed)
        _, meta = _compress(method, teacher, calib, tmp_path / f"{method}{i}", depth=2, seed=seed)
        shas.append(meta["weights_sha256"])
    assert shas[0] == shas[1] != shas[2]


def test_wdpruning_trains_on_the_final_embedding(teacher):
    from pathtwt.compress.methods.wdpruning import FinalEmbeddingLoss, build_wdpruning_student
    from pathtwt.models.embedding import embed_tiles

    student = build_wdpruning_student(teacher, 3, hidden=16)
    x = torch.stack([teacher.transform(t) for t in _tiles(2, 5)])
    objective = FinalEmbeddingLoss(1)
    with torch.no_grad():
        targets = objective.targets(teacher.model, x)
        assert torch.allclose(targets[0], embed_tiles(teacher.model, x, 1), atol=1e-5)
        loss, _ = objective.loss(student, x, targets, step=0)
        expect = nn.functional.mse_loss(embed_tiles(student, x, 1), targets[0])
    assert float(loss) == pytest.approx(float(expect), rel=1e-5)


def _attention_cost():
    blk = build_timm_model(get_spec("vit-s14-tiny"), depth=1).blocks[0]
    params = sum(p.numel() for m in (blk.norm1, blk.attn, blk.ls1) for p in m.parameters())
    return params, TOKENS * D * 3 * D + TOKENS * D * D + 2 * TOKENS * TOKENS * D


def test_nose_removes_attention_from_every_layer_by_default(teacher, calib, tmp_path):
    folder, meta = _compress("nose", teacher, calib, tmp_path / "nose")
    assert meta["layer_patches"]["attention_free"] == list(range(L))
    assert meta["name"] == "vit-s14-tiny/nose" and meta["timm_kwargs"]["depth"] == L and meta["attention_layers"] == 0
    assert meta["selection_split"] is None and meta["selection_trace"] == []  # nothing to choose
    assert meta["budget"]["paper"] == {"epochs": 2.0}
    attn_params, attn_macs = _attention_cost()
    assert meta["params"] == count_params(teacher.model) - L * attn_params
    assert meta["macs_per_tile"] == count_macs(teacher.model) - L * attn_macs
    _assert_round_trip(folder, meta, teacher, calib)


def test_nose_keeps_attention_where_the_greedy_information_criterion_says(teacher, calib, tmp_path):
    from pathtwt.compress.fidelity import tile_embeddings
    from pathtwt.compress.methods.common import embedding_r2
    from pathtwt.compress.methods.nose import gaussian_information, make_attention_free_copy

    folder, meta = _compress("nose", teacher, calib, tmp_path / "nose", extra={"keep_attention": 8})
    free = meta["layer_patches"]["attention_free"]
    assert len(free) == 4 and meta["name"] == "vit-s14-tiny/nose-keep8" and meta["attention_layers"] == 8
    assert meta["selection_split"] == "select"
    trace = meta["selection_trace"]
    assert [t["removed"] for t in trace][-1] == free and len(trace) == 4
    # step 1 is the single removal that keeps the most information, recomputed here
    kw = dict(transform=teacher.transform, num_prefix_tokens=1, device="cpu", batch_size=8)
    target = tile_embeddings(teacher.model, calib.select, **kw)
    infos = []
    for i in range(L):
        probe = copy.deepcopy(teacher.model)
        probe.blocks[i] = make_attention_free_copy(probe.blocks[i])
        infos.append(gaussian_information(embedding_r2(tile_embeddings(probe, calib.select, **kw), target)[1]))
    assert trace[0]["added"] == int(np.argmax(infos))
    assert trace[0]["information"] == pytest.approx(max(infos), rel=1e-4)
    attn_params, _ = _attention_cost()
    assert meta["params"] == count_params(teacher.model) - 4 * attn_params
    _assert_round_trip(folder, meta, teacher, calib)


def test_nose_choice_does_not_depend_on_the_reported_tiles(teacher):
    from pathtwt.compress.methods.nose import greedy_attention_removal

    fit, select = _tiles(4, 11), _tiles(6, 12)
    opts = CompressOptions.from_flat(out="unused", batch_size=4, progress=False)
    runs = []
    for report_seed in (13, 14):
        calib = CalibrationSet(fit=fit, select=select, report=_tiles(4, report_seed), patch_size=56)
        runs.append(greedy_attention_removal(teacher, calib, opts, 3))
    assert runs[0] == runs[1] and runs[0][1] == "select"


def test_nose_refuses_a_depth_and_a_bad_keep_attention(teacher, calib, tmp_path):
    with pytest.raises(ConfigError, match="keep_attention"):
        _compress("nose", teacher, calib, tmp_path / "a", depth=5)
    for bad in (L, -1, "x"):
        with pytest.raises(ConfigError, match="keep_attention"):
            _compress("nose", teacher, calib, tmp_path / "b", extra={"keep_attention": bad})


def test_diluted_block_moves_from_the_layer_to_its_attention_free_form(teacher):
    block = copy.deepcopy(teacher.model.blocks[3])
    wrapper = DilutedAttentionBlock(copy.deepcopy(block))
    x = torch.randn(2, TOKENS, D)
    with torch.no_grad():
        assert torch.allclose(wrapper(x), block(x), atol=1e-6)  # a = 0: the teacher's layer
        wrapper.alpha.fill_(1.0)
        diluted = wrapper(x)
        student = torch.nn.Module()
        student.blocks = torch.nn.Sequential(wrapper)
        finish_attention_free(student, [0])
        assert torch.allclose(student.blocks[0](x), diluted, atol=1e-6)
        assert torch.allclose(diluted, 2 * x + block.ls2(block.mlp(block.norm2(2 * x))), atol=1e-6)
    objective = DilutedDeepSupervision([DilutedAttentionBlock(block)], dilute_steps=4, num_layers=L)
    assert objective.inner.boundaries == list(range(1, L + 1))


def test_linear_replaces_multi_layer_blocks_only(teacher, calib, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"blocks": [[1, 1], [2, 6], [7, 12]]}))
    folder, meta = _compress("linear", teacher, calib, tmp_path / "lin", plan=plan)
    assert meta["layer_patches"] == {"linear_blocks": [1, 2]} and meta["timm_kwargs"]["depth"] == 3
    assert meta["params"] == count_params(_plain(teacher, 1)) + 2 * (D * D + D)
    assert meta["macs_per_tile"] == count_macs(_plain(teacher, 1)) + 2 * TOKENS * D * D
    back = _assert_round_trip(folder, meta, teacher, calib)
    # the kept single layer is the teacher's layer 1, untouched
    assert torch.equal(back.model.blocks[0].attn.qkv.weight, teacher.model.blocks[0].attn.qkv.weight)


def test_subset_search_exports_the_chosen_layers(teacher, calib, tmp_path):
    # candidates scored without distillation here (search_steps 0): the search logic itself
    # is tested on a planted landscape in test_methods_subset_search.py
    extra = {"search_budget": L + 3, "search_steps": 0}
    folder, meta = _compress("subset", teacher, calib, tmp_path / "sub", depth=3, extra=extra)
    record = meta["subset_search"]
    kept = meta["kept_layers"]
    assert kept == record["local"]["best_layers"] and kept == sorted(kept) and len(kept) == 3
    assert record["local"]["evaluations"] <= L + 3 and len(record["local"]["trace"]) == record["local"]["evaluations"]
    assert meta["params"] == count_params(_plain(teacher, 3)) and meta["layer_patches"] == {}
    _assert_round_trip(folder, meta, teacher, calib)
    # the search record is reused when the run is repeated with the same settings
    assert json.loads((folder / "subset_search.json").read_text()) == record


def test_methods_refuse_a_missing_depth(teacher, calib, tmp_path):
    for method in ("wdpruning", "subset"):
        with pytest.raises(ConfigError):
            _compress(method, teacher, calib, tmp_path / method)


def test_folding_the_map_into_the_mlp_output_changes_nothing(teacher):
    from pathtwt.compress.methods.linear import MappedMlpBlock, fold_into_mlp_output

    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(D, D)) / 8, rng.normal(size=D)
    block = copy.deepcopy(teacher.model.blocks[4])  # LayerScale of the MLP branch is not 1
    unfolded = MappedMlpBlock(copy.deepcopy(block), weight, bias)
    folded = fold_into_mlp_output(copy.deepcopy(block), weight, bias)
    assert sum(p.numel() for p in folded.parameters()) == sum(p.numel() for p in block.parameters())  # zero extra
    x = torch.randn(3, TOKENS, D)
    with torch.no_grad():
        assert torch.allclose(folded(x), unfolded(x), atol=1e-5)
        assert not torch.allclose(folded(x), block(x), atol=1e-3)


def test_linear_fold_exports_a_plain_layer_with_the_unfolded_fidelity(teacher, calib, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"blocks": [[1, 1], [2, 6], [7, 12]]}))
    folder, meta = _compress("linear", teacher, calib, tmp_path / "fold", plan=plan, extra={"fold": True})
    # [2, 6] folds into layer 1; [7, 12] follows a folded block, so it stays a linear block
    assert meta["linear"]["fold"]["folded_blocks"] == [[2, 6]] and meta["linear"]["fold"]["into_layers"] == [1]
    assert meta["timm_kwargs"]["depth"] == 2 and meta["layer_patches"] == {"linear_blocks": [1]}
    assert meta["params"] == count_params(_plain(teacher, 1)) + D * D + D
    unfolded = meta["linear"]["fold"]["unfolded_fidelity"]["r2"]
    assert meta["fidelity"]["final"]["r2"] == pytest.approx(unfolded, abs=1e-5)
    assert meta["budget"]["run"]["unit"] is None and meta["selection_split"] is None
    back = _assert_round_trip(folder, meta, teacher, calib)
    assert not torch.equal(back.model.blocks[0].mlp.fc2.weight, teacher.model.blocks[0].mlp.fc2.weight)


def test_cli_runs_nose_without_a_depth_and_twt_still_needs_one(shared_tiles, tmp_path, capsys):
    from pathtwt.cli import main

    common = ["--backbone", "vit-s14-tiny", "--random-init", "--calibration", str(shared_tiles), "--n-tiles", "8",
              "--batch-size", "4", "--device", "cpu", "--steps", "1", "--no-progress"]
    assert main(["compress", *common, "--method", "nose", "--out", str(tmp_path / "nose")]) == 0
    meta = json.loads((tmp_path / "nose" / "model.json").read_text())
    assert meta["layer_patches"]["attention_free"] == list(range(L)) and meta["name"] == "vit-s14-tiny/nose"
    capsys.readouterr()
    assert main(["compress", *common, "--method", "twt", "--out", str(tmp_path / "twt")]) != 0
    err = capsys.readouterr().err.strip()
    assert "--depth" in err and len(err.splitlines()) == 1
