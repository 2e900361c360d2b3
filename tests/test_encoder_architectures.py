"""Every registered backbone builds the timm model it always built: the architecture
table below was read from the models before the encoder facts were stated once (width,
depth and register count in ``timm_kwargs``, read back by the spec), so a change to how
the facts are written that changes a model fails here. Built on the meta device: no
memory, no weights."""

from __future__ import annotations

import pytest
import torch

from pathtwt.models.encoders import BACKBONES
from pathtwt.models.registry import build_timm_model
from pathtwt.models.spec import ARCHITECTURE_KEYS

# name: (patch, img size, width, depth, heads, registers, fc1 out, MLP class, LayerScale,
# position embeddings on patches only, dynamic image size, parameters)
ARCHITECTURE = {
    "h0-mini": (14, 224, 768, 12, 12, 4, 4096, "GluMlp", True, True, False, 85_739_520),
    "hibou-b": (14, 224, 768, 12, 12, 4, 4096, "GluMlp", True, True, False, 85_739_520),
    "vit-s14-imgfocus": (14, 224, 384, 12, 6, 0, 1536, "Mlp", True, False, False, 21_628_800),
    "uni": (16, 224, 1024, 24, 16, 0, 4096, "Mlp", True, False, True, 303_350_784),
    "uni2-h": (14, 224, 1536, 24, 24, 8, 8192, "GluMlp", True, True, True, 681_394_176),
    "virchow2": (14, 224, 1280, 32, 16, 4, 6832, "GluMlp", True, False, True, 631_239_424),
    "h-optimus-0": (14, 224, 1536, 40, 24, 4, 8192, "GluMlp", True, True, False, 1_134_774_272),
    "h-optimus-1": (14, 224, 1536, 40, 24, 4, 8192, "GluMlp", True, True, False, 1_134_774_272),
    "prov-gigapath": (16, 224, 1536, 40, 24, 0, 8192, "GluMlp", True, False, False, 1_134_953_984),
    "phikon-v2": (16, 224, 1024, 24, 16, 0, 4096, "Mlp", True, False, False, 303_350_784),
    "hibou-l": (14, 224, 1024, 24, 16, 4, 5472, "GluMlp", True, True, False, 303_657_216),
    "kaiko-vitb8": (8, 224, 768, 12, 12, 0, 3072, "Mlp", False, False, True, 85_807_872),
    "h0-mini-tiny": (14, 56, 64, 12, 4, 4, 352, "GluMlp", True, True, False, 653_952),
    "hibou-b-tiny": (14, 56, 64, 12, 4, 4, 352, "GluMlp", True, True, False, 653_952),
    "vit-s14-tiny": (14, 56, 64, 12, 4, 0, 256, "Mlp", True, False, False, 640_320),
    "uni-tiny": (16, 64, 64, 12, 4, 0, 256, "Mlp", True, False, True, 651_840),
    "uni2-h-tiny": (14, 56, 64, 12, 4, 8, 352, "GluMlp", True, True, True, 654_208),
    "virchow2-tiny": (14, 56, 64, 12, 4, 4, 352, "GluMlp", True, False, True, 654_272),
    "h-optimus-0-tiny": (14, 56, 64, 12, 4, 4, 352, "GluMlp", True, True, False, 653_952),
    "h-optimus-1-tiny": (14, 56, 64, 12, 4, 4, 352, "GluMlp", True, True, False, 653_952),
    "prov-gigapath-tiny": (16, 64, 64, 12, 4, 0, 352, "GluMlp", True, False, False, 665_280),
    "phikon-v2-tiny": (16, 64, 64, 12, 4, 0, 256, "Mlp", True, False, False, 651_840),
    "hibou-l-tiny": (14, 56, 64, 12, 4, 4, 352, "GluMlp", True, True, False, 653_952),
    "kaiko-vitb8-tiny": (8, 32, 64, 12, 4, 0, 256, "Mlp", False, False, True, 613_440),
}

# The keyword arguments timm is called with, exactly: a variant's model.json copies them and
# the teacher cache's key is read from them, so they must not gain or lose a key either
# (ViT-S/14 leaves its width and depth to the timm name's defaults, as it always did).
TIMM_KWARGS = {
    "h0-mini": dict(img_size=224, patch_size=14, embed_dim=768, num_heads=12, depth=12, num_classes=0,
        global_pool="token", init_values=1e-05, reg_tokens=4, no_embed_class=True,
        mlp_ratio=5.333333333333333),
    "hibou-b": dict(img_size=224, patch_size=14, embed_dim=768, num_heads=12, depth=12, num_classes=0,
        global_pool="token", init_values=1e-05, reg_tokens=4, no_embed_class=True,
        mlp_ratio=5.333333333333333),
    "vit-s14-imgfocus": dict(img_size=224, patch_size=14, num_classes=0, init_values=1e-05),
    "uni": dict(img_size=224, patch_size=16, embed_dim=1024, depth=24, num_heads=16, init_values=1e-05,
        num_classes=0, dynamic_img_size=True),
    "uni2-h": dict(img_size=224, patch_size=14, embed_dim=1536, depth=24, num_heads=24, init_values=1e-05,
        mlp_ratio=5.33334, num_classes=0, no_embed_class=True, reg_tokens=8, dynamic_img_size=True),
    "virchow2": dict(img_size=224, patch_size=14, embed_dim=1280, depth=32, num_heads=16, init_values=1e-05,
        mlp_ratio=5.3375, num_classes=0, no_embed_class=False, reg_tokens=4, dynamic_img_size=True),
    "h-optimus-0": dict(img_size=224, patch_size=14, embed_dim=1536, depth=40, num_heads=24, init_values=1e-05,
        mlp_ratio=5.33334, num_classes=0, global_pool="token", reg_tokens=4, no_embed_class=True,
        dynamic_img_size=False),
    "h-optimus-1": dict(img_size=224, patch_size=14, embed_dim=1536, depth=40, num_heads=24, init_values=1e-05,
        mlp_ratio=5.33334, num_classes=0, global_pool="token", reg_tokens=4, no_embed_class=True,
        dynamic_img_size=False),
    "prov-gigapath": dict(img_size=224, patch_size=16, embed_dim=1536, depth=40, num_heads=24,
        init_values=1e-05, mlp_ratio=5.33334, num_classes=0),
    "phikon-v2": dict(img_size=224, patch_size=16, embed_dim=1024, depth=24, num_heads=16, init_values=1e-05,
        mlp_ratio=4.0, num_classes=0),
    "hibou-l": dict(img_size=224, patch_size=14, embed_dim=1024, num_heads=16, depth=24, num_classes=0,
        global_pool="token", init_values=1e-05, reg_tokens=4, no_embed_class=True, mlp_ratio=5.34375),
    "kaiko-vitb8": dict(img_size=224, patch_size=8, embed_dim=768, depth=12, num_heads=12, num_classes=0,
        dynamic_img_size=True),
}


def test_the_table_covers_every_backbone():
    assert set(ARCHITECTURE) == set(BACKBONES)
    assert set(TIMM_KWARGS) == {n for n in BACKBONES if not n.endswith("-tiny")}


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_every_backbone_builds_the_model_it_always_built(name):
    spec = BACKBONES[name]
    model = build_timm_model(spec, device=torch.device("meta"))
    block = model.blocks[0]
    built = (
        int(model.patch_embed.patch_size[0]), int(model.patch_embed.img_size[0]), int(model.embed_dim),
        len(model.blocks), int(block.attn.num_heads), int(getattr(model, "num_reg_tokens", 0)),
        int(block.mlp.fc1.out_features), type(block.mlp).__name__, type(block.ls1).__name__ != "Identity",
        bool(model.no_embed_class), bool(model.dynamic_img_size), sum(t.numel() for t in model.state_dict().values()),
    )
    assert built == ARCHITECTURE[name]
    # what pathtwt reads of the spec is what the model is
    assert (spec.embed_dim, spec.depth, spec.num_register_tokens, spec.num_prefix_tokens, spec.patch_size) == (
        built[2], built[3], built[5], int(model.num_prefix_tokens), built[0])
    assert spec.num_patch_tokens == int(model.patch_embed.num_patches)


@pytest.mark.parametrize("name", sorted(TIMM_KWARGS))
def test_timm_is_called_with_the_same_keyword_arguments(name):
    assert dict(BACKBONES[name].timm_kwargs) == TIMM_KWARGS[name]


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_each_architecture_fact_is_stated_once(name):
    spec = BACKBONES[name]
    assert not set(spec.timm_defaults) & set(spec.timm_kwargs)
    assert set(spec.timm_defaults) <= set(ARCHITECTURE_KEYS)
