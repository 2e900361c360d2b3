"""The encoder facts, as data: per backbone its timm architecture and keyword arguments,
input size, normalisation, token layout, hub id, default weights file, licence and card
(:class:`~pathtwt.models.spec.BackboneSpec`), collected in :data:`BACKBONES` with a tiny
double of each for fast tests. How they are loaded is :mod:`pathtwt.models.registry`'s."""

from __future__ import annotations

import dataclasses
from typing import Any

from pathtwt.models.spec import BackboneSpec

H_OPTIMUS_MEAN = (0.707223, 0.578729, 0.703617)
H_OPTIMUS_STD = (0.211883, 0.230117, 0.177517)
HIBOU_MEAN = (0.7068, 0.5755, 0.7220)
HIBOU_STD = (0.1950, 0.2316, 0.1816)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)



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
    # timm's vit_small_patch14_dinov2 defaults, left out of the kwargs as they always were
    # (a variant's model.json and the teacher cache's key are read from them)
    timm_defaults={"embed_dim": 384, "depth": 12},
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
    hub_id="hf-hub:owkin/phikon-v2", default_weights="phikon-v2/model.safetensors",
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
    hub_id="hf-hub:histai/hibou-L", default_weights="hibou-l/model.safetensors",
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
    hub_id="hf-hub:1aurent/vit_base_patch8_224.kaiko_ai_towards_large_pathology_fms",
    default_weights="kaiko-vitb8/model.safetensors", embedding_recipe="cls", licence="other (see the model card)",
    card="https://huggingface.co/1aurent/vit_base_patch8_224.kaiko_ai_towards_large_pathology_fms",
)
PATHOLOGY_ENCODERS = (UNI, UNI2_H, VIRCHOW2, H_OPTIMUS_0, H_OPTIMUS_1, PROV_GIGAPATH, PHIKON_V2, HIBOU_L, KAIKO_VITB8)


def _tiny(spec: BackboneSpec, name: str) -> BackboneSpec:
    """The same structure (tokens, patch size, MLP type, LayerScale, registers, position
    embedding layout, hub file) at width 64, 4 heads, 12 blocks and a 4 x 4 patch grid
    (56 px at patch 14, 64 px at 16, 32 px at 8), for fast tests. The MLP keeps its shape:
    GELU ratio 4; packed SwiGLU fc1 352 = 2 x 176, Hibou's rounding rule applied to width 64."""
    size = 4 * spec.patch_size
    kwargs = {**spec.timm_kwargs, "embed_dim": 64, "num_heads": 4, "depth": 12, "img_size": size,
              "mlp_ratio": 352 / 64 if spec.mlp == "swiglu-packed" else 4.0}
    return dataclasses.replace(spec, name=name, timm_kwargs=kwargs, input_size=size, hub_id=None, default_weights=None)


BACKBONES: dict[str, BackboneSpec] = {
    spec.name: spec for spec in (H0_MINI, HIBOU_B, VIT_S14_IMGFOCUS, *PATHOLOGY_ENCODERS)
}
BACKBONES.update(
    {tiny.name: tiny for tiny in (_tiny(BACKBONES[name], f"{name.removesuffix('-imgfocus')}-tiny") for name in BACKBONES)}
)
