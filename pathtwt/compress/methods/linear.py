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

``--option fold=true`` (ReplaceMe): a multi-layer block [s, e] whose preceding block is the
teacher's single layer s - 1 gets no layer of its own. Its affine map T is fitted on the
output of layer s - 1's MLP branch, m = ls2(mlp(norm2(u))) with u the tokens after that
layer's attention branch, to the rest of the residual stream,

    h_e - u ~ T m + c,

and then merged into that MLP's output projection, fc2' = T diag(ls2) fc2 (weight),
T (ls2 * b2) + c (bias), ls2 = 1: zero extra parameters, a plain timm layer. Blocks that
cannot fold (the first block, or one after another linear block) stay linear blocks. The
unfolded model (layer s - 1 with T applied after its MLP branch) is measured before the
fold and the folded one after; both fidelities are recorded and agree to float rounding.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from pathtwt.compress.method_options import method_option
from pathtwt.errors import NumericsError
from pathtwt.compress.intermediates import iter_layer_outputs
from pathtwt.compress.side_passes import named_out_of_memory
from pathtwt.compress.student import non_block_state
from pathtwt.compress.pipeline import CompressOptions, export_variant, report_fidelity, resolve_plan
from pathtwt.models.variant_layers import apply_baseline_patches

if TYPE_CHECKING:
    from pathtwt.compress.calibration import CalibrationSet
    from pathtwt.models.registry import Backbone


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
    with named_out_of_memory("the linear maps' fit", batch_size):
        for outs in iter_layer_outputs(model, transform, tiles, batch_size=batch_size, device=device, with_input=True):
            for acc, (s, e) in zip(accs, blocks):
                acc.update(outs[s - 1], outs[e])
    return [acc.solve(ridge) for acc in accs]


@torch.no_grad()
def mlp_branch_split(block: torch.nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(u, m) of a timm block on input h: u after its attention branch, m its MLP branch
    output, so that block(h) = u + m."""
    u = h + block.drop_path1(block.ls1(block.attn(block.norm1(h))))
    return u, block.drop_path2(block.ls2(block.mlp(block.norm2(u))))


def fit_mlp_output_maps(model: torch.nn.Module, transform: Any, tiles: np.ndarray, blocks: Sequence[tuple[int, int]], *,
                        ridge: float = 0.0, batch_size: int = 32, device: str = "cpu") -> list[tuple[np.ndarray, np.ndarray]]:
    """One ReplaceMe map (T, c) per block [s, e] (s >= 2): h_e - u ~ T m + c, where u and m
    split layer s - 1's output into its attention-side residual and its MLP branch."""
    dim = model.embed_dim
    accs = [GramAccumulator(dim, dim) for _ in blocks]
    with named_out_of_memory("the linear maps' fit", batch_size):
        for outs in iter_layer_outputs(model, transform, tiles, batch_size=batch_size, device=device, with_input=True):
            for acc, (s, e) in zip(accs, blocks):
                u, m = mlp_branch_split(model.blocks[s - 2], outs[s - 2])
                acc.update(m, outs[e] - u)
    return [acc.solve(ridge) for acc in accs]


class MappedMlpBlock(torch.nn.Module):
    """Unfolded form: a timm block whose MLP branch output goes through the affine map
    (T, c) before the residual addition."""

    def __init__(self, block: torch.nn.Module, weight: np.ndarray, bias: np.ndarray) -> None:
        super().__init__()
        self.block = block
        self.map = torch.nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            self.map.weight.copy_(torch.as_tensor(weight))
            self.map.bias.copy_(torch.as_tensor(bias))

    def forward(self, x: torch.Tensor, attn_mask: Any = None, is_causal: bool = False) -> torch.Tensor:
        u, m = mlp_branch_split(self.block, x)
        return u + self.map(m)


@torch.no_grad()
def fold_into_mlp_output(block: torch.nn.Module, weight: np.ndarray, bias: np.ndarray) -> torch.nn.Module:
    """Merge the affine map (T, c) into ``block``'s MLP output projection (in place, in
    float64, then cast): fc2' = T diag(g) fc2, b2' = T (g * b2) + c, then g = 1, where g
    is the LayerScale of the MLP branch (1 without one)."""
    fc2 = block.mlp.fc2
    ls2 = block.ls2
    gamma = ls2.gamma.double() if hasattr(ls2, "gamma") else torch.ones(fc2.out_features, dtype=torch.float64)
    t = torch.as_tensor(weight, dtype=torch.float64, device=fc2.weight.device)
    c = torch.as_tensor(bias, dtype=torch.float64, device=fc2.weight.device)
    gamma = gamma.to(t.device)
    new_w = t @ (gamma[:, None] * fc2.weight.double())
    new_b = t @ (gamma * (fc2.bias.double() if fc2.bias is not None else 0)) + c
    fc2.weight.copy_(new_w.to(fc2.weight.dtype))
    if fc2.bias is None:
        raise ValueError("fold needs an MLP output projection with a bias")
    fc2.bias.copy_(new_b.to(fc2.bias.dtype))
    if hasattr(ls2, "gamma"):
        ls2.gamma.fill_(1.0)
    return block


def foldable(blocks: Sequence[tuple[int, int]], replaced: Sequence[bool]) -> list[bool]:
    """Which multi-layer blocks fold: those right after a block that is the teacher's single,
    kept layer s - 1."""
    return [j > 0 and e > s and blocks[j - 1][0] == blocks[j - 1][1] and not replaced[j - 1]
            for j, (s, e) in enumerate(blocks)]


def build_linear_student(teacher: Backbone, blocks: Sequence[tuple[int, int]],
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


def build_folded_student(teacher: Backbone, blocks: Sequence[tuple[int, int]], maps: Sequence[tuple[np.ndarray, np.ndarray] | None],
                         folded_maps: Sequence[tuple[np.ndarray, np.ndarray] | None], *, fold: bool = True) -> tuple[torch.nn.Module, dict]:
    """The student without a layer for each folded block: its map (``folded_maps[j]``) goes
    into the preceding kept layer, merged (``fold``) or as a :class:`MappedMlpBlock`."""
    kept = [j for j, m in enumerate(folded_maps) if m is None]
    student, patches = build_linear_student(teacher, [blocks[j] for j in kept], [maps[j] for j in kept])
    position = {j: i for i, j in enumerate(kept)}
    for j, m in enumerate(folded_maps):
        if m is not None:
            i = position[j - 1]
            if fold:
                fold_into_mlp_output(student.blocks[i], *m)
            else:
                student.blocks[i] = MappedMlpBlock(student.blocks[i], *m)
    return student, patches


def compress(teacher: Backbone, calib: CalibrationSet, options: CompressOptions) -> Path:
    """Registry entry (``--method linear``): fit one map per multi-layer block (folded into
    the preceding MLP with ``fold``), export."""
    plan = resolve_plan(teacher, calib, options)
    blocks = [(int(s), int(e)) for s, e in plan["blocks"]]
    ridge = float(method_option(options.extra, "ridge"))
    replace_single = bool(method_option(options.extra, "linear_single_layers"))
    fold = bool(method_option(options.extra, "fold"))
    replaced = [e > s or replace_single for s, e in blocks]
    folds = foldable(blocks, replaced) if fold else [False] * len(blocks)
    plain = [r and not f for r, f in zip(replaced, folds)]
    kwargs = dict(ridge=ridge, batch_size=options.forward_batch, device=options.distill.device)
    fitted = iter(fit_linear_maps(teacher.model, teacher.transform, calib.fit, [b for b, r in zip(blocks, plain) if r], **kwargs))
    maps = [next(fitted) if r else None for r in plain]
    fitted_folds = iter(fit_mlp_output_maps(teacher.model, teacher.transform, calib.fit, [b for b, f in zip(blocks, folds) if f], **kwargs))
    folded_maps = [next(fitted_folds) if f else None for f in folds]
    record: dict[str, Any] = {"ridge": ridge, "fit_tiles": int(len(calib.fit)),
                              "solve": "float64 least squares on the token Gram, teacher-forced block inputs"}
    if any(folds):
        unfolded, _ = build_folded_student(teacher, blocks, maps, folded_maps, fold=False)
        record["fold"] = {"folded_blocks": [list(b) for b, f in zip(blocks, folds) if f],
                          "into_layers": [b[0] - 1 for b, f in zip(blocks, folds) if f],
                          "unfolded_fidelity": report_fidelity(unfolded.eval(), teacher, calib, options)}
        student, patches = build_folded_student(teacher, blocks, maps, folded_maps, fold=True)
    else:
        student, patches = build_linear_student(teacher, blocks, maps)
    return export_variant(
        student, teacher, calib, options, method="linear", run=None, layer_patches=patches,
        boundaries=None if any(folds) else [e for _s, e in blocks],  # a folded block leaves no layer of its own
        extra={"plan": plan, "linear": record},
    )
