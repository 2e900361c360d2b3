"""What pathtwt needs to know about a backbone, as one frozen record (the registry's entries
and the exported variants' model.json both become one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from pathtwt.models.recipes import DEFAULT_RECIPE
from pathtwt.models.recipes import embedding_dim as recipe_width


# The architecture facts pathtwt reads, by their timm keyword name. Each is stated once per
# backbone: in ``timm_kwargs`` (what timm builds the model with), or, where the timm name's
# own defaults supply it and the kwargs leave it out, in ``timm_defaults``.
ARCHITECTURE_KEYS = ("embed_dim", "depth", "reg_tokens")


@dataclass(frozen=True)
class BackboneSpec:
    """What pathtwt needs to know about a backbone, as data."""

    name: str
    timm_name: str
    timm_kwargs: Mapping[str, Any]
    input_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    hub_id: str | None = None
    default_precision: str = "fp32"
    pathology: bool = True  # selects the paper's compression defaults for pathology models
    default_weights: str | None = None  # file name looked up locally, or a variant's own file
    base_backbone: str | None = None  # for variants: the registry name they derive from
    layer_patches: Mapping[str, Any] = field(default_factory=dict)
    variant_dir: str | None = None
    mlp: str = "gelu"  # "gelu" (fc1 -> GELU -> fc2) | "swiglu-packed" (fc1 = [gate; up], SiLU)
    hub_file: str = "model.safetensors"  # the weights file of the hub repository
    embedding_recipe: str = DEFAULT_RECIPE  # the model card's tile embedding (pathtwt.models.embedding)
    licence: str | None = None  # of the published weights; compressed variants inherit it
    card: str | None = None  # where the facts above were read (model card, loader source)
    # ARCHITECTURE_KEYS that timm_name's defaults give and timm_kwargs leaves to them (a
    # model built from timm_kwargs alone must stay the same model, and its variants'
    # model.json the same file); keys the kwargs hold are dropped, so they never disagree
    timm_defaults: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.timm_defaults) - set(ARCHITECTURE_KEYS))
        if unknown:
            raise ValueError(f"backbone {self.name!r}: timm_defaults {unknown} are not among {ARCHITECTURE_KEYS}")
        # frozen: the one normalisation a spec gets, so dataclasses.replace(timm_kwargs=...) stays consistent
        object.__setattr__(self, "timm_defaults",
                           {k: int(v) for k, v in self.timm_defaults.items() if k not in self.timm_kwargs})
        missing = [k for k in ("embed_dim", "depth") if k not in self.timm_kwargs and k not in self.timm_defaults]
        if missing:
            raise ValueError(f"backbone {self.name!r}: {missing} in neither timm_kwargs nor timm_defaults")

    def _architecture(self, key: str, default: int | None = None) -> int:
        value = self.timm_kwargs.get(key, self.timm_defaults.get(key, default))
        return int(value)

    @property
    def embed_dim(self) -> int:
        return self._architecture("embed_dim")

    @property
    def depth(self) -> int:
        return self._architecture("depth")

    @property
    def num_register_tokens(self) -> int:
        return self._architecture("reg_tokens", 0)  # timm's VisionTransformer default: none

    @property
    def num_prefix_tokens(self) -> int:
        """CLS + registers, in that order, before the patch tokens (every backbone has a
        class token: pathtwt's embeddings pool it)."""
        return 1 + self.num_register_tokens

    @property
    def patch_size(self) -> int:
        return int(self.timm_kwargs.get("patch_size", 14))

    @property
    def num_patch_tokens(self) -> int:
        return (self.input_size // self.patch_size) ** 2

    @property
    def embedding_dim(self) -> int:
        # concat(CLS, mean of patch tokens)
        return 2 * self.embed_dim

    @property
    def card_embedding_dim(self) -> int:
        """Width of the model card's own tile embedding (``embedding_recipe``)."""
        return recipe_width(self.embed_dim, self.embedding_recipe)
