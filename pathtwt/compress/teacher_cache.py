"""What a frozen teacher computes on one calibration set, kept on disk beside the
calibration file, so that every compress job of the same teacher and tiles (the
workflow's variants of a backbone, a rerun after a failure) computes it once.

The values kept are those that depend on nothing but the teacher and the tiles: the
teacher's fit means (:func:`pathtwt.compress.fidelity.fit_centre`) and the reference rows
(teacher, constant, random-init architecture) on the report tiles
(:func:`pathtwt.compress.fidelity.references`). A student's own numbers are never cached.

An entry's key is a hash of everything its value depends on: the teacher (weights
SHA-256 or random-init seed, architecture, normalisation, input size, its float32
precision, the device type), the exact tiles (a hash of their pixels, so a calibration
file redrawn or subsampled differently never matches), the batch size (it moves float
rounding), the torch version and the entry's own arguments. A key that does not match is
a miss, never a wrong value; an unreadable entry is recomputed and rewritten. Entries are
written atomically, so a job killed while writing leaves none half-written, and two jobs
writing the same entry write the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import numpy as np

if TYPE_CHECKING:
    from pathtwt.compress.calibration import CalibrationSet
    from pathtwt.models.registry import Backbone

CACHE_FORMAT = "pathtwt-teacher-cache/1"
DISABLE_ENV = "PATHTWT_TEACHER_CACHE"  # "off": compute everything in the job, write nothing
SUFFIX = ".teacher-cache"  # results/calibration/B.h5 -> results/calibration/B.teacher-cache/

log = logging.getLogger(__name__)
T = TypeVar("T")


def _tiles_digest(calib: "CalibrationSet") -> str:
    h = hashlib.sha256()
    for name in ("fit", "select", "report"):
        part = np.ascontiguousarray(getattr(calib, name))
        h.update(f"{name}:{part.shape}:{part.dtype};".encode())
        h.update(memoryview(part).cast("B"))
    return h.hexdigest()


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as Python numbers and lists (what a weights-only load
    reads back), tensors and plain values as they are."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def teacher_identity(teacher: "Backbone") -> dict[str, Any]:
    """What makes two teachers compute the same values (the model's own float32 copy)."""
    import torch

    spec = teacher.spec
    return {"weights": teacher.weights_sha256 or teacher.source, "backbone": spec.name, "timm_name": spec.timm_name,
            "timm_kwargs": {k: str(v) for k, v in sorted(spec.timm_kwargs.items())}, "input_size": spec.input_size,
            "mean": list(spec.mean), "std": list(spec.std), "layer_patches": json.dumps(spec.layer_patches, sort_keys=True),
            "dtype": str(next(teacher.model.parameters()).dtype), "device": str(teacher.device).split(":")[0],
            "torch": torch.__version__}


@dataclass(frozen=True)
class TeacherCache:
    """The on-disk entries of one (teacher, calibration tiles) pair; ``directory`` None
    keeps nothing (a set drawn fresh from slides has no calibration file to sit beside)."""

    directory: Path | None
    base: dict[str, Any]

    def key(self, name: str, **args: Any) -> str:
        blob = json.dumps({"format": CACHE_FORMAT, "entry": name, **self.base, "args": args}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def path(self, name: str, **args: Any) -> Path | None:
        return None if self.directory is None else self.directory / f"{name}-{self.key(name, **args)}.pt"

    def get(self, name: str, compute: Callable[[], T], **args: Any) -> T:
        """The entry ``name`` for ``args``, read from disk or computed and written."""
        import torch

        from pathtwt.io.atomic import atomic_output

        path = self.path(name, **args)
        if path is not None and path.is_file():
            try:
                value = torch.load(path, weights_only=True)
                log.info("teacher cache: %s read from %s", name, path)
                return value["value"]
            except Exception as exc:  # noqa: BLE001  (any unreadable entry is recomputed)
                log.warning("teacher cache: %s unreadable (%s); recomputing it", path, exc)
        value = _plain(compute())  # the same types whether computed or read back
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with atomic_output(path) as tmp:
                    torch.save({"format": CACHE_FORMAT, "value": value}, tmp)
            except OSError as exc:  # a read-only results tree still runs, only slower
                log.warning("teacher cache: could not write %s (%s); continuing without it", path, exc)
        return value


def cache_directory(calib: "CalibrationSet") -> Path | None:
    """``<first calibration file>.teacher-cache/`` for a set read from calibration files."""
    if os.environ.get(DISABLE_ENV, "").lower() in ("off", "0", "false", "no"):
        return None
    files = list((calib.provenance or {}).get("calibration_files", {}))
    if not files:
        return None
    first = Path(files[0])
    return first.with_name(first.stem + SUFFIX)


def teacher_cache(teacher: "Backbone", calib: "CalibrationSet") -> TeacherCache:
    """The cache of ``teacher`` on ``calib`` (one per pair and process: the tile hash is
    computed once)."""
    store, key = calib.derived.teacher_caches, id(teacher.model)
    if key not in store:
        directory = cache_directory(calib)
        base = {"teacher": teacher_identity(teacher), "tiles": _tiles_digest(calib) if directory is not None else None}
        store[key] = TeacherCache(directory, base)
    return store[key]
