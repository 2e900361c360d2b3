"""Backbone registry, weight loading and conversion, tile embedding, and the real ViT-S."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_layouts import published_layout
from safetensors.torch import save_file

from pathtwt.models import registry as backbones
from pathtwt.models.encoders import BACKBONES
from pathtwt.models.registry import (build_timm_model, create_backbone, get_spec, variant_depth,
                                     variant_metadata)
from pathtwt.models.flops import meta_model
from pathtwt.models.embedding import pool_tokens
from pathtwt.errors import WeightsError
from pathtwt.models.hf_dinov2 import hf_dinov2_to_timm

# ---------------------------------------------------------------- architectures


@pytest.mark.parametrize(
    "name, dim, prefix, fc1, fc2_in",
    [("h0-mini", 768, 5, 4096, 2048), ("hibou-b", 768, 5, 4096, 2048), ("vit-s14-imgfocus", 384, 1, 1536, 1536)],
)
def test_real_architectures_shapes_and_token_layout(name, dim, prefix, fc1, fc2_in):
    spec = get_spec(name)
    model = meta_model(name)
    assert (spec.embed_dim, spec.num_prefix_tokens, spec.input_size) == (dim, prefix, 224)
    assert len(model.blocks) == 12 and model.num_prefix_tokens == prefix
    assert tuple(model.patch_embed.grid_size) == (16, 16)
    assert tuple(model.patch_embed.proj.weight.shape) == (dim, 3, 14, 14)
    # registers have no position embedding (timm no_embed_class), CLS folded
    assert tuple(model.pos_embed.shape) == ((1, 256, dim) if prefix == 5 else (1, 257, dim))
    assert (model.reg_token is None) == (prefix == 1)
    blk = model.blocks[0]
    assert tuple(blk.mlp.fc1.weight.shape) == (fc1, dim) and tuple(blk.mlp.fc2.weight.shape) == (dim, fc2_in)
    assert tuple(blk.ls1.gamma.shape) == (dim,)  # LayerScale
    tokens = model.forward_features(torch.zeros(2, 3, 224, 224, device="meta"))
    assert tuple(tokens.shape) == (2, prefix + 256, dim)


def test_tiny_variants_keep_the_structure():
    for name in ("h0-mini-tiny", "hibou-b-tiny", "vit-s14-tiny"):
        spec, big = get_spec(name), get_spec(name.replace("-tiny", "") if "vit" not in name else "vit-s14-imgfocus")
        assert (spec.embed_dim, spec.depth, spec.input_size, spec.num_patch_tokens) == (64, 12, 56, 16)
        assert (spec.num_prefix_tokens, spec.timm_name, spec.hub_file) == (big.num_prefix_tokens, big.timm_name, big.hub_file)


def test_unknown_backbone_lists_close_matches_or_all(tmp_path):
    with pytest.raises(WeightsError) as err:
        get_spec("h0-maxi")
    assert "close matches: h0-mini" in str(err.value) and "virchow2" not in str(err.value)
    with pytest.raises(WeightsError) as err:
        get_spec("zzzz")
    for name in BACKBONES:
        assert name in str(err.value)
    with pytest.raises(WeightsError, match="no model.json"):
        get_spec(tmp_path)


# ---------------------------------------------------------------- weights


def test_missing_weights_file_and_offline_hub_say_what_to_download(tmp_path, monkeypatch):
    with pytest.raises(WeightsError, match="does not exist.*huggingface.co/bioptimus/H0-mini"):
        create_backbone("h0-mini", weights=tmp_path / "nope.safetensors")
    monkeypatch.setenv("PATHTWT_OFFLINE", "1")
    monkeypatch.setenv("PATHTWT_WEIGHTS_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(WeightsError, match=r"download model.safetensors from https://huggingface.co/histai/hibou-b"):
        create_backbone("hibou-b")


def test_hub_failure_becomes_one_line(monkeypatch, tmp_path):
    import huggingface_hub

    def unreachable(**_kwargs):
        raise ConnectionError("Max retries exceeded with url: https://huggingface.co/...\n(long trace)")

    monkeypatch.delenv("PATHTWT_OFFLINE", raising=False)
    monkeypatch.setenv("PATHTWT_WEIGHTS_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    with pytest.raises(WeightsError) as err:
        create_backbone("h0-mini")
    msg = str(err.value)
    assert "\n" not in msg and "ConnectionError" in msg and "--weights" in msg


def _tiny_state(name="vit-s14-tiny", seed=1):
    return create_backbone(name, pretrained=False, init_seed=seed).model.state_dict()


def test_weights_load_from_each_file_kind_and_record_sha(tmp_path):
    state = _tiny_state()
    save_file(state, tmp_path / "w.safetensors")
    torch.save({"state_dict": {"module." + k: v for k, v in state.items()}}, tmp_path / "w.pth")
    snap = tmp_path / "snapshot"
    snap.mkdir()
    (snap / "config.json").write_text("{}")
    torch.save(state, snap / "pytorch_model.bin")
    x = torch.randn(1, 3, 56, 56)
    outs = []
    for path in (tmp_path / "w.safetensors", tmp_path / "w.pth", snap):
        bb = create_backbone("vit-s14-tiny", weights=path)
        assert bb.source == str(path) and len(bb.weights_sha256) == 64
        outs.append(bb.embed_tiles(x))
    from pathtwt.io.atomic import sha256_file

    assert create_backbone("vit-s14-tiny", weights=tmp_path / "w.safetensors").weights_sha256 == sha256_file(
        tmp_path / "w.safetensors"
    )
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert not torch.equal(outs[0], create_backbone("vit-s14-tiny", pretrained=False).embed_tiles(x))


def _recording_builds(monkeypatch, extra_buffer: bool = False) -> list[str]:
    """The devices registry.create_backbone builds its timm models on; ``extra_buffer``
    gives each model a non-persistent buffer, a tensor no checkpoint holds."""
    devices: list[str] = []
    build = backbones.build_timm_model

    def recording(spec, depth=None, device=None):
        devices.append(str(device))
        model = build(spec, depth=depth, device=device)
        if extra_buffer:
            model.register_buffer("scale", torch.full((), 2.0, device=device), persistent=False)
        return model

    monkeypatch.setattr(backbones, "build_timm_model", recording)
    return devices


def test_weights_fill_a_meta_layout_without_a_random_initialisation(tmp_path, monkeypatch):
    state = _tiny_state()
    save_file(state, tmp_path / "w.safetensors")
    reference = build_timm_model(get_spec("vit-s14-tiny"))
    reference.load_state_dict(state)
    devices = _recording_builds(monkeypatch)
    bb = create_backbone("vit-s14-tiny", weights=tmp_path / "w.safetensors")
    assert devices == ["meta"]  # shapes only: timm's initialisation never ran
    assert not any(t.is_meta for t in [*bb.model.parameters(), *bb.model.buffers()])
    assert not any(p.requires_grad for p in bb.model.parameters())
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        assert torch.equal(bb.model(x), reference.eval()(x))


def test_a_model_holding_a_tensor_no_checkpoint_has_is_built_and_loaded_by_copy(tmp_path, monkeypatch):
    state = _tiny_state()
    save_file(state, tmp_path / "w.safetensors")
    devices = _recording_builds(monkeypatch, extra_buffer=True)
    bb = create_backbone("vit-s14-tiny", weights=tmp_path / "w.safetensors")
    assert devices == ["meta", "None"]  # the meta layout left the buffer unset: built for real
    assert float(bb.model.scale) == 2.0 and not any(t.is_meta for t in bb.model.parameters())
    assert torch.equal(bb.model.state_dict()["blocks.0.attn.qkv.weight"], state["blocks.0.attn.qkv.weight"])


def test_bad_keys_and_shapes_are_named(tmp_path):
    state = _tiny_state()
    renamed = dict(state)
    renamed["blocks.3.attn.qkv_typo.weight"] = renamed.pop("blocks.3.attn.qkv.weight")
    save_file(renamed, tmp_path / "keys.safetensors")
    with pytest.raises(WeightsError, match=r"missing \['blocks.3.attn.qkv.weight'\].*unexpected \['blocks.3.attn.qkv_typo"):
        create_backbone("vit-s14-tiny", weights=tmp_path / "keys.safetensors")
    # the ViT-S weights do not fit the H0-mini-tiny architecture
    save_file(state, tmp_path / "vits.safetensors")
    with pytest.raises(WeightsError, match=r"missing \['reg_token'\]; shape \[.*'blocks.0.mlp.fc1.weight \(256, 64\) != \(352, 64\)'"):
        create_backbone("h0-mini-tiny", weights=tmp_path / "vits.safetensors")


# ---------------------------------------------------------------- Hugging Face -> timm


def _hibou_hf_config(**overrides):
    from transformers import Dinov2WithRegistersConfig

    cfg = dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, mlp_ratio=4, use_swiglu_ffn=True,
        num_register_tokens=4, image_size=224, patch_size=14, layerscale_value=1e-5, layer_norm_eps=1e-6,
        qkv_bias=True,
    )
    cfg.update(overrides)
    return Dinov2WithRegistersConfig(**cfg)


@pytest.mark.parametrize("native_image_size, layout", [(56, "current"), (98, "legacy")])
def test_hf_dinov2_registers_converted_to_timm_matches(tmp_path, native_image_size, layout):
    from transformers import Dinov2WithRegistersModel

    torch.manual_seed(0)
    cfg = _hibou_hf_config(hidden_size=64, num_attention_heads=4, image_size=native_image_size)
    hf = Dinov2WithRegistersModel(cfg).eval()
    with torch.no_grad():  # LayerScale and norms away from their init, so mapping errors show
        for name, p in hf.named_parameters():
            if "lambda1" in name or "norm" in name or "token" in name or "position" in name:
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if name.endswith("weight") else 0.0))
    state = hf.state_dict()
    if layout == "legacy":
        state = published_layout(state)
        assert any("mlp.weights_in" in k for k in state)
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    bb = create_backbone("hibou-b-tiny", weights=tmp_path)  # a Hugging Face snapshot folder
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        # the native grid 7x7 (98 px) is resampled by Hugging Face at run time, by us at load
        expected = hf(pixel_values=x).last_hidden_state
        got = bb.model.forward_features(x)
    assert got.shape == expected.shape == (2, 5 + 16, 64)
    assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()


@pytest.mark.parametrize("side, grid, dtype", [(7, (4, 4), torch.float32), (37, (16, 16), torch.float32),
                                               (4, (7, 7), torch.bfloat16), (16, (16, 16), torch.float32)])
def test_position_resampling_keeps_the_numbers_of_the_replaced_formula(side, grid, dtype):
    """timm's resample_abs_pos_embed in place of a hand-written F.interpolate: same numbers."""
    from pathtwt.models.hf_dinov2 import _resample_patch_pos

    torch.manual_seed(side)
    pos = torch.randn(1, side * side, 24).to(dtype)
    grid_pos = pos.reshape(1, side, side, 24).permute(0, 3, 1, 2).float()
    grid_pos = torch.nn.functional.interpolate(grid_pos, size=grid, mode="bicubic", align_corners=False, antialias=True)
    expected = grid_pos.permute(0, 2, 3, 1).reshape(1, -1, 24).to(dtype)
    got = _resample_patch_pos(pos, grid)
    assert got.dtype == dtype and got.shape == (1, grid[0] * grid[1], 24)
    assert torch.equal(got, expected)
    if (side, side) == grid:
        assert got is pos


def test_full_hibou_config_keys_and_shapes_convert():
    from transformers import Dinov2WithRegistersModel

    with torch.device("meta"):
        hf = Dinov2WithRegistersModel(_hibou_hf_config())
    converted = hf_dinov2_to_timm(published_layout(hf.state_dict()), grid=(16, 16), no_embed_class=True)
    expected = meta_model("hibou-b").state_dict()
    assert sorted(converted) == sorted(expected)
    assert all(tuple(converted[k].shape) == tuple(v.shape) for k, v in expected.items())


# ---------------------------------------------------------------- variant folders


def _write_variant(folder: Path, depth: int, patches: dict) -> dict:
    spec = get_spec("h0-mini-tiny")
    model = build_timm_model(spec, depth=depth)
    from pathtwt.models.layer_patches import apply_layer_patches

    apply_layer_patches(model, patches)
    folder.mkdir(parents=True)
    save_file(model.state_dict(), folder / "model.safetensors")
    meta = variant_metadata(spec, depth, name=f"h0-mini-tiny/test-{depth}", method="test", layer_patches=patches)
    (folder / "model.json").write_text(json.dumps(meta))
    return model.state_dict()


def test_variant_folder_loads_with_layer_patches(tmp_path):
    state = _write_variant(tmp_path / "v", depth=3, patches={"attention_free": [1]})
    assert not any(k.startswith("blocks.1.attn") for k in state)
    bb = create_backbone(tmp_path / "v")
    assert bb.spec.name == "h0-mini-tiny/test-3" and len(bb.model.blocks) == 3
    assert bb.spec.base_backbone == "h0-mini-tiny" and bb.spec.mean == get_spec("h0-mini-tiny").mean
    # the attention-free block computes 2x + LayerScale(MLP(LN(2x)))
    blk, x = bb.model.blocks[1], torch.randn(2, 21, 64)
    with torch.no_grad():
        assert torch.allclose(blk(x), 2 * x + blk.ls2(blk.mlp(blk.norm2(2 * x))), atol=1e-6)
    # a plain timm ViT of the same depth does not accept these weights: strict loading
    meta = json.loads((tmp_path / "v" / "model.json").read_text())
    meta["layer_patches"] = {}
    (tmp_path / "v" / "model.json").write_text(json.dumps(meta))
    with pytest.raises(WeightsError, match="missing.*blocks.1"):
        create_backbone(tmp_path / "v")


def test_variant_timm_kwargs_load_with_timm_alone(tmp_path):
    import timm
    from safetensors.torch import load_file

    _write_variant(tmp_path / "v", depth=4, patches={})
    meta = json.loads((tmp_path / "v" / "model.json").read_text())
    assert meta["timm_kwargs"]["depth"] == 4 and meta["format"] == backbones.VARIANT_FORMAT
    # plain JSON kwargs, no layer classes passed: a user needs timm alone
    model = timm.create_model(meta["timm_name"], pretrained=False, **meta["timm_kwargs"])
    assert isinstance(model.blocks[0].mlp, timm.layers.GluMlp)  # SwiGLUPacked is GluMlp + SiLU
    assert isinstance(model.blocks[0].mlp.act, torch.nn.SiLU)
    model.load_state_dict(load_file(tmp_path / "v" / "model.safetensors"), strict=True)


def test_model_json_records_the_depth_once_and_old_files_still_read(tmp_path):
    meta = variant_metadata(get_spec("h0-mini-tiny"), 5)
    assert "depth" not in meta and meta["timm_kwargs"]["depth"] == 5 and variant_depth(meta) == 5
    # model.json of earlier versions: a top-level copy, or (hand-written) only the top-level one
    assert variant_depth({"depth": 4, "timm_kwargs": {"depth": 4}}) == 4
    assert variant_depth({"depth": 3, "timm_kwargs": {"embed_dim": 64}}) == 3
    assert variant_depth({"timm_kwargs": {}}) is None
    _write_variant(tmp_path / "v", depth=4, patches={})
    assert get_spec(tmp_path / "v").depth == 4


# ---------------------------------------------------------------- embedding


def test_embedding_is_cls_and_mean_of_patch_tokens_without_registers():
    bb = create_backbone("h0-mini-tiny", pretrained=False)
    x = torch.randn(3, 3, 56, 56)
    with torch.no_grad():
        tokens = bb.model.forward_features(x)
        emb = bb.embed_tiles(x)
    assert emb.shape == (3, 128) and emb.dtype == torch.float32
    assert torch.allclose(emb[:, :64], tokens[:, 0])
    assert torch.allclose(emb[:, 64:], tokens[:, 5:21].mean(dim=1), atol=1e-6)
    with_registers = tokens[:, 1:].mean(dim=1)
    assert not torch.allclose(emb[:, 64:], with_registers, atol=1e-3)
    with pytest.raises(ValueError):
        pool_tokens(tokens[:, :5], 5)


def test_transform_resizes_and_normalises():
    bb = create_backbone("vit-s14-tiny", pretrained=False)
    tile = np.full((224, 224, 3), 255, np.uint8)
    out = bb.transform(tile)
    assert out.shape == (3, 56, 56) and out.dtype == torch.float32
    expected = (1.0 - np.array(bb.spec.mean)) / np.array(bb.spec.std)
    assert np.allclose(out[:, 0, 0].numpy(), expected, atol=1e-5)


# ---------------------------------------------------------------- the real ViT-S


@pytest.fixture(scope="module")
def vit_s(vit_s_weights):
    return create_backbone("vit-s14-imgfocus", weights=vit_s_weights)


def _embed_images(bb, images):
    with torch.inference_mode():
        return bb.embed_tiles(bb.transform.batch(images)).numpy()


def test_real_vit_s_deterministic_on_slide_tiles(vit_s, shared_slides):
    from pathtwt.wsi.slides import open_slide

    with open_slide(shared_slides / "CMU-1-Small-Region.svs") as slide:
        tiles = [slide.read_tile(x, y, 448, 0, 224) for x, y in [(600, 800), (1200, 1600), (200, 2400)]]
    first, second = _embed_images(vit_s, tiles), _embed_images(vit_s, tiles[::-1])[::-1]
    assert first.shape == (3, 768) and np.isfinite(first).all()
    assert np.allclose(first, second, atol=1e-4)  # same tile, same features, whatever its batch position
    assert np.linalg.norm(first[0] - first[1]) > 1e-2


def _labelled_tiles(root: Path):
    from PIL import Image

    paths = sorted(root.glob("*/*.tif"))
    return [np.asarray(Image.open(p).convert("RGB")) for p in paths], [p.parent.name for p in paths]


def test_real_vit_s_separates_tissue_classes(vit_s, shared_tiles):
    images, labels = _labelled_tiles(shared_tiles / "kather2016")
    assert len(set(labels)) == 8 and len(images) == 24
    feats = _embed_images(vit_s, images)
    feats = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    labels = np.array(labels)
    accuracy = _nearest_centroid_loo(feats, labels)
    # chance is 1/8; compare with the same classifier on shuffled labels as well
    rng = np.random.default_rng(0)
    shuffled = [_nearest_centroid_loo(feats, rng.permutation(labels)) for _ in range(100)]
    assert accuracy >= 0.25, f"leave-one-out nearest-centroid accuracy {accuracy:.2f}, chance 0.125"
    assert accuracy > np.quantile(shuffled, 0.95), (accuracy, np.quantile(shuffled, 0.95))


def _nearest_centroid_loo(feats: np.ndarray, labels: np.ndarray) -> float:
    correct = 0
    for i in range(len(feats)):
        keep = np.arange(len(feats)) != i
        classes = sorted(set(labels[keep]))
        centroids = np.stack([feats[keep & (labels == c)].mean(0) for c in classes])
        correct += classes[int(np.argmin(np.linalg.norm(centroids - feats[i], axis=1)))] == labels[i]
    return correct / len(feats)


def test_device_rule_is_shared_by_every_command(monkeypatch):
    from pathtwt.devices import resolve_device
    from pathtwt.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device(torch.device("cpu")) == "cpu"
    with pytest.raises(ConfigError, match="--device cuda: no CUDA device"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    # the name rule alone: the per-job GPU claim that `auto` takes on a machine with several
    # GPUs (and its set_device, which a CPU build of torch cannot run) is tests/test_gpu_devices.py's
    monkeypatch.setenv("PATHTWT_GPU_CLAIMS", "0")
    assert resolve_device("auto") == "cuda" and resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ConfigError, match="--device cuda:2: only 2 CUDA device"):
        resolve_device("cuda:2")
    with pytest.raises(ConfigError, match="--device gpu: expected auto"):
        resolve_device("gpu")
