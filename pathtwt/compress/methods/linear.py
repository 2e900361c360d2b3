"""Linear surrogates (TOAST / ReplaceMe style): each discovered block of several layers is
replaced by one closed-form least-squares affine map from the block's input tokens
h_{s-1} to its output tokens h_e, fitted on every token of the fit tiles. No training.

    W, b = argmin sum_tokens || h_e - (W h_{s-1} + b) ||^2 + ridge * tr(G)/D * ||W||^2

The Gram matrices are accumulated in float64 batch by batch and solved in float64; the
ridge is relative to the mean diagonal of the input Gram (scale-free; the bias is not
penalised). Targets are the teacher's own block inputs (teacher-forced), as in ReplaceMe.

A block of one layer has nothing to merge: it keeps the teacher's layer unless
``extra["linear_single_layers"]`` is set. In the export a linear block is a
:class:`~pathtwt.models.variant_layers.LinearBlock` (``layer_patches.linear_blocks``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from pathtwt.errors import NumericsError
from pathtwt.compress.intermediates import iter_layer_outputs
from pathtwt.compress.student import non_block_state
from pathtwt.compress.methods.common import export_with_fidelity
from pathtwt.models.variant_layers import apply_baseline_patches


class GramAccumulator:
    """Running float64 sums X^T X, X^T Y over tokens, X augmented with a constant 1."""

    def __init__(self, dim_in: int, dim_out: int) -> None:
        self.xtx = np.zeros((dim_in + 1, dim_in + 1))
        self.xty = np.zeros((dim_in + 1, dim_out))
        self.count = 0

    def update(self, x: torch.Tensor, y: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).double()
        y = y.reshape(-1, y.shape[-1]).double()
        xa = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype, device=x.device)], dim=1)
        self.xtx += (xa.T @ xa).cpu().numpy()
        self.xty += (xa.T @ y).cpu().numpy()
        self.count += len(x)

    def solve(self, ridge: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """(W (D_out, D_in), b (D_out,)) such that y ~ x @ W.T + b."""
        d = self.xtx.shape[0] - 1
        gram = self.xtx.copy()
        if ridge > 0:
            scale = float(np.trace(gram[:d, :d])) / d
            gram[:d, :d] += ridge * scale * np.eye(d)
        # lstsq (SVD) also copes with a rank-deficient Gram when ridge is 0
        sol = np.linalg.lstsq(gram, self.xty, rcond=None)[0]
        if not np.all(np.isfinite(sol)):
            raise NumericsError("the linear surrogate's least-squares solution is not finite; use a ridge > 0")
        return sol[:d].T.copy(), sol[d].copy()


def fit_linear_maps(
    model: torch.nn.Module,
    transform: Any,
    tiles: np.ndarray,
    blocks: Sequence[tuple[int, int]],
    *,
    ridge: float = 0.0,
    batch_size: int = 32,
    device: str = "cpu",
) -> list[tuple[np.ndarray, np.ndarray]]:
    """One (W, b) per block [s, e] (1-based inclusive), from h_{s-1} to h_e."""
    dim = model.embed_dim
    accs = [GramAccumulator(dim, dim) for _ in blocks]
    for outs in iter_layer_outputs(model, transform, tiles, batch_size=batch_size, device=device, with_input=True):
        for acc, (s, e) in zip(accs, blocks):
            acc.update(outs[s - 1], outs[e])
    return [acc.solve(ridge) for acc in accs]


def build_linear_student(teacher: Any, blocks: Sequence[tuple[int, int]],
                         maps: Sequence[tuple[np.ndarray, np.ndarray] | None]) -> tuple[torch.nn.Module, dict]:
    """The exported module (one layer per block: a linear block where ``maps[j]`` is set,
    else the teacher's layer s_j) and its ``layer_patches``."""
    from pathtwt.models.registry import build_timm_model

    linear = [j for j, m in enumerate(maps) if m is not None]
    patches = {"linear_blocks": linear} if linear else {}
    student = apply_baseline_patches(build_timm_model(teacher.spec, depth=len(blocks)), patches)
    state = non_block_state(teacher.model)
    for j, ((s, _e), m) in enumerate(zip(blocks, maps)):
        if m is None:
            layer_state = teacher.model.blocks[s - 1].state_dict()
        else:
            layer_state = {"proj.weight": torch.as_tensor(m[0], dtype=torch.float32),
                           "proj.bias": torch.as_tensor(m[1], dtype=torch.float32)}
        state.update({f"blocks.{j}.{k}": v for k, v in layer_state.items()})
    student.load_state_dict(state, strict=True)
    return student.eval(), patches


def compress(teacher: Any, calib: Any, options: Any) -> Path:
    """Registry entry (``--method linear``): fit one map per multi-layer block, export."""
    from pathtwt.compress.pipeline import resolve_plan

    plan = resolve_plan(teacher, calib, options)
    blocks = [(int(s), int(e)) for s, e in plan["blocks"]]
    ridge = float(options.extra.get("ridge", 1e-6))
    replace_single = bool(options.extra.get("linear_single_layers", False))
    replaced = [e > s or replace_single for s, e in blocks]
    fitted = iter(fit_linear_maps(teacher.model, teacher.transform, calib.fit, [b for b, r in zip(blocks, replaced) if r],
                                  ridge=ridge, batch_size=options.batch_size, device=options.device))
    maps = [next(fitted) if r else None for r in replaced]
    student, patches = build_linear_student(teacher, blocks, maps)
    return export_with_fidelity(
        student, teacher=teacher, calib=calib, options=options, method="linear", layer_patches=patches,
        boundaries=[e for _s, e in blocks],
        extra={"plan": plan, "linear": {"ridge": ridge, "fit_tiles": int(len(calib.fit)),
                                        "solve": "float64 least squares on the token Gram, teacher-forced block inputs"}},
    )
