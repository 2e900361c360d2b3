"""Finding and reading backbone weight files.

Order: an explicit local path, the spec's own file (variant folders) or its file name
under a local weights folder, the hub (only when reachable and ``HF_HUB_OFFLINE`` is
unset; ``PATHTWT_OFFLINE`` is an older alias), otherwise a :class:`WeightsError` saying which file to download and where to put
it. Checkpoint layouts other than timm's are converted by pure ``state_dict ->
state_dict`` functions chosen by sentinel keys.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from pathtwt.errors import WeightsError

if TYPE_CHECKING:
    from pathtwt.models.spec import BackboneSpec

WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
# Files a Hugging Face / timm hub snapshot folder may hold, in order of preference.
SNAPSHOT_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin", "pytorch_model.pth")
# Wrappers some training scripts put around the weights.
_WRAPPER_KEYS = ("state_dict", "model", "teacher", "model_state_dict")


def local_weights_dirs() -> list[Path]:
    """Folders searched for a spec's ``default_weights`` file name."""
    dirs = []
    if os.environ.get("PATHTWT_WEIGHTS_DIR"):
        dirs.append(Path(os.environ["PATHTWT_WEIGHTS_DIR"]))
    dirs.append(Path("weights"))
    return dirs


def resolve_weights_path(spec: "BackboneSpec", weights: str | os.PathLike | None) -> Path:
    if weights is not None:
        path = Path(weights)
        if not path.exists():
            raise WeightsError(f"weights file {path} does not exist; {_download_hint(spec)}")
        return path
    if spec.variant_dir is not None:
        path = Path(spec.default_weights or "")
        if not path.is_file():
            raise WeightsError(f"{path}: variant weights missing; re-run `pathtwt compress` for {spec.name}")
        return path
    if spec.default_weights:
        for folder in local_weights_dirs():
            candidate = folder / spec.default_weights
            if candidate.exists():
                return candidate
    if spec.hub_id and not hub_offline():
        return _download_from_hub(spec)
    raise WeightsError(f"no weights for backbone {spec.name!r}; {_download_hint(spec)}")


def hub_offline() -> bool:
    """True when the Hugging Face hub must not be asked: ``HF_HUB_OFFLINE`` (the hub's own
    switch, which huggingface_hub also obeys) or ``PATHTWT_OFFLINE`` set to a true value."""
    return any(
        os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on")
        for var in ("HF_HUB_OFFLINE", "PATHTWT_OFFLINE")
    )


def _download_hint(spec: "BackboneSpec") -> str:
    where = f"put it at weights/{spec.default_weights} (or $PATHTWT_WEIGHTS_DIR)" if spec.default_weights else ""
    if spec.hub_id:
        repo = spec.hub_id.removeprefix("hf-hub:")
        what = f"download {spec.hub_file} from https://huggingface.co/{repo} (accept its terms there if it is gated)"
        return f"{what} and pass --weights PATH" + (f" or {where}" if where else "")
    if spec.default_weights:
        return f"pass --weights PATH to {spec.default_weights} or {where}"
    return "pass --weights PATH (this backbone has no published weights; use pretrained=False for random weights)"


def _download_from_hub(spec: "BackboneSpec") -> Path:
    repo = (spec.hub_id or "").removeprefix("hf-hub:")
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id=repo, filename=spec.hub_file))
    except Exception as exc:  # noqa: BLE001 - any hub/network failure becomes one actionable line
        raise WeightsError(
            f"cannot fetch {spec.hub_id} ({type(exc).__name__}); {_download_hint(spec)}"
        ) from None


def snapshot_weights_file(folder: Path) -> Path:
    for name in SNAPSHOT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise WeightsError(f"{folder}: no weights file in this folder (looked for {', '.join(SNAPSHOT_FILES)})")


def load_state_dict_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a weights file or snapshot folder into a flat ``{name: tensor}`` dict."""
    path = Path(path)
    if path.is_dir():
        path = snapshot_weights_file(path)
    if path.suffix not in WEIGHT_SUFFIXES:
        raise WeightsError(f"{path}: unsupported weights file type; use one of {', '.join(WEIGHT_SUFFIXES)}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state: Any = load_file(str(path), device="cpu")
        else:
            import torch

            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - corrupt or foreign files: say which file
        raise WeightsError(f"{path}: cannot read weights ({type(exc).__name__}: {exc})".splitlines()[0]) from None
    for key in _WRAPPER_KEYS:
        if isinstance(state, Mapping) and key in state and isinstance(state[key], Mapping):
            state = state[key]
    if not isinstance(state, Mapping):
        raise WeightsError(f"{path}: does not hold a state dict")
    return {_strip_prefix(k): v for k, v in state.items()}


def _strip_prefix(key: str) -> str:
    # DistributedDataParallel and torch.compile wrap names; the weights are the same.
    for prefix in ("module.", "_orig_mod."):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key


def state_dict_to_timm(state: Mapping[str, Any], model: Any) -> dict[str, Any]:
    """Convert a checkpoint to ``model``'s timm layout, chosen by sentinel keys."""
    from pathtwt.models.hf_dinov2 import is_hf_dinov2_layout, hf_dinov2_to_timm

    if is_hf_dinov2_layout(state):
        grid = tuple(int(g) for g in model.patch_embed.grid_size)
        return hf_dinov2_to_timm(state, grid=grid, no_embed_class=bool(getattr(model, "no_embed_class", False)))
    return dict(state)


def local_weights_path(spec: "BackboneSpec", weights: str | os.PathLike | None) -> Path | None:
    """The local weights file (or snapshot folder) a backbone would load, found without the
    network: ``weights`` when given and present, a variant's own file, or the spec's file
    under a local weights folder; None when it would come from the hub (or is missing)."""
    if weights is not None:
        return Path(weights) if Path(weights).exists() else None
    if spec.variant_dir is not None:
        return Path(spec.default_weights or "") if Path(spec.default_weights or "").is_file() else None
    for folder in local_weights_dirs() if spec.default_weights else ():
        if (folder / spec.default_weights).exists():
            return folder / spec.default_weights
    return None


class WeightsHashes:
    """The sha256 of weights files, kept by path and file identity in one JSON file
    (:class:`~pathtwt.io.identity_cache.IdentityCache`), so a plan does not read 1-4 GB of
    weights each time; a file replaced in place is hashed again, and :attr:`replaced` says
    which path's hash changed from what it was (path -> old sha256). The hash is that of
    the file a snapshot folder loads (:func:`snapshot_weights_file`), as the features files'
    ``weights_sha256`` records it."""

    def __init__(self, file: str | os.PathLike | None):
        from pathtwt.io.identity_cache import IdentityCache

        self._kept = IdentityCache(file)
        self.replaced: dict[str, str] = {}

    def sha256(self, path: str | os.PathLike) -> str:
        from pathtwt.io.atomic import sha256_file
        from pathtwt.io.identity_cache import file_identity

        path = Path(os.path.abspath(path))
        target = snapshot_weights_file(path) if path.is_dir() else path
        identity = file_identity(target)
        digest = self._kept.value(str(target), identity)
        if digest is not None:
            return str(digest)
        digest = sha256_file(target)
        before = self._kept.previous(str(target))
        if before is not None and before != digest:
            self.replaced[str(target)] = str(before)
        self._kept.put(str(target), identity, digest)
        self._kept.save()
        return digest
