"""Backbone registry and loaders.

Per-model facts (timm architecture and keyword arguments, input size, normalisation,
token layout, hub id, default precision) are data in :data:`BACKBONES`;
:func:`create_backbone` returns the model together with its transform and precision, so
the normalisation used for a model can never be mismatched.

``timm_kwargs`` are plain JSON (they are also written to a variant's ``model.json``), so
a user without pathtwt rebuilds any registry model or exported variant with::

    timm.create_model(meta["timm_name"], pretrained=False, **meta["timm_kwargs"])

Layer classes given as dotted names ("timm.layers.SwiGLUPacked") are still accepted and
resolved by :func:`resolve_timm_kwargs`, for hand-written variant folders.

Weights resolve in this order: an explicit local path (``.safetensors``, ``.pth``/``.pt``,
``.bin``, or a Hugging Face snapshot folder), the spec's local hint, the hub (only when
reachable and ``HF_HUB_OFFLINE`` is unset), otherwise a :class:`WeightsError` that says
which file to download and where to put it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pathtwt.devices import resolve_device
from pathtwt.errors import WeightsError
from pathtwt.models.spec import BackboneSpec
from pathtwt.models.weights import load_state_dict_file, resolve_weights_path, state_dict_to_timm

VARIANT_FORMAT = "pathtwt-backbone/1"

H_OPTIMUS_MEAN = (0.707223, 0.578729, 0.703617)
H_OPTIMUS_STD = (0.211883, 0.230117, 0.177517)
HIBOU_MEAN = (0.7068, 0.5755, 0.7220)
HIBOU_STD = (0.1950, 0.2316, 0.1816)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Layer classes that may appear as dotted names in JSON timm_kwargs. A whitelist, not
# an import of arbitrary strings from a model.json.
_LAYER_CLASSES = {
    "timm.layers.SwiGLUPacked": ("timm.layers", "SwiGLUPacked"),
    "timm.layers.SwiGLU": ("timm.layers", "SwiGLU"),
    "timm.layers.Mlp": ("timm.layers", "Mlp"),
    "timm.layers.GluMlp": ("timm.layers", "GluMlp"),
    "torch.nn.SiLU": ("torch.nn", "SiLU"),
    "torch.nn.GELU": ("torch.nn", "GELU"),
}


# DINOv2-with-registers ViT-B/14 with a packed SwiGLU MLP (fc1 -> 4096 = 2 x 2048 -> 768).
# mlp_ratio is fc1's width over embed_dim; 4096 / 768 gives the 85.74 M parameters of the
# paper's H0-mini (5.3375, H-optimus-0's ratio, would give an odd width at 768).
# The timm entry is the reg4 DINOv2 family member whose defaults already carry the packed
# SwiGLU MLP and SiLU (timm's "giant" entry); width, heads and depth are overridden to
# ViT-B below. Its modules and state-dict keys are exactly those of H0-mini's hub model,
# and it keeps every keyword argument plain JSON, so an exported student loads with
# `timm.create_model(name, **kwargs)` alone, without passing layer classes.
_SWIGLU_REG4_TIMM_NAME = "vit_giant_patch14_reg4_dinov2"
_VIT_B14_REG4_SWIGLU: dict[str, Any] = dict(
    img_size=224,
    patch_size=14,
    embed_dim=768,
    num_heads=12,
    depth=12,
    num_classes=0,
    global_pool="token",
    init_values=1e-5,
    reg_tokens=4,
    no_embed_class=True,
    mlp_ratio=4096 / 768,
)

H0_MINI = BackboneSpec(
    name="h0-mini",
    timm_name=_SWIGLU_REG4_TIMM_NAME,
    timm_kwargs=_VIT_B14_REG4_SWIGLU,
    input_size=224,
    mean=H_OPTIMUS_MEAN,
    std=H_OPTIMUS_STD,
    num_prefix_tokens=5,
    num_register_tokens=4,
    embed_dim=768,
    depth=12,
    hub_id="hf-hub:bioptimus/H0-mini",
    default_weights="h0-mini.safetensors",
    mlp="swiglu-packed",
    embedding_recipe="cls+mean",
    licence="cc-by-nc-nd-4.0",
    card="https://huggingface.co/bioptimus/H0-mini",
)
# Hibou-B has the same architecture; it is published in Hugging Face's layout.
HIBOU_B = dataclasses.replace(
    H0_MINI,
    name="hibou-b",
    mean=HIBOU_MEAN,
    std=HIBOU_STD,
    hub_id="hf-hub:histai/hibou-b",
    weights_layout="hf-dinov2-registers",
    default_weights="hibou-b.safetensors",
    embedding_recipe="cls",  # the card's pooler_output: the normed CLS token
    licence="apache-2.0",
    card="https://huggingface.co/histai/hibou-b",
)
VIT_S14_IMGFOCUS = BackboneSpec(
    name="vit-s14-imgfocus",
    timm_name="vit_small_patch14_dinov2",
    timm_kwargs=dict(img_size=224, patch_size=14, num_classes=0, init_values=1e-5),
    input_size=224,
    mean=IMAGENET_MEAN,
    std=IMAGENET_STD,
    num_prefix_tokens=1,
    num_register_tokens=0,
    embed_dim=384,
    depth=12,
    pathology=False,
    default_weights="vit_s14_imgfocus.safetensors",
)


# --- The encoders pathologists run -------------------------------------------------------
# Sources (cited per entry as [T] etc.):
# [T] TRIDENT, trident/patch_encoder_models/load.py (mahmoodlab/TRIDENT): the timm name and
#     keyword arguments each loader passes, the hub id, the file it names for a local
#     checkpoint, the eval transform and the pooled output; utils/constants.py: the
#     Hibou and kaiko mean/std.
# [C] the model card at the entry's ``card`` address.
# [timm] timm's own model definitions, for the defaults a name carries (vision_transformer.py:
#     vit_large_patch16_224: 1024 wide, 24 deep, 16 heads; vit_huge_patch14_224: 1280, 32, 16;
#     vit_giant_patch14_dinov2: 1536, 40, 24, init_values 1e-5, mlp_ratio 2.66667 * 2, packed
#     SwiGLU + SiLU; vit_base_patch8_224: 768, 12, 12).
# Every entry spells out width, depth and heads even where the timm name's defaults give
# them, so the record is readable without timm's source and tiny doubles can override them.
# Layer classes are never passed: SwiGLU models use a timm name whose defaults carry the
# packed SwiGLU and SiLU (the DINOv2 giant entries), so timm_kwargs stay plain JSON and an
# exported student loads with timm alone (config.json's model_args).
_SWIGLU_TIMM_NAME = "vit_giant_patch14_dinov2"  # packed SwiGLU + SiLU, no registers, pos on CLS

# UNI (v1): ViT-L/16, LayerScale 1e-5, 224 px, ImageNet normalisation, CLS embedding (1024).
# [T] UNIInferenceEncoder: vit_large_patch16_224, img_size 224, patch_size 16, init_values
# 1e-5, num_classes 0, dynamic_img_size True; hub MahmoodLab/uni; pytorch_model.bin; transform
# Resize(224), CenterCrop(224), ImageNet mean/std; output the pooled CLS token.
UNI = BackboneSpec(
    name="uni",
    timm_name="vit_large_patch16_224",
    timm_kwargs=dict(img_size=224, patch_size=16, embed_dim=1024, depth=24, num_heads=16, init_values=1e-5,
                     num_classes=0, dynamic_img_size=True),
    input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD,
    num_prefix_tokens=1, num_register_tokens=0, embed_dim=1024, depth=24,
    hub_id="hf-hub:MahmoodLab/UNI", hub_file="pytorch_model.bin", default_weights="uni/pytorch_model.bin",
    embedding_recipe="cls", licence="cc-by-nc-nd-4.0",
    card="https://huggingface.co/MahmoodLab/UNI",
)
# UNI2-h: ViT-H/14 with 8 registers, 1536 wide, 24 deep, 24 heads, packed SwiGLU with
# mlp_ratio 2.66667 * 2 (fc1 8192 = 2 x 4096), LayerScale 1e-5, position embeddings on
# patches only. [T] UNIv2InferenceEncoder's timm_kwargs (vit_giant_patch14_224 with
# SwiGLUPacked/SiLU passed as classes; the same modules and keys as the DINOv2 giant entry
# used here); hub MahmoodLab/UNI2-h, pytorch_model.bin; ImageNet mean/std; CLS (1536).
UNI2_H = BackboneSpec(
    name="uni2-h",
    timm_name=_SWIGLU_REG4_TIMM_NAME,
    timm_kwargs=dict(img_size=224, patch_size=14, embed_dim=1536, depth=24, num_heads=24, init_values=1e-5,
                     mlp_ratio=2.66667 * 2, num_classes=0, no_embed_class=True, reg_tokens=8,
                     dynamic_img_size=True),
    input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD,
    num_prefix_tokens=9, num_register_tokens=8, embed_dim=1536, depth=24,
    hub_id="hf-hub:MahmoodLab/UNI2-h", hub_file="pytorch_model.bin", default_weights="uni2-h/pytorch_model.bin",
    mlp="swiglu-packed", embedding_recipe="cls", licence="cc-by-nc-nd-4.0",
    card="https://huggingface.co/MahmoodLab/UNI2-h",
)
# Virchow2: ViT-H/14 (1280 wide, 32 deep, 16 heads), 4 registers, packed SwiGLU with
# mlp_ratio 5.3375 (fc1 6832 = 2 x 3416), LayerScale 1e-5, position embeddings on CLS,
# registers and patches (timm's default no_embed_class=False: 261 positions at 224 px).
# [T] Virchow2InferenceEncoder: vit_huge_patch14_224, img_size 224, init_values 1e-5,
# reg_tokens 4, mlp_ratio 5.3375, global_pool "", dynamic_img_size True, SwiGLUPacked/SiLU;
# hub paige-ai/Virchow2, pytorch_model.bin; ImageNet mean/std. Embedding [T][C]: concat(CLS,
# mean of tokens 5:) = the patch tokens, registers excluded, 2560-d; ``--embedding cls`` is
# the card's CLS-only alternative (1280-d).
VIRCHOW2 = BackboneSpec(
    name="virchow2",
    timm_name=_SWIGLU_REG4_TIMM_NAME,
    timm_kwargs=dict(img_size=224, patch_size=14, embed_dim=1280, depth=32, num_heads=16, init_values=1e-5,
                     mlp_ratio=5.3375, num_classes=0, no_embed_class=False, reg_tokens=4, dynamic_img_size=True),
    input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD,
    num_prefix_tokens=5, num_register_tokens=4, embed_dim=1280, depth=32,
    hub_id="hf-hub:paige-ai/Virchow2", hub_file="pytorch_model.bin", default_weights="virchow2/pytorch_model.bin",
    mlp="swiglu-packed", embedding_recipe="cls+mean", licence="cc-by-nc-nd-4.0",
    card="https://huggingface.co/paige-ai/Virchow2",
)
# H-optimus-0: ViT-g/14 (1536 wide, 40 deep, 24 heads), 4 registers, packed SwiGLU (mlp_ratio
# 2.66667 * 2, timm's default for the name), LayerScale 1e-5, 224 px, fixed image size.
# [T] HOptimus0InferenceEncoder: vit_giant_patch14_reg4_dinov2, img_size 224, init_values
# 1e-5, global_pool token, dynamic_img_size False; hub bioptimus/H-optimus-0,
# pytorch_model.bin; Resize(224) + H-optimus mean/std; output the CLS token (1536).
H_OPTIMUS_0 = BackboneSpec(
    name="h-optimus-0",
    timm_name=_SWIGLU_REG4_TIMM_NAME,
    timm_kwargs=dict(img_size=224, patch_size=14, embed_dim=1536, depth=40, num_heads=24, init_values=1e-5,
                     mlp_ratio=2.66667 * 2, num_classes=0, global_pool="token", reg_tokens=4,
                     no_embed_class=True, dynamic_img_size=False),
    input_size=224, mean=H_OPTIMUS_MEAN, std=H_OPTIMUS_STD,
    num_prefix_tokens=5, num_register_tokens=4, embed_dim=1536, depth=40,
    hub_id="hf-hub:bioptimus/H-optimus-0", hub_file="pytorch_model.bin",
    default_weights="h-optimus-0/pytorch_model.bin", mlp="swiglu-packed",
    embedding_recipe="cls", licence="apache-2.0", card="https://huggingface.co/bioptimus/H-optimus-0",
)
# H-optimus-1: H-optimus-0's architecture and normalisation ([T] HOptimus1InferenceEncoder,
# the same timm_kwargs); hub bioptimus/H-optimus-1.
H_OPTIMUS_1 = dataclasses.replace(
    H_OPTIMUS_0, name="h-optimus-1", hub_id="hf-hub:bioptimus/H-optimus-1",
    default_weights="h-optimus-1/pytorch_model.bin", licence="other (academic research only; see the model card)",
    card="https://huggingface.co/bioptimus/H-optimus-1",
)
# Prov-GigaPath tile encoder: ViT-g with 16 px patches (1536 wide, 40 deep, 24 heads), packed
# SwiGLU mlp_ratio 5.33334, LayerScale 1e-5, no registers, position embeddings on CLS too.
# [T] GigaPathInferenceEncoder: vit_giant_patch14_dinov2, img_size 224, patch_size 16,
# embed_dim 1536, depth 40, num_heads 24, mlp_ratio 5.33334 (init_values and the SwiGLU from
# the name's defaults [timm]); hub prov-gigapath/prov-gigapath, pytorch_model.bin;
# Resize(256, bicubic) + CenterCrop(224), ImageNet mean/std; CLS (1536).
PROV_GIGAPATH = BackboneSpec(
    name="prov-gigapath",
    timm_name=_SWIGLU_TIMM_NAME,
    timm_kwargs=dict(img_size=224, patch_size=16, embed_dim=1536, depth=40, num_heads=24, init_values=1e-5,
                     mlp_ratio=5.33334, num_classes=0),
    input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD,
    num_prefix_tokens=1, num_register_tokens=0, embed_dim=1536, depth=40,
    hub_id="hf-hub:prov-gigapath/prov-gigapath", hub_file="pytorch_model.bin",
    default_weights="prov-gigapath/pytorch_model.bin", mlp="swiglu-packed", embedding_recipe="cls",
    licence="apache-2.0", card="https://huggingface.co/prov-gigapath/prov-gigapath",
)
# Phikon-v2: DINOv2 ViT-L/16 (1024 wide, 24 deep, 16 heads), GELU MLP ratio 4, LayerScale,
# no registers; published in Hugging Face's Dinov2 layout (converted on load,
# pathtwt.models.hf_dinov2). [T] Phikonv2InferenceEncoder: AutoModel owkin/phikon-v2,
# model.safetensors + config.json; Resize(224), CenterCrop(224), ImageNet mean/std; output
# last_hidden_state[:, 0] (the normed CLS, 1024).
PHIKON_V2 = BackboneSpec(
    name="phikon-v2",
    timm_name="vit_large_patch14_dinov2",
    timm_kwargs=dict(img_size=224, patch_size=16, embed_dim=1024, depth=24, num_heads=16, init_values=1e-5,
                     mlp_ratio=4.0, num_classes=0),
    input_size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD,
    num_prefix_tokens=1, num_register_tokens=0, embed_dim=1024, depth=24,
    hub_id="hf-hub:owkin/phikon-v2", weights_layout="hf-dinov2", default_weights="phikon-v2/model.safetensors",
    embedding_recipe="cls", licence="other (see the model card)", card="https://huggingface.co/owkin/phikon-v2",
)
# Hibou-L: Hibou-B's design at ViT-L/14 (1024 wide, 24 deep, 16 heads), 4 registers, packed
# SwiGLU whose hidden width follows Hibou's rule (2/3 of 4 x 1024, rounded up to a multiple
# of 8: 2736, so fc1 = 5472 = 5.34375 x 1024), LayerScale; Hugging Face's Dinov2-with-registers
# layout. [T] HibouLInferenceEncoder: histai/hibou-L, Hibou mean/std, Resize(224) bicubic,
# output pooler_output (the normed CLS, 1024).
HIBOU_L = dataclasses.replace(
    HIBOU_B,
    name="hibou-l",
    timm_kwargs={**_VIT_B14_REG4_SWIGLU, "embed_dim": 1024, "depth": 24, "num_heads": 16, "mlp_ratio": 5472 / 1024},
    embed_dim=1024, depth=24, hub_id="hf-hub:histai/hibou-L", default_weights="hibou-l/model.safetensors",
    card="https://huggingface.co/histai/hibou-L",
)
# kaiko ViT-B/8 ("Towards large-scale training of pathology foundation models"): timm's
# vit_base_patch8_224 (768 wide, 12 deep, 12 heads, GELU, no LayerScale, no registers),
# 224 px, mean = std = 0.5. [T] KaikoB8InferenceEncoder: hub
# 1aurent/vit_base_patch8_224.kaiko_ai_towards_large_pathology_fms (timm format,
# model.safetensors), dynamic_img_size True, num_classes 0; KAIKO_MEAN/STD; output the CLS (768).
KAIKO_VITB8 = BackboneSpec(
    name="kaiko-vitb8",
    timm_name="vit_base_patch8_224",
    timm_kwargs=dict(img_size=224, patch_size=8, embed_dim=768, depth=12, num_heads=12, num_classes=0,
                     dynamic_img_size=True),
    input_size=224, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5),
    num_prefix_tokens=1, num_register_tokens=0, embed_dim=768, depth=12,
    hub_id="hf-hub:1aurent/vit_base_patch8_224.kaiko_ai_towards_large_pathology_fms",
    default_weights="kaiko-vitb8/model.safetensors", embedding_recipe="cls", licence="other (see the model card)",
    card="https://huggingface.co/1aurent/vit_base_patch8_224.kaiko_ai_towards_large_pathology_fms",
)
PATHOLOGY_ENCODERS = (UNI, UNI2_H, VIRCHOW2, H_OPTIMUS_0, H_OPTIMUS_1, PROV_GIGAPATH, PHIKON_V2, HIBOU_L, KAIKO_VITB8)


def _tiny(spec: BackboneSpec, name: str) -> BackboneSpec:
    """The same structure (tokens, patch size, MLP type, LayerScale, registers, position
    embedding layout, weights layout) at width 64, 4 heads, 12 blocks and a 4 x 4 patch grid
    (56 px at patch 14, 64 px at 16, 32 px at 8), for fast tests. The MLP keeps its shape:
    GELU ratio 4; packed SwiGLU fc1 352 = 2 x 176, Hibou's rounding rule applied to width 64."""
    patch = int(spec.timm_kwargs.get("patch_size", 14))
    size = 4 * patch
    kwargs = {**spec.timm_kwargs, "embed_dim": 64, "num_heads": 4, "depth": 12, "img_size": size,
              "mlp_ratio": 352 / 64 if spec.mlp == "swiglu-packed" else 4.0}
    return dataclasses.replace(
        spec, name=name, timm_kwargs=kwargs, input_size=size, embed_dim=64, depth=12, hub_id=None, default_weights=None
    )


BACKBONES: dict[str, BackboneSpec] = {
    spec.name: spec for spec in (H0_MINI, HIBOU_B, VIT_S14_IMGFOCUS, *PATHOLOGY_ENCODERS)
}
BACKBONES.update(
    {tiny.name: tiny for tiny in (_tiny(BACKBONES[name], f"{name.removesuffix('-imgfocus')}-tiny") for name in BACKBONES)}
)


def known_backbones() -> str:
    return ", ".join(sorted(BACKBONES))


def get_spec(name_or_dir: str | os.PathLike) -> BackboneSpec:
    """Registry entry by name, or the spec of a variant folder holding ``model.json``."""
    key = os.fspath(name_or_dir)
    if key in BACKBONES:
        return BACKBONES[key]
    from pathtwt.models.timm_spec import is_timm_name, timm_spec

    if is_timm_name(key):
        return timm_spec(key)
    path = Path(key)
    if (path / "model.json").is_file():
        return spec_from_variant(path)
    if path.exists():
        raise WeightsError(
            f"{path}: not a backbone variant folder (no model.json); give a registry name "
            f"({known_backbones()}) or a folder written by `pathtwt compress`"
        )
    import difflib

    close = difflib.get_close_matches(key.lower(), BACKBONES, n=4, cutoff=0.5)
    hint = f"close matches: {', '.join(close)}" if close else f"known backbones: {known_backbones()}"
    raise WeightsError(f"unknown backbone {key!r}; {hint} (or a variant folder, or timm:NAME for another timm ViT)")


def spec_from_variant(folder: str | os.PathLike) -> BackboneSpec:
    """Read a variant folder's ``model.json`` (written by pathtwt.compress.export) into a spec."""
    folder = Path(folder)
    meta_path = folder / "model.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise WeightsError(f"{meta_path}: unreadable ({exc}); re-run `pathtwt compress` for this variant") from None
    if meta.get("format") != VARIANT_FORMAT:
        raise WeightsError(f"{meta_path}: format is {meta.get('format')!r}, expected {VARIANT_FORMAT!r}")
    required = ("name", "timm_name", "timm_kwargs", "input_size", "mean", "std", "num_prefix_tokens", "embed_dim")
    missing = [k for k in required if k not in meta]
    if missing:
        raise WeightsError(f"{meta_path}: missing keys {missing}; re-run `pathtwt compress` for this variant")
    base = BACKBONES.get(meta.get("base_backbone", ""))
    kwargs = dict(meta["timm_kwargs"])
    depth = variant_depth(meta)
    return BackboneSpec(
        name=str(meta["name"]),
        timm_name=str(meta["timm_name"]),
        timm_kwargs=kwargs,
        input_size=int(meta["input_size"]),
        mean=tuple(float(v) for v in meta["mean"]),
        std=tuple(float(v) for v in meta["std"]),
        num_prefix_tokens=int(meta["num_prefix_tokens"]),
        num_register_tokens=int(meta.get("num_register_tokens", int(meta["num_prefix_tokens"]) - 1)),
        embed_dim=int(meta["embed_dim"]),
        depth=12 if depth is None else depth,
        default_precision=meta.get("default_precision", base.default_precision if base else "fp32"),
        pathology=bool(meta.get("pathology", base.pathology if base else True)),
        default_weights=str(folder / "model.safetensors"),
        base_backbone=meta.get("base_backbone"),
        layer_patches=dict(meta.get("layer_patches") or {}),
        variant_dir=str(folder),
        mlp=base.mlp if base else "gelu",
        embedding_recipe=base.embedding_recipe if base else "cls+mean",
        licence=meta.get("licence", base.licence if base else None),
        card=base.card if base else None,
    )


def variant_metadata(spec: BackboneSpec, depth: int, **extra: Any) -> dict[str, Any]:
    """The architecture part of a variant's ``model.json`` for a depth-``depth`` student
    of ``spec``; exporters add params, MACs, hashes, plan and provenance via ``extra``.
    The depth is written once, in ``timm_kwargs`` (timm builds the model from there); read
    it with :func:`variant_depth`."""
    meta: dict[str, Any] = {
        "format": VARIANT_FORMAT,
        "base_backbone": spec.base_backbone or spec.name,
        "timm_name": spec.timm_name,
        "timm_kwargs": {**spec.timm_kwargs, "depth": int(depth)},
        "input_size": spec.input_size,
        "mean": list(spec.mean),
        "std": list(spec.std),
        "num_prefix_tokens": spec.num_prefix_tokens,
        "num_register_tokens": spec.num_register_tokens,
        "embed_dim": spec.embed_dim,
        "default_precision": spec.default_precision,
        "pathology": spec.pathology,
        "licence": spec.licence,
        "layer_patches": {},
    }
    meta.update(extra)
    return meta


def variant_depth(meta: Mapping[str, Any]) -> int | None:
    """The number of blocks of the variant a ``model.json`` describes: ``timm_kwargs.depth``,
    else the top-level ``depth`` that model.json files of earlier versions carried as a
    second copy (so they still read); None when neither is recorded."""
    kwargs = meta.get("timm_kwargs")
    depth = kwargs.get("depth") if isinstance(kwargs, Mapping) else None
    if depth is None:
        depth = meta.get("depth")
    return None if depth is None else int(depth)


def resolve_timm_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Turn dotted layer-class names in JSON timm kwargs into the classes timm expects."""
    import importlib

    out = dict(kwargs)
    for key in ("mlp_layer", "act_layer", "block_fn"):
        value = out.get(key)
        if isinstance(value, str) and "." in value:
            if value not in _LAYER_CLASSES:
                raise WeightsError(
                    f"timm_kwargs[{key!r}] = {value!r} is not a known layer class; known: {sorted(_LAYER_CLASSES)}"
                )
            module, attr = _LAYER_CLASSES[value]
            out[key] = getattr(importlib.import_module(module), attr)
    return out


def build_timm_model(spec: BackboneSpec, depth: int | None = None, device: Any = None):
    """The bare timm VisionTransformer of ``spec`` (random weights, layer patches applied),
    optionally at another depth. ``device="meta"`` builds it without memory for shapes."""
    import timm
    import torch

    kwargs = resolve_timm_kwargs(spec.timm_kwargs)
    if depth is not None:
        kwargs["depth"] = int(depth)
    import contextlib

    from pathtwt.models.layer_patches import apply_layer_patches

    # the patches' own modules are built on the same device (meta: shapes only)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = timm.create_model(spec.timm_name, pretrained=False, **kwargs)
        if spec.layer_patches:
            apply_layer_patches(model, spec.layer_patches)
    return model.eval()


@dataclass
class Backbone:
    """A ready-to-run backbone: model (eval mode), its transform and precision together."""

    model: Any
    transform: Any
    precision: str
    spec: BackboneSpec
    weights_sha256: str | None
    source: str
    device: str = "cpu"
    # precision "auto" on a device with native bf16: fp32 weights run under bf16 autocast,
    # kept by the run's first-tiles guard (pathtwt.models.precision, pathtwt.models.bf16_guard)
    bf16_autocast: bool = False
    fp32_matmul: str = "ieee"  # "tf32" on CUDA GPUs that have it (choose_fp32_matmul)

    @property
    def embedding_dim(self) -> int:
        return self.spec.embedding_dim

    def embed_tiles(self, x, recipe: str = "cls+mean"):
        """(B, 3, H, W) normalised input -> float32 tile embeddings, (B, 2 * D) for the
        ``cls+mean`` recipe, (B, D) for ``cls`` (pathtwt.models.embedding)."""
        from pathtwt.models.embedding import embed_tiles

        return embed_tiles(self.model, x, self.spec.num_prefix_tokens, recipe)


def create_backbone(
    name_or_dir: str | os.PathLike,
    weights: str | os.PathLike | None = None,
    pretrained: bool = True,
    device: str = "cpu",
    precision: str = "auto",
    init_seed: int = 0,
    mean: tuple[float, float, float] | None = None,
    std: tuple[float, float, float] | None = None,
) -> Backbone:
    """Build a backbone by registry name or variant folder.

    ``pretrained=False`` builds the exact architecture with random weights drawn with
    ``init_seed`` (for tests and benchmarks; the global RNG is left untouched).
    ``device="auto"`` picks CUDA when available. Parameters are frozen (eval mode).
    ``mean``/``std`` replace the spec's normalisation (``--mean/--std``, for ``timm:NAME``
    models trained with another one). ``precision``: ``--precision`` as
    :func:`pathtwt.models.precision.resolve_precision` reads it for inference; the weights'
    dtype goes to ``Backbone.precision`` and ``auto``'s bf16 autocast to ``bf16_autocast``.
    """
    import torch

    device = resolve_device(device)

    from pathtwt.models.transform import TileTransform, data_config

    spec = get_spec(name_or_dir)
    if mean is not None or std is not None:
        spec = dataclasses.replace(spec, mean=tuple(mean or spec.mean), std=tuple(std or spec.std))
    from pathtwt.models.precision import choose_fp32_matmul, resolve_precision

    chosen = resolve_precision(precision, device, default=spec.default_precision)
    resolved_precision = chosen.weights
    fp32_matmul = choose_fp32_matmul(device)
    # weights first: a missing file is reported before the (slow) model build
    path = resolve_weights_path(spec, weights) if (pretrained or weights is not None) else None
    sha: str | None = None
    source = f"random-init(seed={init_seed})"
    if path is not None:
        model = _model_from_weights(spec, load_state_dict_file(path), source=str(path))
        from pathtwt.io.atomic import sha256_file

        sha = sha256_file(path) if path.is_file() else _folder_weights_sha(path)
        source = str(path)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            model = build_timm_model(spec)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[resolved_precision]
    model = model.to(device=device, dtype=dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    # the registry's preprocessing as the model's timm data config, read back from there
    model.pretrained_cfg = {**(getattr(model, "pretrained_cfg", None) or {}), **data_config(spec.input_size, spec.mean, spec.std)}
    transform = TileTransform.for_model(model)
    return Backbone(
        model=model, transform=transform, precision=resolved_precision, spec=spec,
        weights_sha256=sha, source=source, device=str(device), bf16_autocast=chosen.autocast, fp32_matmul=fp32_matmul,
    )


def _model_from_weights(spec: BackboneSpec, state: Mapping[str, Any], source: str):
    """``spec``'s model holding ``state``, built without a random initialisation: the
    architecture is laid out on the meta device (shapes only) and the loaded tensors become
    its parameters, instead of timm's initialisation of weights that are overwritten at
    once and a second copy of them in memory (a job building H0-mini from its file: 6.5 ->
    5.4 s, peak 1368 -> 837 MiB; ViT-S: 5.8 -> 5.4 s). A model that keeps a tensor no
    checkpoint holds (a non-persistent buffer) is built as before and loaded by copy."""
    import torch

    model = build_timm_model(spec, device=torch.device("meta"))
    state = state_dict_to_timm(state, model)
    load_exact(model, state, source=source, backbone=spec.name, assign=True)
    if not any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        return model
    model = build_timm_model(spec)
    load_exact(model, state, source=source, backbone=spec.name)
    return model


def _folder_weights_sha(path: Path) -> str:
    from pathtwt.io.atomic import sha256_file
    from pathtwt.models.weights import snapshot_weights_file

    return sha256_file(snapshot_weights_file(path))


def fitting_backbones(state: Mapping[str, Any]) -> list[str]:
    """Registry names whose architecture has exactly these keys and shapes (counted on the
    meta device), to name the model a mismatching weights file belongs to."""
    import torch

    shapes = {k: tuple(getattr(v, "shape", ())) for k, v in state.items()}
    width = shapes.get("cls_token", (0,))[-1]
    depth = len({k.split(".")[1] for k in shapes if k.startswith("blocks.")})
    patch = shapes.get("patch_embed.proj.weight", (0,))[-1]
    registers = shapes.get("reg_token", (0, 0))[1]
    names = []
    for name, spec in BACKBONES.items():
        key = (spec.embed_dim, int(spec.timm_kwargs.get("depth", spec.depth)), int(spec.timm_kwargs.get("patch_size", 14)),
               spec.num_register_tokens)
        if key != (width, depth, patch, registers):
            continue  # only the few of the same width, depth, patch and registers are built
        try:
            candidate = build_timm_model(spec, device=torch.device("meta")).state_dict()
        except Exception:  # noqa: BLE001 - a spec that cannot be built fits nothing
            continue
        if candidate.keys() == shapes.keys() and all(tuple(v.shape) == shapes[k] for k, v in candidate.items()):
            names.append(name)
    return names


def load_exact(model, state: Mapping[str, Any], source: str, backbone: str | None = None, assign: bool = False) -> None:
    """``load_state_dict(strict=True)`` with an error naming the first mismatching keys, the
    backbone asked for and the registry backbones the weights do fit (``assign``: the
    state's tensors become the parameters, for a model laid out on the meta device)."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong_shape = [
        f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing {missing[:3]}")
    if unexpected:
        problems.append(f"unexpected {unexpected[:3]}")
    if wrong_shape:
        problems.append(f"shape {wrong_shape[:3]}")
    if problems:
        fits = fitting_backbones(state)
        them = f"; they fit {', '.join(fits)}" if fits else ""
        asked = f" of {backbone}" if backbone else ""
        raise WeightsError(
            f"{source}: weights do not fit the architecture{asked} ({'; '.join(problems)}){them}; "
            "check that --backbone matches the weights file"
        )
    model.load_state_dict(state, strict=True, assign=assign)
