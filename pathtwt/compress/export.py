"""Export a compressed backbone as a variant folder: ``model.safetensors`` + ``model.json``.

The weights are the state dict of a plain timm ``VisionTransformer`` built from the
teacher's timm name and keyword arguments with ``depth`` set to the student's depth, so

    model = timm.create_model(meta["timm_name"], pretrained=False, **meta["timm_kwargs"])
    model.load_state_dict(safetensors.torch.load_file(DIR / "model.safetensors"), strict=True)

rebuilds it with timm alone; ``pathtwt.models.registry.create_backbone(DIR)`` reads the same
two files. Methods whose student is not a plain ViT describe the difference in
``layer_patches`` (TWT and truncation export none). Both files are written atomically and
``model.json`` last, so a folder with a ``model.json`` is always complete.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from torch import nn

from pathtwt.errors import PathtwtError
from pathtwt.devices import device_provenance
from pathtwt.io.atomic import atomic_output, sha256_file, write_json_atomic

if TYPE_CHECKING:
    from pathtwt.models.registry import Backbone

def _versions() -> dict[str, str]:
    import timm
    import torch

    from pathtwt import __version__

    return {"pathtwt": __version__, "torch": torch.__version__, "timm": timm.__version__, "python": platform.python_version()}


def calibration_hashes(sources: list[str]) -> dict[str, str]:
    """sha256 of every calibration source that is a single file (calib.h5, coords, image)."""
    return {str(s): sha256_file(s) for s in sources if os.path.isfile(s)}


def cost(model: nn.Module, input_size: int) -> dict[str, int]:
    from pathtwt.models.flops import count_macs, count_params

    return {"params": int(count_params(model)), "macs_per_tile": int(count_macs(model, input_size=input_size))}


@contextlib.contextmanager
def _removed_unless_completed(path: Path) -> Iterator[None]:
    try:
        yield
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def export_backbone(
    out: str | os.PathLike,
    model: nn.Module,
    *,
    teacher: "Backbone",
    method: str,
    extra: dict[str, Any] | None = None,
    name: str | None = None,
    params: int | None = None,
    layer_patches: dict[str, Any] | None = None,
    calibration_sources: list[str] | None = None,
    options: dict[str, Any] | None = None,
) -> Path:
    """Write ``out/model.safetensors`` and ``out/model.json`` for ``model`` (a plain timm ViT
    of the teacher's family); ``teacher`` is the ``pathtwt.models.registry.Backbone`` compressed.
    ``extra`` holds the method's own keys (plan, audition, fidelity, ...); ``name`` (default
    ``<backbone>/<method>-<depth>``) and ``params`` (default: counted on ``model``) are for
    variants whose depth or tensor count is not what names or sizes them."""
    from safetensors.torch import save_file

    from pathtwt.models.registry import build_timm_model, variant_metadata
    from pathtwt.models.hub_format import write_hub_format
    from pathtwt.models.layer_patches import apply_layer_patches

    spec = teacher.spec
    depth = len(model.blocks)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    # The promise of the format: the weights load strictly into the model the metadata describes.
    check = build_timm_model(spec, depth=depth)
    if layer_patches:
        apply_layer_patches(check, layer_patches)
    try:
        check.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise PathtwtError(f"{method}: student does not match {spec.timm_name} at depth {depth} ({str(exc).splitlines()[0]})") from exc
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # model.json, written last, completes the folder: one left from before would describe
    # weights being replaced, and weights left without theirs (an error or a stop before it
    # is written) would look finished to whoever lists the folder
    (out / "model.json").unlink(missing_ok=True)
    with _removed_unless_completed(out / "model.safetensors"):
        with atomic_output(out / "model.safetensors") as tmp:
            save_file(state, str(tmp), metadata={"format": "pt"})
        meta = variant_metadata(spec, depth)
        base = meta["base_backbone"]
        teacher_sha = teacher.weights_sha256
        own = {
            "name": name or f"{base}/{method}-{depth}",
            "method": method,
            **cost(model, spec.input_size),
            "weights_sha256": sha256_file(out / "model.safetensors"),
            "teacher_weights_sha256": teacher_sha,
            "layer_patches": dict(layer_patches or {}),
        }
        if params is not None:
            own["params"] = int(params)
        # "depth" too: model.json records it once, in timm_kwargs (pathtwt.models.registry.variant_depth)
        clash = sorted(set(extra or {}) & (set(meta) | set(own) | {"provenance", "depth"}))
        if clash:
            raise ValueError(f"{method}: extra keys {clash} would overwrite the variant's own model.json entries")
        meta.update({**own, **(extra or {})})
        meta["provenance"] = {
            "teacher": spec.name,
            "teacher_source": str(teacher.source),
            "teacher_weights_sha256": teacher_sha,
            "calibration_sha256": calibration_hashes(calibration_sources or []),
            "options": options or {},
            "versions": _versions(),
            "device": device_provenance(teacher.device),
        }
        write_hub_format(out, meta)  # timm's config.json + README.md model card, before the model.json that completes the folder
        write_json_atomic(out / "model.json", meta)
        return out
