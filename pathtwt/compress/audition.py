"""Auditioning: choose the layer that initialises each block's surrogate.

For a block [s, e] (1-indexed, inclusive) the candidates are every teacher layer s..e and,
when the block has more than one layer, one *averaged* layer: its attention and MLP weight
matrices and biases (qkv, proj, fc1, fc2) are the mean over the block's layers, while its
normalisation and LayerScale parameters are NOT averaged but taken from the block's last
layer e. Why the last layer: its norms and LayerScale were trained to produce the residual
update that lands on h_e, the very target of the surrogate, so their scale is the one
the block's output needs (averaging gammas of layers with 30x different output norms would
match none of them).

Each candidate is briefly fitted (``steps``, AdamW; 0 = score only) to map h_{s-1} (the
teacher's input to the block: the embedded tokens for s = 1) to h_e on fit tiles, then
ranked by MSE on the select tiles (the calibration split for choices; the report tiles
are never read here). The fitted winner initialises the surrogate. The fitting computes
in the distillation's precision (bf16 autocast over fp32 weights where the run trains in
bf16, as its optimiser steps do); the teacher's states and the ranking MSEs stay fp32.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from pathtwt.compress.distill import Transform
from pathtwt.compress.intermediates import tiles_to_batch
from pathtwt.compress.side_passes import named_out_of_memory, rank_batch
from pathtwt.compress.student import block_outputs
from pathtwt.compress.teacher_cache import FIT_OUTPUTS_TILES


@dataclass
class AuditionOptions:
    steps: int = 50  # fitting steps per candidate (0: rank the candidates as they are)
    lr: float = 1e-4
    # candidates' fitting batch (TWT passes the smaller of this and --batch-size), the same
    # whatever the number of ranks so the choice is too; the forward-only passes (teacher
    # states, scoring) run at most a rank's share of it (side_passes.rank_batch)
    batch_size: int = 16
    max_fit_tiles: int = FIT_OUTPUTS_TILES  # teacher states are held in memory: keep these modest
    max_select_tiles: int = 64
    seed: int = 0
    device: str = "cpu"
    precision: str = "fp32"  # of the fitting steps: fp32 | bf16 (autocast)


def averaged_layer(teacher: nn.Module, s: int, e: int) -> nn.Module:
    """A copy of layer e whose attention/MLP weights and biases are the mean over layers s..e
    (norms, including any q/k norms, and LayerScale kept from layer e)."""
    layers = [teacher.blocks[i - 1] for i in range(s, e + 1)]
    avg = copy.deepcopy(layers[-1])
    params = [dict(layer.named_parameters()) for layer in layers]
    with torch.no_grad():
        for name, p in avg.named_parameters():
            if name.split(".")[0] in ("attn", "mlp") and "norm" not in name:
                p.copy_(torch.stack([q[name].detach() for q in params]).mean(0))
    return avg


def candidates(teacher: nn.Module, s: int, e: int) -> list[tuple[str, int | None, nn.Module]]:
    """(name, teacher layer or None for the average, trainable module copy) for block [s, e]."""
    out: list[tuple[str, int | None, nn.Module]] = [
        (f"layer {i}", i, copy.deepcopy(teacher.blocks[i - 1])) for i in range(s, e + 1)
    ]
    if e > s:
        out.append((f"average {s}-{e}", None, averaged_layer(teacher, s, e)))
    for _, _, module in out:
        module.requires_grad_(True)  # the teacher's own parameters are frozen
    return out


@torch.no_grad()
def teacher_states(teacher: nn.Module, tiles: np.ndarray, indices: Sequence[int], *, transform: Transform,
                   device: str, batch_size: int) -> dict[int, torch.Tensor]:
    """{l: h_l (N, T, D) float32 on CPU} for the requested layer numbers (0 = embedded tokens)."""
    teacher.eval().to(device)
    wanted = sorted(set(indices))
    parts: dict[int, list[torch.Tensor]] = {l: [] for l in wanted}
    for i in range(0, len(tiles), batch_size):
        outs = block_outputs(teacher, tiles_to_batch(transform, tiles[i : i + batch_size], device))
        for l in wanted:
            parts[l].append(outs[l].float().cpu())
    return {l: torch.cat(v) for l, v in parts.items()}


@torch.no_grad()
def _mse(layer: nn.Module, h_in: torch.Tensor, h_out: torch.Tensor, *, device: str, batch_size: int) -> float:
    layer.eval()
    total = 0.0
    for i in range(0, len(h_in), batch_size):
        pred = layer(h_in[i : i + batch_size].to(device))
        total += float(nn.functional.mse_loss(pred, h_out[i : i + batch_size].to(device), reduction="sum"))
    return total / h_out.numel()


def _fit(layer: nn.Module, h_in: torch.Tensor, h_out: torch.Tensor, options: AuditionOptions) -> None:
    from pathtwt.models.bf16_guard import autocast, bf16_attention

    layer.train().to(options.device)
    opt = torch.optim.AdamW(layer.parameters(), lr=options.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(options.seed)
    b = min(options.batch_size, len(h_in))
    # the whole fitting batch on every rank (not a rank's share): its own message
    with named_out_of_memory("auditioning's fitting steps", b, skip="--audition-steps 0 (candidates ranked unfitted)",
                             sized_by=f"the smaller of --batch-size and {AuditionOptions.batch_size}"):
        for _ in range(options.steps):
            idx = torch.randperm(len(h_in), generator=g)[:b]
            with autocast(options.device, options.precision), bf16_attention([layer], options.device, options.precision):
                pred = layer(h_in[idx].to(options.device))
            loss = nn.functional.mse_loss(pred.float(), h_out[idx].to(options.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)
            opt.step()
    layer.eval()


def audition(
    teacher: nn.Module,
    blocks: Sequence[Sequence[int]],
    fit_tiles: np.ndarray,
    select_tiles: np.ndarray,
    *,
    transform: Transform,
    options: AuditionOptions,
    fit_outputs: Sequence[torch.Tensor] | None = None,
    select_outputs: Sequence[torch.Tensor] | None = None,
) -> tuple[list[nn.Module], list[dict]]:
    """The winning (fitted) layer of every block and the ranking report, one entry per block:
    ``{"block": [s, e], "winner": name, "ranking": [{"candidate", "layer", "select_mse",
    "select_mse_unfitted"}, ...]}`` best first. ``fit_outputs``: the teacher's layer outputs
    of the fit tiles used here (:func:`pathtwt.compress.teacher_cache.fit_layer_outputs`)
    and ``select_outputs`` those of the select tiles ranked on
    (:func:`pathtwt.compress.teacher_cache.held_out_outputs`), sparing their passes."""
    with named_out_of_memory("auditioning", rank_batch(options.batch_size)):
        return _audition(teacher, blocks, fit_tiles, select_tiles, transform=transform, options=options,
                         fit_outputs=fit_outputs, select_outputs=select_outputs)


def _audition(teacher: nn.Module, blocks: Sequence[Sequence[int]], fit_tiles: np.ndarray, select_tiles: np.ndarray, *,
              transform: Transform, options: AuditionOptions, fit_outputs: Sequence[torch.Tensor] | None,
              select_outputs: Sequence[torch.Tensor] | None) -> tuple[list[nn.Module], list[dict]]:
    fit = fit_tiles[: options.max_fit_tiles]
    held = select_tiles[: options.max_select_tiles] if len(select_tiles) else fit
    needed = [l for s, e in blocks for l in (s - 1, e)]
    forward = rank_batch(options.batch_size)
    kw = dict(transform=transform, device=options.device, batch_size=forward)
    for given, tiles, name in ((fit_outputs, fit, "fit"), (select_outputs, held, "select")):
        if given is not None and len(given[0]) != len(tiles):
            raise ValueError(f"{name}_outputs of {len(given[0])} tiles given for {len(tiles)} {name} tiles")
    fit_states = (teacher_states(teacher, fit, needed, **kw) if fit_outputs is None
                  else {l: fit_outputs[l] for l in sorted(set(needed))})
    held_states = (teacher_states(teacher, held, needed, **kw) if select_outputs is None
                   else {l: select_outputs[l] for l in sorted(set(needed))})
    winners, report = [], []
    for s, e in blocks:
        ranking = []
        for name, layer_no, module in candidates(teacher, s, e):
            module.to(options.device)
            before = _mse(module, held_states[s - 1], held_states[e], device=options.device, batch_size=forward)
            if options.steps > 0:
                _fit(module, fit_states[s - 1], fit_states[e], options)
            after = _mse(module, held_states[s - 1], held_states[e], device=options.device, batch_size=forward)
            ranking.append({"candidate": name, "layer": layer_no, "select_mse": after,
                            "select_mse_unfitted": before, "module": module})
        ranking.sort(key=lambda r: r["select_mse"])
        winners.append(ranking[0]["module"].cpu())
        report.append({"block": [s, e], "winner": ranking[0]["candidate"],
                       "ranking": [{k: v for k, v in r.items() if k != "module"} for r in ranking]})
    return winners, report
