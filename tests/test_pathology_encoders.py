"""The registry's pathology encoders (UNI, UNI2-h, Virchow2, H-optimus-0/1, Prov-GigaPath,
Phikon-v2, Hibou-L, kaiko ViT-B/8): architecture, published sizes, per-tile MACs, their
checkpoint formats, their transforms; ``timm:NAME`` backbones; the timm hub format of an
exported variant. Everything runs on the meta device or on the ``*-tiny`` doubles: no
published weights are needed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hf_layouts import current_layout, published_layout

from pathtwt.errors import WeightsError
from pathtwt.models.flops import count_macs, count_params, meta_model
from pathtwt.models.encoders import BACKBONES, PATHOLOGY_ENCODERS
from pathtwt.models.registry import create_backbone, get_spec

NEW = [spec.name for spec in PATHOLOGY_ENCODERS]

# name: (patch, width, depth, heads, fc1 out, MLP, LayerScale, registers, position embeddings
# on the prefix tokens too, dynamic image size, mean/std kind, card embedding width).
# Sources: TRIDENT's loaders and the model cards, as cited in pathtwt/models/registry.py.
ARCH = {
    "uni": (16, 1024, 24, 16, 4096, "gelu", True, 0, True, True, "imagenet", 1024),
    "uni2-h": (14, 1536, 24, 24, 8192, "swiglu-packed", True, 8, False, True, "imagenet", 1536),
    "virchow2": (14, 1280, 32, 16, 6832, "swiglu-packed", True, 4, True, True, "imagenet", 2560),
    "h-optimus-0": (14, 1536, 40, 24, 8192, "swiglu-packed", True, 4, False, False, "h-optimus", 1536),
    "h-optimus-1": (14, 1536, 40, 24, 8192, "swiglu-packed", True, 4, False, False, "h-optimus", 1536),
    "prov-gigapath": (16, 1536, 40, 24, 8192, "swiglu-packed", True, 0, True, False, "imagenet", 1536),
    "phikon-v2": (16, 1024, 24, 16, 4096, "gelu", True, 0, True, False, "imagenet", 1024),
    "hibou-l": (14, 1024, 24, 16, 5472, "swiglu-packed", True, 4, False, False, "hibou", 1024),
    "kaiko-vitb8": (8, 768, 12, 12, 3072, "gelu", False, 0, True, True, "kaiko", 768),
}
# published in Hugging Face's Dinov2 layout (converted on load, chosen by its keys); the
# others publish timm's
HF_PUBLISHED = {"phikon-v2", "hibou-l"}
NORMS = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "h-optimus": ((0.707223, 0.578729, 0.703617), (0.211883, 0.230117, 0.177517)),
    "hibou": ((0.7068, 0.5755, 0.7220), (0.1950, 0.2316, 0.1816)),
    "kaiko": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
}

# Published parameter counts, as printed (value, unit of the last printed digit), and where.
# Tolerance: pathtwt's count (headless, at 224 px) lies within one unit of the last printed
# digit (632 M: +-1 M; 1.1 B: +-0.1 B), because the sources round.
PUBLISHED_PARAMS = {
    "uni": (303e6, 1e6),  # "ViT-L/16 ... 303 M" (UNI model card / issue); timm ViT-L/16 headless
    "uni2-h": (681e6, 1e6),  # UNI2-h model card: ViT-H/14-reg8, 681 M
    "virchow2": (632e6, 1e6),  # Virchow2 paper (arXiv 2408.00738) and card: "632 million parameters"
    "h-optimus-0": (1.1e9, 0.1e9),  # H-optimus-0 card: ViT-g/14, 1.1 B parameters
    "h-optimus-1": (1.1e9, 0.1e9),  # Bioptimus release note: "1.1 billion parameter vision transformer"
    "prov-gigapath": (1.1e9, 0.1e9),  # Prov-GigaPath (Nature 2024): ViT-g tile encoder, 1.1 B
    "phikon-v2": (0.3e9, 0.1e9),  # Phikon-v2 (arXiv 2409.09173): ViT-L (a page quotes 307 M; see docs/backbones.md)
    "hibou-l": (0.3e9, 0.1e9),  # Hibou (arXiv 2406.05074): ViT-L/14
    "kaiko-vitb8": (86e6, 1e6),  # timm vit_base_patch8_224: 86.6 M with the 1000-class head, 85.8 M without
}
# pathtwt's exact counts (meta device, 224 px), pinned so a registry change shows.
EXACT_PARAMS = {
    "uni": 303_350_784, "uni2-h": 681_394_176, "virchow2": 631_239_424, "h-optimus-0": 1_134_774_272,
    "h-optimus-1": 1_134_774_272, "prov-gigapath": 1_134_953_984, "phikon-v2": 303_350_784,
    "hibou-l": 303_657_216, "kaiko-vitb8": 85_807_872,
}


def formula_macs(patch: int, width: int, depth: int, fc1: int, mlp: str, prefix: int, size: int = 224) -> int:
    """Per-tile MACs of a ViT from its architecture numbers alone (pathtwt's counting:
    linear maps over all tokens, QK^T and AV, the patch embedding; see flops.py)."""
    n = (size // patch) ** 2
    t = n + prefix
    fc2_in = fc1 // 2 if mlp == "swiglu-packed" else fc1
    block = t * (3 * width * width + width * width + width * fc1 + fc2_in * width) + 2 * t * t * width
    return n * width * 3 * patch * patch + depth * block


@pytest.mark.parametrize("name", NEW)
def test_architecture_is_the_published_one(name):
    patch, width, depth, heads, fc1, mlp, layerscale, regs, pos_on_prefix, dynamic, norm, card_dim = ARCH[name]
    spec, model = get_spec(name), meta_model(name)
    assert (spec.embed_dim, spec.depth, spec.input_size, spec.mlp) == (width, depth, 224, mlp)
    assert len(model.blocks) == depth and model.blocks[0].attn.num_heads == heads
    assert tuple(model.patch_embed.proj.weight.shape) == (width, 3, patch, patch)
    assert tuple(model.blocks[0].mlp.fc1.weight.shape) == (fc1, width)
    fc2_in = fc1 // 2 if mlp == "swiglu-packed" else fc1
    assert tuple(model.blocks[0].mlp.fc2.weight.shape) == (width, fc2_in)
    assert hasattr(model.blocks[0].ls1, "gamma") == layerscale
    assert spec.num_register_tokens == regs and model.num_prefix_tokens == spec.num_prefix_tokens == 1 + regs
    n = (224 // patch) ** 2
    assert tuple(model.pos_embed.shape) == (1, n + (1 + regs if pos_on_prefix else 0), width)
    assert bool(spec.timm_kwargs.get("dynamic_img_size", False)) == dynamic
    assert (spec.mean, spec.std) == NORMS[norm]
    assert spec.card_embedding_dim == card_dim
    tokens = model.forward_features(torch.zeros(1, 3, 224, 224, device="meta"))
    assert tuple(tokens.shape) == (1, 1 + regs + n, width)


def test_virchow2_recipe_is_cls_and_mean_of_patch_tokens_without_registers():
    from pathtwt.models.embedding import embedding_dim, pool_tokens

    spec = get_spec("virchow2")
    assert spec.embedding_recipe == "cls+mean" and embedding_dim(spec.embed_dim, "cls+mean") == 2560
    assert embedding_dim(spec.embed_dim, "cls") == 1280
    tokens = torch.randn(2, 5 + 256, 8)
    tokens[:, 1:5] = 1e6  # registers: must not reach the embedding
    pooled = pool_tokens(tokens, spec.num_prefix_tokens, "cls+mean")
    assert torch.allclose(pooled, torch.cat([tokens[:, 0], tokens[:, 5:].mean(1)], 1))  # the card's output[:, 5:]
    assert torch.equal(pool_tokens(tokens, spec.num_prefix_tokens, "cls"), tokens[:, 0])


@pytest.mark.parametrize("name", NEW)
def test_parameters_match_the_published_figure(name):
    params = count_params(meta_model(name))
    published, unit = PUBLISHED_PARAMS[name]
    assert abs(params - published) <= unit, (name, params)
    assert params == EXACT_PARAMS[name]


def test_kaiko_with_timm_s_head_is_timm_s_published_86_6_m():
    import timm

    with torch.device("meta"):
        model = timm.create_model("vit_base_patch8_224", pretrained=False, num_classes=1000)
    assert round(count_params(model) / 1e6, 1) == 86.6
    assert count_params(model) - EXACT_PARAMS["kaiko-vitb8"] == 768 * 1000 + 1000


@pytest.mark.parametrize("name", NEW)
def test_macs_per_tile_equal_the_architecture_formula(name):
    patch, width, depth, _heads, fc1, mlp, *_ = ARCH[name]
    spec = get_spec(name)
    assert count_macs(meta_model(name)) == formula_macs(patch, width, depth, fc1, mlp, spec.num_prefix_tokens)


def test_deep_models_cost_what_their_sizes_say():
    # ViT-g/14 with 4 registers (261 tokens) costs 2 x params x tokens to within the attention
    # matmuls and the patch embedding; a ViT-L/16 (197 tokens) likewise.
    for name, tokens in (("h-optimus-0", 261), ("uni", 197)):
        model = meta_model(name)
        blocks = sum(p.numel() for b in model.blocks for n, p in b.named_parameters() if n.endswith("weight") and p.ndim == 2)
        attn = len(model.blocks) * 2 * tokens * tokens * model.embed_dim
        assert count_macs(model) - attn - model.patch_embed.proj.weight.numel() * (tokens - model.num_prefix_tokens) \
            == blocks * tokens


# ---------------------------------------------------------------- tiny doubles


@pytest.mark.parametrize("name", NEW)
def test_tiny_double_keeps_the_structure(name):
    big, tiny = get_spec(name), get_spec(f"{name}-tiny")
    patch = int(big.timm_kwargs["patch_size"])
    assert (tiny.embed_dim, tiny.depth, tiny.num_patch_tokens, tiny.input_size) == (64, 12, 16, 4 * patch)
    same = ("timm_name", "num_prefix_tokens", "num_register_tokens", "mlp", "mean", "std",
            "embedding_recipe", "hub_file")
    assert all(getattr(tiny, k) == getattr(big, k) for k in same)
    for key in ("patch_size", "init_values", "reg_tokens", "no_embed_class", "dynamic_img_size"):
        assert tiny.timm_kwargs.get(key) == big.timm_kwargs.get(key)
    a, b = meta_model(name), meta_model(f"{name}-tiny")
    assert hasattr(a.blocks[0].ls1, "gamma") == hasattr(b.blocks[0].ls1, "gamma")
    assert type(a.blocks[0].mlp) is type(b.blocks[0].mlp)
    assert (a.pos_embed.shape[1] - a.patch_embed.num_patches) == (b.pos_embed.shape[1] - b.patch_embed.num_patches)


# ---------------------------------------------------------------- checkpoint formats


def timm_to_hf_dinov2(state: dict, registers: bool) -> dict:
    """timm ViT weights -> Hugging Face Dinov2(WithRegisters) names as published (split
    q/k/v under attention.attention, LayerScale lambda1, packed SwiGLU weights_in/out), the
    inverse of pathtwt.models.hf_dinov2 at the same grid."""
    out = {}
    width = state["cls_token"].shape[-1]
    pos = state["pos_embed"]
    if registers:  # timm folds pos[0] into the class token; give HF a zero CLS position
        out["embeddings.cls_token"] = state["cls_token"]
        out["embeddings.position_embeddings"] = torch.cat([torch.zeros(1, 1, width), pos], 1)
        out["embeddings.register_tokens"] = state["reg_token"]
    else:
        out["embeddings.cls_token"] = state["cls_token"]
        out["embeddings.position_embeddings"] = pos
    out["embeddings.mask_token"] = torch.zeros(1, width)
    for kind in ("weight", "bias"):
        out[f"embeddings.patch_embeddings.projection.{kind}"] = state[f"patch_embed.proj.{kind}"]
        out[f"layernorm.{kind}"] = state[f"norm.{kind}"]
    swiglu = any(".mlp.fc1." in k for k in state) and registers
    for key, value in state.items():
        if not key.startswith("blocks."):
            continue
        _, i, rest = key.split(".", 2)
        p = f"encoder.layer.{i}."
        if rest.startswith("attn.qkv."):
            kind = rest.rsplit(".", 1)[1]
            for name, part in zip(("query", "key", "value"), value.chunk(3, 0)):
                out[p + f"attention.attention.{name}.{kind}"] = part
        elif rest.startswith("attn.proj."):
            out[p + "attention.output.dense." + rest.rsplit(".", 1)[1]] = value
        elif rest in ("ls1.gamma", "ls2.gamma"):
            out[p + f"layer_scale{rest[2]}.lambda1"] = value
        elif rest.startswith("mlp.fc1.") or rest.startswith("mlp.fc2."):
            layer = {"fc1": "weights_in", "fc2": "weights_out"}[rest[4:7]] if swiglu else rest[4:7]
            out[p + f"mlp.{layer}." + rest.rsplit(".", 1)[1]] = value
        else:  # norm1, norm2
            out[p + rest] = value
    return out


def _write(name: str, spec, state: dict, folder) -> object:
    """``state`` (timm names) written the way ``name``'s publisher ships its checkpoint."""
    from safetensors.torch import save_file

    if name in HF_PUBLISHED:
        state = timm_to_hf_dinov2(state, registers=bool(spec.num_register_tokens))
    path = folder / spec.hub_file
    if path.suffix == ".bin":
        torch.save(state, path)
    else:
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path


@pytest.mark.parametrize("name", NEW)
def test_checkpoint_in_the_publisher_s_format_round_trips(name, tmp_path):
    spec = get_spec(f"{name}-tiny")
    source = create_backbone(spec.name, pretrained=False, init_seed=7).model
    with torch.no_grad():  # LayerScale and norms away from their init, so a mapping error shows
        for key, p in source.named_parameters():
            if "gamma" in key or "norm" in key or "token" in key:
                p.copy_(torch.randn_like(p))
    state = {k: v.clone() for k, v in source.state_dict().items()}
    path = _write(name, spec, state, tmp_path)
    loaded = create_backbone(spec.name, weights=path).model.state_dict()
    assert loaded.keys() == state.keys()
    for key in state:
        assert torch.equal(loaded[key], state[key]), key


@pytest.mark.parametrize("name, hf_class", [("phikon-v2", "Dinov2Model"), ("hibou-l", "Dinov2WithRegistersModel")])
def test_hugging_face_checkpoints_have_the_published_key_names(name, hf_class, tmp_path):
    """The converted tiny checkpoint has exactly the key names transformers' own model has
    (in the published layout), and the pathtwt-loaded model gives transformers' outputs."""
    import transformers

    spec = get_spec(f"{name}-tiny")
    cls = getattr(transformers, hf_class)
    config_cls = getattr(transformers, hf_class.replace("Model", "Config"))
    extra = {"num_register_tokens": 4, "use_swiglu_ffn": True} if spec.num_register_tokens else {"use_swiglu_ffn": False}
    cfg = config_cls(hidden_size=64, num_hidden_layers=12, num_attention_heads=4, mlp_ratio=4,
                     image_size=spec.input_size, patch_size=int(spec.timm_kwargs["patch_size"]), layerscale_value=1e-5,
                     layer_norm_eps=1e-6, qkv_bias=True, **extra)
    hf = cls(cfg).eval()
    source = create_backbone(spec.name, pretrained=False, init_seed=2).model
    converted = timm_to_hf_dinov2(source.state_dict(), registers=bool(spec.num_register_tokens))
    reference = published_layout(hf.state_dict())
    assert set(converted) == set(reference)
    for key, value in converted.items():
        assert tuple(value.shape) == tuple(reference[key].shape), key
    # load into transformers (its in-memory names) and compare the outputs
    hf.load_state_dict(current_layout(converted, hf.state_dict()), strict=True)
    x = torch.randn(2, 3, spec.input_size, spec.input_size)
    with torch.no_grad():
        expected = hf(pixel_values=x).last_hidden_state
        got = source.forward_features(x)
    assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()


# ---------------------------------------------------------------- transforms


def _card_transform(name: str):
    """The model card's eval transform ([T] TRIDENT's loaders, the cards), in torchvision."""
    from torchvision import transforms as T

    mean, std = NORMS[ARCH[name][10]]
    bicubic = T.InterpolationMode.BICUBIC
    resize = {"virchow2": T.Resize(224, interpolation=bicubic), "hibou-l": T.Resize(224, interpolation=bicubic),
              "prov-gigapath": T.Compose([T.Resize(256, interpolation=bicubic), T.CenterCrop(224)])}.get(
        name, T.Compose([T.Resize(224), T.CenterCrop(224)]))
    return T.Compose([resize, T.ToTensor(), T.Normalize(mean, std)])


@pytest.mark.parametrize("name", NEW)
def test_transform_equals_the_model_card_s_on_tiles_at_input_size(name):
    from PIL import Image

    from pathtwt.models.transform import TileTransform

    spec = get_spec(name)

    ours = TileTransform(spec.input_size, spec.mean, spec.std)
    tile = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    card = _card_transform(name)(Image.fromarray(tile))
    got = ours(tile)
    if name == "prov-gigapath":
        # its card enlarges a 224 tile to 256 and crops the centre 224 (it was trained on 256 px
        # tiles); pathtwt feeds the whole tile. Equal on a 256 px tile's central crop only.
        assert not torch.allclose(got, card, atol=1e-2)
        big = np.random.default_rng(1).integers(0, 256, (256, 256, 3), dtype=np.uint8)
        crop = big[16:240, 16:240]
        assert torch.allclose(ours(crop), _card_transform(name)(Image.fromarray(big)), atol=1e-5)
    else:
        assert torch.allclose(got, card, atol=1e-5), (got - card).abs().max()


# ---------------------------------------------------------------- names and hub


def test_unknown_registry_name_lists_close_matches():
    with pytest.raises(WeightsError) as err:
        get_spec("virchow")
    msg = str(err.value)
    assert "\n" not in msg and "virchow2" in msg and "h0-mini," not in msg
    with pytest.raises(WeightsError, match="h-optimus-0"):
        get_spec("hoptimus0")


@pytest.mark.parametrize("name", ["uni", "virchow2", "phikon-v2"])
def test_gated_model_offline_names_the_file_and_where_to_put_it(name, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PATHTWT_WEIGHTS_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    spec = get_spec(name)
    with pytest.raises(WeightsError) as err:
        create_backbone(name)
    msg = str(err.value)
    repo = spec.hub_id.removeprefix("hf-hub:")
    assert "\n" not in msg and f"download {spec.hub_file} from https://huggingface.co/{repo}" in msg
    assert f"weights/{spec.default_weights}" in msg


def test_weights_dir_layout_is_found(tmp_path, monkeypatch):
    spec = get_spec("uni")
    monkeypatch.setenv("PATHTWT_WEIGHTS_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from pathtwt.models.weights import resolve_weights_path

    (tmp_path / "uni").mkdir()
    (tmp_path / "uni" / "pytorch_model.bin").write_bytes(b"")
    assert resolve_weights_path(spec, None) == tmp_path / "uni" / "pytorch_model.bin"


# ---------------------------------------------------------------- timm:NAME


def test_timm_vit_without_registry_entry(tmp_path):
    spec = get_spec("timm:vit_small_patch16_224")
    assert (spec.embed_dim, spec.depth, spec.num_prefix_tokens, spec.input_size) == (384, 12, 1, 224)
    assert spec.mean == (0.5, 0.5, 0.5)  # timm's augreg config for this name
    reg = get_spec("timm:vit_base_patch14_reg4_dinov2")
    assert reg.num_prefix_tokens == 5 and reg.num_register_tokens == 4 and reg.input_size == 518
    # weights in timm's layout load strictly; --mean/--std replace the normalisation
    from safetensors.torch import save_file

    import timm

    src = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=0, depth=2)
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(weights))
    with pytest.raises(WeightsError, match="do not fit"):  # depth 12 architecture, depth 2 weights
        create_backbone("timm:vit_small_patch16_224", weights=weights)
    bb = create_backbone("timm:vit_small_patch16_224", pretrained=False, mean=(0.1, 0.2, 0.3), std=(0.4, 0.5, 0.6))
    assert bb.transform.mean_rgb == (0.1, 0.2, 0.3) and bb.transform.std_rgb == (0.4, 0.5, 0.6)
    with pytest.raises(WeightsError, match="--weights"):
        create_backbone("timm:vit_small_patch16_224")


@pytest.mark.parametrize("name, what", [("timm:swin_tiny_patch4_window7_224", "SwinTransformer"),
                                        ("timm:resnet18", "ResNet")])
def test_timm_model_that_is_not_a_vit_is_refused_in_one_line(name, what):
    with pytest.raises(WeightsError) as err:
        get_spec(name)
    msg = str(err.value)
    assert "\n" not in msg and what in msg and "not a Vision Transformer with `blocks`" in msg


def test_timm_name_timm_does_not_know():
    with pytest.raises(WeightsError) as err:
        get_spec("timm:vit_base_patch16_2244")
    msg = str(err.value)
    assert "\n" not in msg and "does not know" in msg and "vit_base_patch16_224" in msg


def test_registry_listed_in_compress_help(capsys):
    from pathtwt.cli import main

    with pytest.raises(SystemExit):
        main(["compress", "--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps at hyphens
    for name in NEW:
        assert name in text
    assert "timm:NAME" in text


# ---------------------------------------------------------------- hub format


@pytest.mark.parametrize("name", ["uni-tiny", "h-optimus-0-tiny"])
def test_exported_variant_loads_with_timm_alone_through_local_dir(name, tmp_path):
    import re

    import timm

    from pathtwt.compress.export import export_backbone

    teacher = create_backbone(name, pretrained=False, init_seed=5)
    student = create_backbone(name, pretrained=False, init_seed=5).model
    student.blocks = student.blocks[:6]
    extra = {"fidelity": {"on": "report", "final": {"r2": 0.91234, "cosine": 0.98765, "cka": 0.95, "n_tiles": 12}}}
    out = export_backbone(tmp_path / "truncation-6", student, teacher=teacher, method="truncation", extra=extra,
                          calibration_sources=[])
    meta = json.loads((out / "model.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config["architecture"] == meta["timm_name"] and config["model_args"]["depth"] == 6
    # the device the compression ran on, and the torch build
    assert meta["provenance"]["device"]["device"] == "cpu" and meta["provenance"]["device"]["gpu_name"] == ""
    assert config["pretrained_cfg"]["mean"] == meta["mean"] and config["pretrained_cfg"]["num_classes"] == 0
    assert config["pretrained_cfg"]["input_size"] == [3, meta["input_size"], meta["input_size"]]

    plain = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    ours = create_backbone(out)
    x = torch.randn(2, 3, meta["input_size"], meta["input_size"])
    with torch.no_grad():
        assert torch.equal(plain.forward_features(x), ours.model.forward_features(x))
    cfg = timm.data.resolve_model_data_config(plain)
    assert tuple(cfg["mean"]) == tuple(meta["mean"]) and cfg["input_size"][-1] == meta["input_size"]

    card = (out / "README.md").read_text()
    rows = dict(re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|$", card, flags=re.M))
    assert int(rows["params"]) == meta["params"] and int(rows["MACs per tile"]) == meta["macs_per_tile"]
    assert rows["depth"].startswith(f"{meta['timm_kwargs']['depth']} of ") and rows["method"] == "truncation"
    assert float(rows["fidelity R2"]) == pytest.approx(0.91234, abs=1e-4)
    assert float(rows["fidelity cosine"]) == pytest.approx(0.98765, abs=1e-4)
    assert f"license: {BACKBONES[name].licence.split()[0]}" in card and "local-dir:" in card
    assert f"{BACKBONES[name].licence} (inherited from the base model)" in card


@pytest.mark.parametrize("name", ["virchow2", "prov-gigapath"])
def test_report_cost_column_of_an_uncompressed_encoder(name, tmp_path):
    from pathtwt.report.tables import UNCOMPRESSED, variant_cost

    cost = variant_cost(tmp_path, name, UNCOMPRESSED)
    assert (cost.params, cost.depth) == (EXACT_PARAMS[name], get_spec(name).depth)
    assert cost.macs == count_macs(meta_model(name))


def test_weights_of_another_model_name_both_models(tmp_path):
    from safetensors.torch import save_file

    state = create_backbone("virchow2-tiny", pretrained=False).model.state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "w.safetensors"))
    with pytest.raises(WeightsError) as err:
        create_backbone("h-optimus-0-tiny", weights=tmp_path / "w.safetensors")
    msg = str(err.value)
    assert "\n" not in msg and "of h-optimus-0-tiny" in msg and "they fit virchow2-tiny" in msg and "pos_embed" in msg
