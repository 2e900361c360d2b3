"""What pathtwt needs to know about a backbone, as one frozen record (the registry's entries
and the exported variants' model.json both become one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class BackboneSpec:
    """What pathtwt needs to know about a backbone, as data."""

    name: str
    timm_name: str
    timm_kwargs: Mapping[str, Any]
    input_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    num_prefix_tokens: int  # CLS + registers, in that order, before the patch tokens
    num_register_tokens: int
    embed_dim: int
    depth: int
    hub_id: str | None = None
    default_precision: str = "fp32"
    weights_layout: str = "timm"  # "timm" | "hf-dinov2" | "hf-dinov2-registers"
    pathology: bool = True  # selects the paper's compression defaults for pathology models
    default_weights: str | None = None  # file name looked up locally, or a variant's own file
    base_backbone: str | None = None  # for variants: the registry name they derive from
    layer_patches: Mapping[str, Any] = field(default_factory=dict)
    variant_dir: str | None = None
    mlp: str = "gelu"  # "gelu" (fc1 -> GELU -> fc2) | "swiglu-packed" (fc1 = [gate; up], SiLU)
    hub_file: str = "model.safetensors"  # the weights file of the hub repository
    embedding_recipe: str = "cls+mean"  # the model card's tile embedding (pathtwt.models.embedding)
    licence: str | None = None  # of the published weights; compressed variants inherit it
    card: str | None = None  # where the facts above were read (model card, loader source)

    @property
    def num_patch_tokens(self) -> int:
        patch = int(self.timm_kwargs.get("patch_size", 14))
        return (self.input_size // patch) ** 2

    @property
    def embedding_dim(self) -> int:
        # concat(CLS, mean of patch tokens)
        return 2 * self.embed_dim

    @property
    def card_embedding_dim(self) -> int:
        """Width of the model card's own tile embedding (``embedding_recipe``)."""
        return (2 if self.embedding_recipe == "cls+mean" else 1) * self.embed_dim
