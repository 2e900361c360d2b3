"""A variant folder in timm's hub format, beside pathtwt's own ``model.json``.

``config.json`` holds what timm's ``local-dir:`` and ``hf-hub:`` loaders read
(``architecture``, ``model_args``, ``pretrained_cfg`` with the mean, std and input size,
``num_classes`` 0), next to the ``model.safetensors`` the exporter already wrote, so::

    timm.create_model("local-dir:DIR", pretrained=True)      # or hf-hub:USER/NAME once uploaded

builds and loads the compressed model with timm alone. ``README.md`` is the model card a
hub page shows: base model, method, depth, parameters, MACs, fidelity, the calibration
cohort, the licence inherited from the base model, how to load it. Every number in it is
copied from ``model.json``.

Variants whose student is not a plain ViT (``layer_patches``: NOSE, Raptor, WDPruning)
cannot be rebuilt by timm alone; they get the card (saying so) and no ``config.json``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from pathtwt.io.atomic import write_json_atomic, write_text_atomic
from pathtwt.models.recipes import DEFAULT_RECIPE


def hub_config(meta: Mapping[str, Any]) -> dict[str, Any]:
    """timm's ``config.json`` for a variant described by ``meta`` (its model.json)."""
    size = int(meta["input_size"])
    kwargs = dict(meta["timm_kwargs"])
    kwargs["num_classes"] = 0
    return {
        "architecture": meta["timm_name"],
        "num_classes": 0,
        "num_features": int(meta["embed_dim"]),
        "global_pool": kwargs.get("global_pool", "token"),
        "model_args": kwargs,
        "pretrained_cfg": {
            "tag": str(meta.get("method", "")),
            "custom_load": False,
            "input_size": [3, size, size],
            "fixed_input_size": not bool(kwargs.get("dynamic_img_size", False)),
            # the whole tile resized to the input size, as pathtwt's TileTransform does
            "interpolation": "bilinear",
            "crop_pct": 1.0,
            "crop_mode": "center",
            "mean": [float(v) for v in meta["mean"]],
            "std": [float(v) for v in meta["std"]],
            "num_classes": 0,
            "pool_size": None,
            "first_conv": "patch_embed.proj",
            "classifier": "head",
            "license": meta.get("licence"),
        },
    }


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return "n/a" if value is None else str(value)


def card_numbers(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers the card prints, read from ``meta`` (tests compare them with model.json)."""
    from pathtwt.models.registry import variant_depth

    final = (meta.get("fidelity") or {}).get("final") or {}
    return {
        "depth": variant_depth(meta),
        "params": meta.get("params"),
        "macs_per_tile": meta.get("macs_per_tile"),
        "fidelity_r2": final.get("r2"),
        "fidelity_cosine": final.get("cosine"),
        "fidelity_cka": final.get("cka"),
        "fidelity_tiles": final.get("n_tiles"),
    }


def model_card(meta: Mapping[str, Any]) -> str:
    """The card's text: a function of ``meta`` alone (not of the folder's name or place), so
    two runs that export the same model write the same bytes."""
    from pathtwt.models.encoders import BACKBONES

    folder_name = "path/to/this/folder"
    base_name = str(meta.get("base_backbone", ""))
    base = BACKBONES.get(base_name)
    base_hub = (base.hub_id or "").removeprefix("hf-hub:") if base else ""
    licence = meta.get("licence") or (base.licence if base else None) or "other"
    numbers = card_numbers(meta)
    fidelity = meta.get("fidelity") or {}
    prov = meta.get("provenance") or {}
    calib = prov.get("calibration_sha256") or {}
    plain = not meta.get("layer_patches")
    # the hub's front matter takes a licence id ("other" for a custom one; the table spells it out)
    front = ["---", "library_name: timm" if plain else "library_name: pathtwt", f"license: {licence.split()[0]}",
             "tags: [image-feature-extraction, pathology, pathtwt]"]
    if base_hub:
        front.append(f"base_model: {base_hub}")
    front.append("---")
    rows = [
        ("base model", base_name + (f" ([{base_hub}](https://huggingface.co/{base_hub}))" if base_hub else "")),
        ("method", meta.get("method")),
        ("depth", f"{numbers['depth']} of {base.depth}" if base else numbers["depth"]),
        ("params", numbers["params"]),
        ("MACs per tile", numbers["macs_per_tile"]),
        ("input size", meta.get("input_size")),
        ("fidelity R2", _fmt(numbers["fidelity_r2"])),
        ("fidelity cosine", _fmt(numbers["fidelity_cosine"])),
        ("fidelity CKA", _fmt(numbers["fidelity_cka"])),
        ("fidelity tiles", numbers["fidelity_tiles"]),
        ("fidelity measured on", fidelity.get("on")),
        ("licence", f"{licence} (inherited from the base model)"),
    ]
    lines = [*front, "", f"# {meta.get('name', 'pathtwt variant')}", "",
             f"A compressed {base_name} tile encoder written by pathtwt `compress` ({meta.get('method')}): "
             "a plain timm Vision Transformer with fewer blocks." if plain else
             f"A compressed {base_name} tile encoder written by pathtwt `compress` ({meta.get('method')}); its "
             "blocks are modified (see `layer_patches` in model.json), so it loads with pathtwt, not timm alone.",
             "", "| | |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in rows]
    lines += ["", "## Calibration cohort", "",
              "The tiles the student was fitted and measured on (sha256 of each file):", ""]
    lines += [f"- `{os.path.basename(src)}`: {sha}" for src, sha in sorted(calib.items())] or ["- (not recorded)"]
    recipe = base.embedding_recipe if base else DEFAULT_RECIPE
    lines += ["", "## How to load", ""]
    if plain:
        lines += ["```python", "import timm", "from timm.data import create_transform, resolve_model_data_config", "",
                  f'model = timm.create_model("local-dir:{folder_name}", pretrained=True).eval()  '
                  "# or hf-hub:USER/NAME once uploaded",
                  "transform = create_transform(**resolve_model_data_config(model), is_training=False)",
                  "tokens = model.forward_features(transform(tile).unsqueeze(0))",
                  f"cls = tokens[:, 0]  # patch tokens start at index {meta.get('num_prefix_tokens')}",
                  "```", ""]
    lines += [f"With pathtwt: `pathtwt.models.registry.create_backbone(\"{folder_name}\")`, or "
              f"`pathtwt extract --backbone {folder_name}`. The base model card's embedding is `{recipe}`.", ""]
    return "\n".join(lines)


def write_hub_format(folder: str | os.PathLike, meta: Mapping[str, Any]) -> None:
    """``config.json`` (plain ViT variants) and ``README.md`` beside ``model.safetensors``."""
    folder = Path(folder)
    if not meta.get("layer_patches"):
        write_json_atomic(folder / "config.json", hub_config(meta))
    write_text_atomic(folder / "README.md", model_card(meta))
