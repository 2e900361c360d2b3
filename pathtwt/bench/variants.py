"""The backbones and variants ``pathtwt bench`` measures, by name: a registry backbone and
the variants a study config names (``variants:``) or ``uncompressed`` / ``METHOD-K``.

Throughput does not depend on the weights, so a variant costs what its architecture costs:
a K-layer student of twt, truncation, wdpruning, subset or linear is the plain timm ViT of
the teacher's architecture at depth K (as an exported student is); a raptor student runs
its shared layers as often as the teacher runs its own (the teacher's cost)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pathtwt.compress.registry import METHODS
from pathtwt.errors import ConfigError

# methods whose K-layer variant is a plain K-layer ViT, and those that cost the teacher's
# layers at every depth (the registry's `cost`)
DEPTH_METHODS = tuple(name for name, m in METHODS.items() if m.cost == "depth")
SHARED_LAYER_METHODS = tuple(name for name, m in METHODS.items() if m.cost == "teacher")
# the reference variants, which run the teacher's architecture
TEACHER_COST = ("uncompressed", "random-init")


@dataclass(frozen=True)
class Variant:
    """A variant by name, and the depth of the plain ViT that costs what it costs
    (None: the teacher's)."""

    name: str
    depth: int | None

    @property
    def is_teacher(self) -> bool:
        return self.depth is None


def check_backbone(name: str) -> str:
    """``name`` if it is a registry backbone (or a timm:NAME / variant folder the registry
    reads), else one line naming the backbones that exist."""
    from pathtwt.models.registry import BACKBONES, get_spec, known_backbones

    if name in BACKBONES:
        return name
    try:
        get_spec(name)
    except Exception:  # noqa: BLE001 - any failure to name a backbone is the same one line
        raise ConfigError(f"unknown backbone {name!r}; backbones: {known_backbones()}") from None
    return name


def variant_names(teacher_depth: int, config_variants: dict[str, Any] | None = None) -> str:
    """The variant names that exist, in words."""
    named = f"{', '.join(config_variants)}, " if config_variants else ""
    return (f"{named}uncompressed, or METHOD-K with METHOD one of {', '.join(DEPTH_METHODS + SHARED_LAYER_METHODS)} "
            f"and K from 1 to {teacher_depth}")


def parse_variant(name: str, teacher_depth: int, config_variants: dict[str, Any] | None = None) -> Variant:
    """The variant ``name``: an entry of the config's ``variants:`` ({method, depth}), or
    ``uncompressed`` / ``METHOD-K``; anything else is one line naming those that exist."""
    entry = (config_variants or {}).get(name)
    if entry is not None:
        method, depth = str(entry.get("method", "none")), entry.get("depth")
    elif name in TEACHER_COST:
        method, depth = "none", None
    else:
        method, _, k = name.rpartition("-")
        depth = int(k) if k.isdigit() else None
        if method not in DEPTH_METHODS + SHARED_LAYER_METHODS or depth is None:
            raise ConfigError(f"unknown variant {name!r}; variants: {variant_names(teacher_depth, config_variants)}")
    if method in ("none", "random-init") or method in SHARED_LAYER_METHODS:
        return Variant(name, None)
    if method not in DEPTH_METHODS or depth is None:
        raise ConfigError(f"variant {name!r} (method {method}): its cost is not a plain ViT's; "
                          f"variants: {variant_names(teacher_depth, config_variants)}")
    if not 1 <= int(depth) <= teacher_depth:
        raise ConfigError(f"variant {name!r}: depth {depth} is not within 1 and the teacher's {teacher_depth}")
    return Variant(name, None if int(depth) == teacher_depth else int(depth))


def from_config(path: str | Path) -> tuple[dict[str, list[str] | None], dict[str, Any]]:
    """The backbones a study config names, each with the variants it lists (None: every
    variant of ``variants:``), and its variants (name -> {method, depth, ...})."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config ({exc.strerror or exc})") from None
    variants = {str(k): dict(v or {}) for k, v in (data.get("variants") or {}).items()}
    backbones = {str(k): (list(v["variants"]) if isinstance(v, dict) and v.get("variants") else None)
                 for k, v in (data.get("backbones") or {}).items()}
    if not backbones:
        raise ConfigError(f"{path}: names no backbones (a backbones: mapping)")
    return backbones, variants
