"""What a frozen teacher computes on one calibration set, kept on disk beside the
calibration file, so that every compress job of the same teacher and tiles (the
workflow's variants of a backbone, a rerun after a failure) computes it once.

The values kept are those that depend on nothing but the teacher and the tiles: every
layer's output on the first fit tiles (:func:`fit_layer_outputs`: auditioning's teacher
states, and the fit means and similarity matrix when the fit split is no larger) and on
the held-out tiles (:func:`held_out_outputs`: auditioning's ranking states, the teacher's
side of the reported fidelity), the
teacher's fit means (:func:`pathtwt.compress.fidelity.fit_centre`) and the reference rows
(teacher, constant, random-init architecture) on the report tiles
(:func:`pathtwt.compress.fidelity.references`). A student's own numbers are never cached.

An entry's key is a hash of everything its value depends on: the teacher (weights
SHA-256 or random-init seed, architecture, normalisation, input size, its float32
precision, the device type and whether its fp32 matrix multiplies run in TF32), the
exact tiles (a hash of their pixels, so a calibration file redrawn or subsampled
differently never matches), the batch size (it moves float rounding), the torch version
and the entry's own arguments. A key that does not match is
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
    import torch

    from pathtwt.compress.calibration import CalibrationSet
    from pathtwt.models.registry import Backbone

CACHE_FORMAT = "pathtwt-teacher-cache/1"
DISABLE_ENV = "PATHTWT_TEACHER_CACHE"  # "off": compute everything in the job, write nothing
SUFFIX = ".teacher-cache"  # results/calibration/B.h5 -> results/calibration/B.teacher-cache/

log = logging.getLogger(__name__)
T = TypeVar("T")


def tiles_digest(calib: "CalibrationSet") -> str:
    """SHA-256 of the set's tiles (each split's name, shape, dtype and pixels), computed
    once per set: about 0.1 s for 1024 tiles of 224 x 224."""
    if calib.derived.tiles_digest is None:
        h = hashlib.sha256()
        for name, tiles in (("fit", calib.fit), ("select", calib.select), ("report", calib.report)):
            part = np.ascontiguousarray(tiles)
            h.update(f"{name}:{part.shape}:{part.dtype};".encode())
            h.update(memoryview(part).cast("B"))
        calib.derived.tiles_digest = h.hexdigest()
    return calib.derived.tiles_digest


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
    """What makes two teachers compute the same values (the model's own float32 copy), the
    precision of fp32 matrix multiplies included: TF32 on a GPU that has it (about 1e-3
    relative) is not full fp32 (CPUs, ROCm, V100, an ``ieee`` run)."""
    import torch

    from pathtwt.models.precision import fp32_matmul_in_effect

    spec = teacher.spec
    return {"weights": teacher.weights_sha256 or teacher.source, "backbone": spec.name, "timm_name": spec.timm_name,
            "timm_kwargs": {k: str(v) for k, v in sorted(spec.timm_kwargs.items())}, "input_size": spec.input_size,
            "mean": list(spec.mean), "std": list(spec.std), "layer_patches": json.dumps(spec.layer_patches, sort_keys=True),
            "dtype": str(next(teacher.model.parameters()).dtype), "device": str(teacher.device).split(":")[0],
            "fp32_matmul": fp32_matmul_in_effect(teacher.device), "torch": torch.__version__}


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
                # mapped, not read: a job pages in only the layers it uses (auditioning and
                # the targets of a 6-block plan read 7 of 13), 0.1 s instead of 0.6-1.6 s for
                # the demo's 575 MB of fit outputs
                value = torch.load(path, weights_only=True, mmap=True)
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
        base = {"teacher": teacher_identity(teacher), "tiles": tiles_digest(calib) if directory is not None else None}
        store[key] = TeacherCache(directory, base)
    return store[key]


# the first fit tiles whose layer outputs are shared: auditioning's fit tiles
FIT_OUTPUTS_TILES = 128
# the batch of the one shared pass, whatever its consumers' own batch sizes (discovery's,
# the compress job's), so that every consumer reads the same entry; a batch size moves
# only float rounding (about 1e-6 relative), which no choice depends on
FIT_OUTPUTS_BATCH = 16
# the layer outputs of at most this many bytes are kept (ViT-S on 128 tiles: 0.6 GB;
# H0-mini: 1.3 GB); a larger teacher makes each consumer run its own pass as before
FIT_OUTPUTS_LIMIT = 2 * 2**30


def _outputs_fit_limit(teacher: "Backbone", n: int) -> bool:
    """Whether every layer's output of ``n`` tiles stays within :data:`FIT_OUTPUTS_LIMIT`."""
    model, spec = teacher.model, teacher.spec
    side = spec.input_size // int(model.patch_embed.patch_size[0])
    tokens = side * side + spec.num_prefix_tokens
    return 0 < n and (len(model.blocks) + 1) * n * tokens * int(model.embed_dim) * 4 <= FIT_OUTPUTS_LIMIT


def _layer_outputs(teacher: "Backbone", tiles: np.ndarray) -> "list[torch.Tensor]":
    """``[h_0, ..., h_L]`` of ``tiles``, each (n, T, D) float32 on CPU, from one fp32 pass in
    batches of :data:`FIT_OUTPUTS_BATCH`."""
    import torch

    from pathtwt.compress.intermediates import tiles_to_batch
    from pathtwt.compress.student import block_outputs

    teacher.model.eval()
    parts: list[list[torch.Tensor]] = []
    with torch.no_grad():
        for i in range(0, len(tiles), FIT_OUTPUTS_BATCH):
            x = tiles_to_batch(teacher.transform, tiles[i : i + FIT_OUTPUTS_BATCH], teacher.device)
            parts.append([o.float().cpu() for o in block_outputs(teacher.model, x)])
    return [torch.cat(col) for col in zip(*parts)]


def fit_layer_outputs(teacher: "Backbone", calib: "CalibrationSet", *, n_tiles: int) -> "list[torch.Tensor] | None":
    """``[h_0, ..., h_L]``, each (n, T, D) float32 on CPU, of the first ``n`` =
    min(``n_tiles``, fit) fit tiles, from one fp32 pass in batches of
    :data:`FIT_OUTPUTS_BATCH`; kept in the process and in the teacher cache. None when they
    would exceed :data:`FIT_OUTPUTS_LIMIT`."""
    n = min(int(n_tiles), len(calib.fit))
    if not _outputs_fit_limit(teacher, n):
        return None
    kept = kept_fit_outputs(teacher, calib)
    if kept is not None and len(kept[0]) >= n:
        return [o[:n] for o in kept] if len(kept[0]) > n else kept
    store, key = calib.derived.fit_outputs, (id(teacher.model), n)
    store[key] = teacher_cache(teacher, calib).get("fit-outputs", lambda: _layer_outputs(teacher, calib.fit[:n]),
                                                   n_tiles=n, batch_size=FIT_OUTPUTS_BATCH)
    return store[key]


def held_out_outputs(teacher: "Backbone", calib: "CalibrationSet", split: str,
                     n_tiles: int | None = None) -> "list[torch.Tensor] | None":
    """``[h_0, ..., h_L]`` of the first ``n_tiles`` (all: None) tiles of a held-out split, as
    :func:`fit_layer_outputs` computes and keeps them. ``split`` "report"
    (:meth:`CalibrationSet.reported_tiles`): the teacher's side of every fidelity number a
    job reports (the student before and after training, the three reference rows), which
    otherwise each ran the teacher again on the same tiles; "select"
    (:meth:`CalibrationSet.choosing_tiles`): the states auditioning ranks its candidates
    on. None when they would exceed :data:`FIT_OUTPUTS_LIMIT` (the consumer then runs the
    teacher itself)."""
    if split not in ("report", "select"):
        raise ValueError(f"split {split!r}: expected report or select")
    tiles, name = calib.reported_tiles() if split == "report" else (calib.choosing_tiles(), calib.choosing_split())
    tiles = tiles[:n_tiles]
    if not _outputs_fit_limit(teacher, len(tiles)):
        return None
    store, key = calib.derived.held_out_outputs, (id(teacher.model), split, len(tiles))
    if key not in store:
        store[key] = teacher_cache(teacher, calib).get(f"{split}-outputs", lambda: _layer_outputs(teacher, tiles),
                                                       split=name, n_tiles=len(tiles), batch_size=FIT_OUTPUTS_BATCH)
    return store[key]


def whole_fit_outputs(teacher: "Backbone", calib: "CalibrationSet") -> "list[torch.Tensor] | None":
    """:func:`fit_layer_outputs` of every fit tile, for a consumer that reads the whole fit
    split (the fit means, the similarity matrix); None when the split is larger than the
    shared :data:`FIT_OUTPUTS_TILES` (the consumer then runs its own pass)."""
    if len(calib.fit) > FIT_OUTPUTS_TILES:
        return None
    return fit_layer_outputs(teacher, calib, n_tiles=len(calib.fit))


def kept_fit_outputs(teacher: "Backbone", calib: "CalibrationSet") -> "list[torch.Tensor] | None":
    """The layer outputs :func:`fit_layer_outputs` already holds in this process for
    ``teacher`` (the most tiles), else None: nothing is computed."""
    kept = [(n, v) for (model, n), v in calib.derived.fit_outputs.items() if model == id(teacher.model)]
    return max(kept, key=lambda nv: nv[0])[1] if kept else None
