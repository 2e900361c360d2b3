"""``timm:NAME``: any timm Vision Transformer as a backbone, without a registry entry.

The architecture is read from the timm model itself, built on the meta device (no memory,
no download): width, depth, prefix tokens (CLS + registers), patch size, and the input
size, mean and std of its default pretrained config (``--mean/--std`` override them; a
model trained with another normalisation needs them). The weights come from ``--weights``
(or ``--random-init``): pathtwt never guesses a hub file for such a model.

pathtwt pools the CLS token and the patch tokens and compresses by dropping and merging
``blocks``, so a model that is not a ``VisionTransformer`` with a class token (a Swin, a
CNN, a ViT pooled without CLS) is refused in one line.
"""

from __future__ import annotations

import difflib

from pathtwt.errors import WeightsError
from pathtwt.models.spec import BackboneSpec

PREFIX = "timm:"


def is_timm_name(name: str) -> bool:
    return name.startswith(PREFIX)


def timm_spec(name: str) -> BackboneSpec:
    """The spec of ``timm:NAME`` (see the module docstring)."""
    import timm
    import torch
    from timm.models.vision_transformer import VisionTransformer

    model_name = name[len(PREFIX):]
    if not timm.is_model(model_name):
        close = difflib.get_close_matches(model_name, timm.list_models(), n=3, cutoff=0.6)
        hint = f"; close matches: {', '.join(close)}" if close else "; `timm.list_models('vit_*')` lists its ViTs"
        raise WeightsError(f"--backbone {name}: timm {timm.__version__} does not know the model {model_name!r}{hint}")
    with torch.device("meta"):
        model = timm.create_model(model_name, pretrained=False, num_classes=0)
    if not isinstance(model, VisionTransformer) or not hasattr(model, "blocks"):
        raise WeightsError(
            f"--backbone {name}: a {type(model).__name__}, not a Vision Transformer with `blocks`; "
            "pathtwt compresses and pools plain ViTs only (give a registry name or a timm ViT)"
        )
    if not getattr(model, "has_class_token", model.cls_token is not None):
        raise WeightsError(f"--backbone {name}: this ViT has no class token; pathtwt's embeddings pool the CLS token")
    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    input_size = int(cfg.get("input_size", (3, 224, 224))[-1])
    patch = model.patch_embed.patch_size
    patch = int(patch[0] if isinstance(patch, (tuple, list)) else patch)
    prefix = int(model.num_prefix_tokens)
    return BackboneSpec(
        name=name,
        timm_name=model_name,
        # the name's own defaults, at its default input size, without a head
        timm_kwargs={"img_size": input_size, "patch_size": patch, "num_classes": 0},
        input_size=input_size,
        mean=tuple(float(v) for v in cfg.get("mean", (0.485, 0.456, 0.406))),
        std=tuple(float(v) for v in cfg.get("std", (0.229, 0.224, 0.225))),
        # read from the model: the name's defaults, which the kwargs leave to timm
        timm_defaults={"embed_dim": int(model.embed_dim), "depth": len(model.blocks), "reg_tokens": prefix - 1},
        mlp="swiglu-packed" if type(model.blocks[0].mlp).__name__ in ("GluMlp", "SwiGLUPacked") else "gelu",
        embedding_recipe="cls",
        card=f"timm model {model_name}",
    )
