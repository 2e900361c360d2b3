"""Backbone registry and loaders.

Per-model facts (timm architecture and keyword arguments, input size, normalisation,
token layout, hub id, default precision) are data in
:data:`pathtwt.models.encoders.BACKBONES`;
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

from pathtwt.devices import check_device_name, use_device
from pathtwt.errors import WeightsError
from pathtwt.models.encoders import BACKBONES
from pathtwt.models.recipes import DEFAULT_RECIPE
from pathtwt.models.spec import BackboneSpec
from pathtwt.models.weights import load_state_dict_file, resolve_weights_path, state_dict_to_timm

VARIANT_FORMAT = "pathtwt-backbone/1"

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
    # model.json's top-level copies stand in for what the kwargs leave to the timm name's defaults
    registers = int(meta.get("num_register_tokens", int(meta["num_prefix_tokens"]) - 1))
    return BackboneSpec(
        name=str(meta["name"]),
        timm_name=str(meta["timm_name"]),
        timm_kwargs=kwargs,
        input_size=int(meta["input_size"]),
        mean=tuple(float(v) for v in meta["mean"]),
        std=tuple(float(v) for v in meta["std"]),
        timm_defaults={"embed_dim": int(meta["embed_dim"]), "depth": 12 if depth is None else depth,
                       "reg_tokens": registers},
        default_precision=meta.get("default_precision", base.default_precision if base else "fp32"),
        pathology=bool(meta.get("pathology", base.pathology if base else True)),
        default_weights=str(folder / "model.safetensors"),
        base_backbone=meta.get("base_backbone"),
        layer_patches=dict(meta.get("layer_patches") or {}),
        variant_dir=str(folder),
        mlp=base.mlp if base else "gelu",
        embedding_recipe=base.embedding_recipe if base else DEFAULT_RECIPE,
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

    def embed_tiles(self, x, recipe: str = DEFAULT_RECIPE):
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
    ``device``: the process's device as :func:`pathtwt.devices.use_device` decided it (the
    commands pass theirs); ``"auto"`` asks it here, for library callers. Parameters are
    frozen (eval mode).
    ``mean``/``std`` replace the spec's normalisation (``--mean/--std``, for ``timm:NAME``
    models trained with another one). ``precision``: ``--precision`` as
    :func:`pathtwt.models.precision.resolve_precision` reads it for inference; the weights'
    dtype goes to ``Backbone.precision`` and ``auto``'s bf16 autocast to ``bf16_autocast``.
    """
    import torch

    # taken as decided: resolving again here would claim or check a GPU a second time
    device = use_device("auto") if str(device) == "auto" else check_device_name(str(device))

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
        key = (spec.embed_dim, spec.depth, spec.patch_size, spec.num_register_tokens)
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
