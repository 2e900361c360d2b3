"""Intrinsic dimension at block boundaries for a teacher and a student, and its spread
under stochastic augmentation (the paper's Table 1).

Boundaries pair the teacher's block ends e_j with the student's layer j. For each of
``n_draws`` draws every tile gets a fresh random spatial + colour augmentation; the ID of
each representation is estimated per draw, and its mean and sd over draws are reported.
The spread of the representations themselves is the relative sd of each tile's
representation across draws: sqrt(mean ||r - mean_r||^2) / sqrt(mean ||mean_r||^2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from pathtwt.compress.intermediates import iter_layer_outputs
from pathtwt.analysis.intrinsic_dim import REPRESENTATIONS, representation, two_nn

# representations kept across draws for the representation sd (small: one vector per tile)
SPREAD_KINDS = ("cls", "patch-mean")


def augment_tile(tile: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One random view of a uint8 (P, P, 3) tile: flips, a quarter turn, a resized crop
    of 60-100 % of the area, then brightness/contrast/saturation/hue jitter."""
    import cv2

    p = tile.shape[0]
    out = tile[:, ::-1] if rng.random() < 0.5 else tile
    out = out[::-1] if rng.random() < 0.5 else out
    out = np.rot90(out, int(rng.integers(4)))
    side = int(round(p * np.sqrt(rng.uniform(0.6, 1.0))))
    x, y = rng.integers(0, p - side + 1, size=2)
    out = cv2.resize(np.ascontiguousarray(out[y : y + side, x : x + side]), (p, p), interpolation=cv2.INTER_AREA)
    hsv = cv2.cvtColor(out, cv2.COLOR_RGB2HSV).astype(np.float32)
    hsv[..., 0] = (hsv[..., 0] + rng.uniform(-0.04, 0.04) * 180) % 180  # OpenCV hue is 0..180
    hsv[..., 1] *= rng.uniform(0.8, 1.2)
    out = cv2.cvtColor(np.clip(hsv, 0, 255).astype(np.uint8), cv2.COLOR_HSV2RGB).astype(np.float32)
    mean = out.mean()
    out = (out - mean) * rng.uniform(0.8, 1.2) + mean * rng.uniform(0.8, 1.2)
    return np.clip(out, 0, 255).astype(np.uint8)


def boundary_representations(
    model: torch.nn.Module,
    transform: Callable,
    tiles: np.ndarray,
    layers: Sequence[int],
    *,
    num_prefix_tokens: int,
    kinds: Sequence[str] = REPRESENTATIONS,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    progress: Callable[[int], Any] | None = None,
) -> dict[str, list[torch.Tensor]]:
    """kind -> one (N, F) float32 CPU tensor per requested layer (1-indexed)."""
    out: dict[str, list[list[torch.Tensor]]] = {k: [[] for _ in layers] for k in kinds}
    for outs in iter_layer_outputs(model, transform, tiles, batch_size=batch_size, device=device, progress=progress):
        for i, layer in enumerate(layers):
            for k in kinds:
                out[k][i].append(representation(outs[layer - 1], k, num_prefix_tokens).cpu())
    return {k: [torch.cat(parts) for parts in per_layer] for k, per_layer in out.items()}


@dataclass
class ModelUnderTest:
    name: str
    model: torch.nn.Module
    transform: Callable
    num_prefix_tokens: int
    layers: list[int]  # layer (1-indexed) at each boundary

    def representations(self, tiles: np.ndarray, kinds: Sequence[str], **run: Any) -> dict[str, list[torch.Tensor]]:
        return boundary_representations(
            self.model, self.transform, tiles, self.layers, num_prefix_tokens=self.num_prefix_tokens, kinds=kinds, **run
        )


def trajectory_ids(
    m: ModelUnderTest,
    tiles: np.ndarray,
    *,
    kinds: Sequence[str] = REPRESENTATIONS,
    discard_fraction: float = 0.1,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    progress: Callable[[int], Any] | None = None,
) -> dict[str, list[float]]:
    """kind -> ID at each boundary of ``m`` on the tiles as they are (no augmentation)."""
    reps = m.representations(tiles, kinds, batch_size=batch_size, device=device, progress=progress)
    return {k: [two_nn(r, discard_fraction) for r in reps[k]] for k in kinds}


@dataclass
class StabilityResult:
    boundaries: list[int]  # 1..K
    # model name -> kind -> (n_draws, K) ID estimates
    ids: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    # model name -> kind -> (K,) relative sd of representations across draws
    spread: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    layers: dict[str, list[int]] = field(default_factory=dict)


def _relative_spread(draws: torch.Tensor) -> float:
    """draws (A, N, F) -> sqrt(mean ||r - mean_r||^2) / sqrt(mean ||mean_r||^2)."""
    mean = draws.double().mean(0)
    var = ((draws.double() - mean) ** 2).sum(-1).mean()
    return float(var.sqrt() / (mean**2).sum(-1).mean().sqrt())


def stability(
    models: Sequence[ModelUnderTest],
    tiles: np.ndarray,
    *,
    n_draws: int = 5,
    seed: int = 0,
    kinds: Sequence[str] = REPRESENTATIONS,
    discard_fraction: float = 0.1,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    progress: Callable[[int], Any] | None = None,
) -> StabilityResult:
    """IDs per draw and representation spread for every model on the same augmented views."""
    K = len(models[0].layers)
    result = StabilityResult(boundaries=list(range(1, K + 1)))
    rng = np.random.default_rng(seed)
    views = [np.stack([augment_tile(t, rng) for t in tiles]) for _ in range(n_draws)]
    for m in models:
        ids = {k: np.zeros((n_draws, K)) for k in kinds}
        kept: dict[str, list[list[torch.Tensor]]] = {k: [[] for _ in range(K)] for k in kinds if k in SPREAD_KINDS}
        for a, view in enumerate(views):
            reps = m.representations(view, kinds, batch_size=batch_size, device=device, progress=progress)
            for k in kinds:
                ids[k][a] = [two_nn(r, discard_fraction) for r in reps[k]]
                if k in kept:
                    for j in range(K):
                        kept[k][j].append(reps[k][j])
        result.ids[m.name] = ids
        result.spread[m.name] = {k: np.array([_relative_spread(torch.stack(v)) for v in kept[k]]) for k in kept}
        result.layers[m.name] = list(m.layers)
    return result


def table_rows(result: StabilityResult, teacher: str, student: str | None, kind: str) -> list[dict[str, Any]]:
    """Rows like the paper's Table 1 for one representation kind."""
    rows = []
    for j in range(len(result.boundaries)):
        t = result.ids[teacher][kind][:, j]
        row: dict[str, Any] = {
            "boundary": j + 1,
            "teacher_layer": result.layers[teacher][j],
            "teacher_id_mean": float(t.mean()),
            "teacher_id_sd": float(t.std(ddof=1)) if len(t) > 1 else 0.0,
        }
        if kind in result.spread[teacher]:
            row["teacher_rep_sd"] = float(result.spread[teacher][kind][j])
        if student is not None:
            s = result.ids[student][kind][:, j]
            row.update(
                student_layer=result.layers[student][j],
                student_id_mean=float(s.mean()),
                student_id_sd=float(s.std(ddof=1)) if len(s) > 1 else 0.0,
            )
            t_sd = row["teacher_id_sd"]
            row["sd_reduction_pct"] = 100.0 * (1.0 - row["student_id_sd"] / t_sd) if t_sd > 0 else float("nan")
            if kind in result.spread[student]:
                row["student_rep_sd"] = float(result.spread[student][kind][j])
        rows.append(row)
    return rows


def markdown_table(rows: Sequence[dict[str, Any]], kind: str) -> str:
    has_student = bool(rows) and "student_id_mean" in rows[0]
    head = ["boundary", "teacher layer", f"teacher ID ({kind}) mean (sd)"]
    if has_student:
        head += ["student layer", f"student ID ({kind}) mean (sd)", "sd reduction %"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["boundary"]), str(r["teacher_layer"]), f"{r['teacher_id_mean']:.2f} ({r['teacher_id_sd']:.2f})"]
        if has_student:
            cells += [
                str(r["student_layer"]),
                f"{r['student_id_mean']:.2f} ({r['student_id_sd']:.2f})",
                f"{r['sd_reduction_pct']:.1f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
