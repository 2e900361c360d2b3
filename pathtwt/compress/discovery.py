"""Discovery, the one route `pathtwt discover` and `pathtwt compress` share: the teacher's
layer-similarity matrix on the fit tiles, its exact partition (exactly ``depth`` blocks,
or the fewest with discrepancy <= ``eps``), the eps sweep and the merge plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from pathtwt.compress.partition import Partition

if TYPE_CHECKING:
    from pathtwt.compress.calibration import CalibrationSet
    from pathtwt.models.registry import Backbone


@dataclass
class Discovery:
    similarity: np.ndarray  # S[a, b], (L, L)
    partition: Partition
    eps_grid: np.ndarray
    sweep: list[int]  # blocks at each eps of the grid
    depth: int | None
    eps: float | None
    tokens: str

    def plan(self) -> dict[str, Any]:
        """The merge plan (``plan.json``'s keys, provenance aside)."""
        return {"eps": self.eps, "depth": self.depth, "num_layers": int(self.similarity.shape[0]),
                **self.partition.to_dict(), "tokens": self.tokens,
                "eps_sweep": [[float(e), int(n)] for e, n in zip(self.eps_grid, self.sweep)]}


def discover(teacher: "Backbone", calib: "CalibrationSet", *, depth: int | None = None, eps: float | None = None,
             tokens: str = "all", batch_size: int, device: Any,
             progress: Callable[[int], Any] | None = None) -> Discovery:
    """S on the fit tiles (from the teacher's shared layer outputs when they hold the whole
    fit split: one pass serves every job of this teacher and calibration file), then the
    partition for ``depth`` or ``eps`` (exactly one of them) and the eps sweep."""
    from pathtwt.compress.partition import default_eps_grid, eps_sweep, partition_exact_k, partition_min_blocks
    from pathtwt.compress.similarity import similarity_from_outputs, similarity_matrix
    from pathtwt.compress.teacher_cache import whole_fit_outputs

    if (depth is None) == (eps is None):
        raise ValueError("discover: give exactly one of depth and eps")
    kw = dict(num_prefix_tokens=teacher.spec.num_prefix_tokens, tokens=tokens, batch_size=batch_size)
    outputs = whole_fit_outputs(teacher, calib)
    if outputs is not None:
        S = similarity_from_outputs(outputs[1:], **kw)
    else:
        S = similarity_matrix(teacher.model, teacher.transform, calib.fit, device=device, progress=progress, **kw)
    part = partition_exact_k(S, depth) if depth is not None else partition_min_blocks(S, eps)
    grid = default_eps_grid(S)
    return Discovery(S, part, grid, eps_sweep(S, grid), depth, eps, tokens)
