"""Fidelity of a compressed backbone to its teacher, centred so that it can tell a good
student from a useless one.

The number that matters downstream is the tile embedding (concat of CLS and mean patch
token, ``pathtwt.models.embedding.pool_tokens``). Tile embeddings share a large common
direction, so the plain cosine between student and teacher embeddings is high for any
student that lands near that direction: a constant vector (the teacher's mean embedding)
scores about 0.8 on real H&E tiles. The primary numbers are therefore centred on the
teacher's mean over the FIT tiles (never the tiles being scored, so nothing is fitted to
them):

- ``r2``: ``1 - sum ||s - t||^2 / sum ||t - mean_fit(t)||^2``, the share of the teacher
  embedding's variation the student reproduces (teacher 1, the constant fit mean ~0,
  worse than the constant below 0);
- ``centred_cosine``: mean over tiles of cos(s - mean_fit(t), t - mean_fit(t));
- ``cka``: linear CKA between student and teacher embeddings of the scored tiles
  (invariant to rotation and scale of the student's features; 0 for a constant);
- ``block_r2``: the same R^2 at every block boundary, over all tokens, each token
  position centred on the teacher's fit mean for that position and layer, so a reader
  sees where a student drifts;
- ``cosine``: the uncentred mean cosine, kept only as a secondary number.

Reference rows on the same tiles say what the numbers mean: the teacher itself, the
constant fit mean, and a randomly initialised network of the teacher's architecture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
from torch import nn

from pathtwt.compress.calibration import CalibrationSet, TeacherCentre
from pathtwt.compress.distill import Transform
from pathtwt.compress.intermediates import tiles_to_batch
from pathtwt.compress.side_passes import named_out_of_memory
from pathtwt.compress.student import block_outputs

if TYPE_CHECKING:
    from pathtwt.models.registry import Backbone
    from pathtwt.models.spec import BackboneSpec

METRICS = ("r2", "centred_cosine", "cka", "cosine", "block_r2", "n_tiles")
MAX_MEAN_TILES = 512  # fit tiles averaged for the centre: plenty for a mean, bounded cost


def _embed(model: nn.Module, outs: list[torch.Tensor], num_prefix_tokens: int) -> torch.Tensor:
    from pathtwt.models.embedding import pool_model_tokens

    # pool_model_tokens applies a variant's embedding probe (WDPruning) after pooling
    return pool_model_tokens(model, model.norm(outs[-1]), num_prefix_tokens).float()


@torch.no_grad()
def teacher_centre(teacher: nn.Module, fit_tiles: np.ndarray, *, transform: Transform, num_prefix_tokens: int,
                   device: str = "cpu", batch_size: int = 32, max_tiles: int = MAX_MEAN_TILES,
                   outputs: Sequence[torch.Tensor] | None = None) -> TeacherCentre:
    """The teacher's fit means (the first ``max_tiles`` fit tiles: the draw is already random).
    ``outputs``: the teacher's layer outputs of exactly those tiles
    (:func:`pathtwt.compress.teacher_cache.fit_layer_outputs`), which spares the forward
    pass and gives the same sums up to float rounding."""
    tiles = fit_tiles[:max_tiles]
    if len(tiles) == 0:
        raise ValueError("no fit tiles to centre fidelity on")
    if outputs is not None and len(outputs[0]) != len(tiles):
        raise ValueError(f"outputs of {len(outputs[0])} tiles given for {len(tiles)} fit tiles")
    teacher.eval().to(device)
    emb_sum, layer_sum = None, None
    for i in range(0, len(tiles), batch_size):
        outs = (block_outputs(teacher, tiles_to_batch(transform, tiles[i : i + batch_size], device)) if outputs is None
                else [o[i : i + batch_size].to(device) for o in outputs])
        emb = _embed(teacher, outs, num_prefix_tokens).double().sum(0)
        lay = torch.stack([o.double().sum(0) for o in outs])
        emb_sum = emb if emb_sum is None else emb_sum + emb
        layer_sum = lay if layer_sum is None else layer_sum + lay
    n = len(tiles)
    return TeacherCentre(embedding=(emb_sum / n).float().cpu(), layers=(layer_sum / n).float().cpu(), n_tiles=n)


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA of two (N, features) matrices (columns centred on the scored tiles);
    0 when either is constant."""
    x = x - x.mean(0, keepdims=True)
    y = y - y.mean(0, keepdims=True)
    cross = np.linalg.norm(y.T @ x) ** 2
    norm = np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)
    return float(cross / norm) if norm > 0 else 0.0


class _Scores:
    """Running sums over batches of (student, teacher) embeddings and block outputs."""

    def __init__(self, centre: TeacherCentre, boundaries: Sequence[int]) -> None:
        self.centre, self.boundaries = centre, list(boundaries)
        self.s_emb: list[np.ndarray] = []
        self.t_emb: list[np.ndarray] = []
        self.block_err = np.zeros(len(self.boundaries))
        self.block_var = np.zeros(len(self.boundaries))

    def add(self, s_emb: torch.Tensor, t_emb: torch.Tensor, s_blocks: Sequence[torch.Tensor],
            t_layers: Sequence[torch.Tensor]) -> None:
        """``s_blocks[j]`` is matched against teacher layer ``boundaries[j]``, whose tokens
        are ``t_layers[boundaries[j]]``."""
        self.s_emb.append(s_emb.double().cpu().numpy())
        self.t_emb.append(t_emb.double().cpu().numpy())
        for j, e in enumerate(self.boundaries):
            t = t_layers[e].double()
            self.block_err[j] += float(((s_blocks[j].double() - t) ** 2).sum())
            self.block_var[j] += float(((t - self.centre.layers[e].to(t.device).double()) ** 2).sum())

    def result(self) -> dict[str, Any]:
        s, t = np.concatenate(self.s_emb), np.concatenate(self.t_emb)
        mu = self.centre.embedding.double().numpy()
        var = float(((t - mu) ** 2).sum())
        sc, tc = s - mu, t - mu

        def mean_cos(a: np.ndarray, b: np.ndarray) -> float:
            na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
            return float(np.mean((a * b).sum(1) / np.maximum(na * nb, 1e-12)))

        return {
            "r2": 1.0 - float(((s - t) ** 2).sum()) / var if var > 0 else float("nan"),
            "centred_cosine": mean_cos(sc, tc),
            "cka": linear_cka(s, t),
            "cosine": mean_cos(s, t),
            "block_r2": [1.0 - e / v if v > 0 else float("nan") for e, v in zip(self.block_err, self.block_var)],
            "block_layers": list(self.boundaries),  # the teacher layer each block_r2 value is matched to
            "n_tiles": int(len(t)),
        }


def _teacher_batch(teacher: nn.Module, x: torch.Tensor, outputs: Sequence[torch.Tensor] | None,
                   start: int) -> list[torch.Tensor]:
    """The teacher's layer outputs of the batch ``x`` of tiles ``start, start + len(x), ...``:
    sliced from ``outputs`` (all the tiles' outputs, computed once) or computed now."""
    if outputs is None:
        return block_outputs(teacher, x)
    return [o[start : start + len(x)].to(x.device) for o in outputs]


@torch.no_grad()
def evaluate_fidelity(
    student: nn.Module,
    teacher: nn.Module,
    tiles: np.ndarray,
    *,
    centre: TeacherCentre,
    transform: Transform,
    num_prefix_tokens: int,
    boundaries: Sequence[int] | None = None,
    device: str = "cpu",
    batch_size: int = 32,
    teacher_embeddings: torch.Tensor | None = None,
    teacher_outputs: Sequence[torch.Tensor] | None = None,
) -> dict[str, Any]:
    """The metrics of the module doc (``METRICS``) of ``student`` on ``tiles``. With
    ``boundaries`` (teacher layer e_j matched by student block j) also ``block_r2``.
    ``teacher_embeddings`` (the teacher's embeddings of ``tiles``, without boundaries only)
    or ``teacher_outputs`` (its layer outputs of ``tiles``,
    :func:`pathtwt.compress.teacher_cache.held_out_outputs`) spare the teacher's
    forward pass when many students are scored on the same tiles."""
    if len(tiles) == 0:
        return {"n_tiles": 0}
    boundaries = list(boundaries or [])
    if teacher_embeddings is not None and boundaries:
        raise ValueError("cached teacher embeddings carry no block outputs; pass boundaries=None")
    student.eval().to(device)
    teacher.eval().to(device)
    scores = _Scores(centre, boundaries)
    for i in range(0, len(tiles), batch_size):
        x = tiles_to_batch(transform, tiles[i : i + batch_size], device)
        s_out = block_outputs(student, x)
        if teacher_embeddings is None:
            t_out = _teacher_batch(teacher, x, teacher_outputs, i)
            t_emb = _embed(teacher, t_out, num_prefix_tokens)
        else:
            t_out, t_emb = [], teacher_embeddings[i : i + batch_size].to(device)
        scores.add(_embed(student, s_out, num_prefix_tokens), t_emb, [s_out[j + 1] for j in range(len(boundaries))], t_out)
    return scores.result()


@torch.no_grad()
def tile_embeddings(model: nn.Module, tiles: np.ndarray, *, transform: Transform, num_prefix_tokens: int,
                    device: str = "cpu", batch_size: int = 32) -> torch.Tensor:
    """``model``'s tile embeddings of ``tiles`` (N, E), its probe included, float32 on CPU."""
    model.eval().to(device)
    return torch.cat([_embed(model, block_outputs(model, tiles_to_batch(transform, tiles[i : i + batch_size], device)),
                             num_prefix_tokens).cpu() for i in range(0, len(tiles), batch_size)])


@torch.no_grad()
def constant_fidelity(teacher: nn.Module, tiles: np.ndarray, *, centre: TeacherCentre, transform: Transform,
                      num_prefix_tokens: int, boundaries: Sequence[int] | None = None, device: str = "cpu",
                      batch_size: int = 32, constant: TeacherCentre | None = None,
                      teacher_outputs: Sequence[torch.Tensor] | None = None) -> dict[str, Any]:
    """The reference "student" that outputs the teacher's fit means whatever the tile (its
    R^2 is 0 by construction: the fit mean is R^2's baseline), or another ``constant``
    (``teacher_outputs`` as in :func:`evaluate_fidelity`)."""
    boundaries = list(boundaries or [])
    value = centre if constant is None else constant
    teacher.eval().to(device)
    scores = _Scores(centre, boundaries)
    for i in range(0, len(tiles), batch_size):
        x = tiles_to_batch(transform, tiles[i : i + batch_size], device)
        t_out = _teacher_batch(teacher, x, teacher_outputs, i)
        t_emb = _embed(teacher, t_out, num_prefix_tokens)
        n = len(x)
        scores.add(value.embedding.to(t_emb.device).expand(n, -1), t_emb,
                   [value.layers[e].to(t_emb.device).expand(n, -1, -1) for e in boundaries], t_out)
    return scores.result()


def random_init_model(spec: BackboneSpec, seed: int = 0) -> nn.Module:
    """The teacher's architecture with timm's random initialisation (the floor row)."""
    from pathtwt.models.registry import build_timm_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_timm_model(spec).eval()


def fit_centre(teacher: Backbone, calib: CalibrationSet, *, device: str = "cpu") -> TeacherCentre:
    """The teacher's fit means for this calibration set, computed once per process and
    once per teacher cache on disk (:mod:`pathtwt.compress.teacher_cache`), in the batch of
    the teacher's shared passes whatever the job's own (a batch size moves only float
    rounding), so every job of the calibration set reads the same entry."""
    from pathtwt.compress.teacher_cache import FIT_OUTPUTS_BATCH, teacher_cache, whole_fit_outputs

    store, key = calib.derived.teacher_centres, id(teacher.model)
    if key not in store:
        def compute() -> dict[str, Any]:
            # the shared layer outputs when they hold the whole fit split (and so exactly the
            # tiles the centre averages, the split being within MAX_MEAN_TILES too)
            outputs = whole_fit_outputs(teacher, calib) if len(calib.fit) <= MAX_MEAN_TILES else None
            c = teacher_centre(teacher.model, calib.fit, transform=teacher.transform,
                               num_prefix_tokens=teacher.spec.num_prefix_tokens, device=device,
                               batch_size=FIT_OUTPUTS_BATCH, outputs=outputs)
            return {"embedding": c.embedding, "layers": c.layers, "n_tiles": c.n_tiles}

        value = teacher_cache(teacher, calib).get("centre", compute, batch_size=FIT_OUTPUTS_BATCH,
                                                  max_tiles=MAX_MEAN_TILES)
        store[key] = TeacherCentre(embedding=value["embedding"], layers=value["layers"], n_tiles=int(value["n_tiles"]))
    return store[key]


def measure(student: nn.Module, teacher: Backbone, calib: CalibrationSet, *, on: str = "report", boundaries: Sequence[int] | None = None,
            device: str = "cpu", batch_size: int = 32) -> dict[str, Any]:
    """``student``'s fidelity on one split of ``calib`` ("select" for choices, "report" for
    what is reported; either falls back to fit when the set holds nothing out)."""
    from pathtwt.compress.teacher_cache import held_out_outputs

    tiles = calib.choosing_tiles() if on == "select" else calib.reported_tiles()[0]
    kw = dict(transform=teacher.transform, num_prefix_tokens=teacher.spec.num_prefix_tokens, device=device,
              batch_size=batch_size)
    cached, outputs = None, None
    with named_out_of_memory(f"the fidelity measurement on the {on} tiles", batch_size):
        if on == "select" and not boundaries:  # choices score many students on these tiles
            store = calib.derived.select_embeddings
            if id(teacher.model) not in store:
                store[id(teacher.model)] = tile_embeddings(teacher.model, tiles, **kw)
            cached = store[id(teacher.model)]
        elif on == "report":  # the teacher's side of every reported number, computed once
            outputs = held_out_outputs(teacher, calib, "report")
        return evaluate_fidelity(student, teacher.model, tiles, centre=fit_centre(teacher, calib, device=device),
                                 boundaries=boundaries, teacher_embeddings=cached, teacher_outputs=outputs, **kw)


def references(teacher: Backbone, calib: CalibrationSet, *, device: str = "cpu", seed: int = 0) -> dict[str, Any]:
    """Teacher, constant fit mean and random-init teacher architecture on the report tiles,
    block R^2 at every teacher layer; computed once per calibration set (``pathtwt
    discover`` leaves them in the teacher cache for the compress jobs), in the batch of the
    teacher's shared passes whatever the job's own."""
    from pathtwt.compress.teacher_cache import FIT_OUTPUTS_BATCH, held_out_outputs, teacher_cache

    store, key = calib.derived.references, (id(teacher.model), int(seed))
    if key not in store:
        def compute() -> dict[str, Any]:
            layers = list(range(1, len(teacher.model.blocks) + 1))
            tiles = calib.reported_tiles()[0]
            kw = dict(centre=fit_centre(teacher, calib, device=device), transform=teacher.transform,
                      num_prefix_tokens=teacher.spec.num_prefix_tokens, boundaries=layers, device=device,
                      batch_size=FIT_OUTPUTS_BATCH, teacher_outputs=held_out_outputs(teacher, calib, "report"))
            return {
                "teacher": evaluate_fidelity(teacher.model, teacher.model, tiles, **kw),
                "constant": constant_fidelity(teacher.model, tiles, **kw),
                "random_init": evaluate_fidelity(random_init_model(teacher.spec, seed), teacher.model, tiles, **kw),
            }

        store[key] = teacher_cache(teacher, calib).get("references", compute, batch_size=FIT_OUTPUTS_BATCH,
                                                       seed=int(seed), max_tiles=MAX_MEAN_TILES)
    return store[key]


def fidelity_record(teacher: Backbone, calib: CalibrationSet, *, initial: dict[str, Any], final: dict[str, Any],
                    device: str = "cpu", seed: int = 0) -> dict[str, Any]:
    """model.json's ``fidelity`` entry: where it was measured, the split, the student before
    and after training, and the reference rows on the same tiles."""
    return {"on": calib.reported_tiles()[1], "splits": calib.splits_record(), "centre_tiles": fit_centre(teacher, calib).n_tiles,
            "initial": initial, "final": final,
            "references": references(teacher, calib, device=device, seed=seed)}
