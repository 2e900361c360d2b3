"""A trained slide head, loaded from its run folder, and what it may be applied to.

A run folder is what ``pathtwt train-mil`` writes (``results/mil/.../seedN``, or a fold
below it): ``checkpoint.pt`` (weights, aggregator, input width, classes, config), with
``metrics.json`` beside it. The head's provenance (backbone variant, weights sha256,
embedding recipe and the tile geometry of its training features) is read from the
checkpoint's ``features`` entry; runs written before it was recorded fall back on
``metrics.json``'s features folder (one of its files' attrs) when that folder can be found.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pathtwt.errors import PathtwtError
from pathtwt.io.torch_files import load_torch_file
from pathtwt.mil.data import features_provenance
from pathtwt.mil.heads import build_head, has_attention, is_buildable

CHECKPOINT = "checkpoint.pt"


@dataclass
class TrainedHead:
    run_dir: Path
    model: torch.nn.Module | None  # None: a head that is not a torch module (pathtwt.mil.heads)
    aggregator: str
    in_dim: int
    n_classes: int
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.run_dir)

    @property
    def has_attention(self) -> bool:
        return has_attention(self.aggregator)


def _nested_runs(run_dir: Path) -> list[str]:
    return sorted(str(p.parent.relative_to(run_dir)) for p in run_dir.rglob(CHECKPOINT))[:4]


def load_head(run_dir: str | os.PathLike, device: str | torch.device = "cpu") -> TrainedHead:
    """The head of ``run_dir`` in eval mode; one-line errors for a folder without a
    checkpoint (naming runs found below it) or a checkpoint that is not a MIL head's."""
    run_dir = Path(run_dir)
    if run_dir.is_file() and run_dir.name == CHECKPOINT:
        run_dir = run_dir.parent
    if not run_dir.is_dir():
        raise PathtwtError(f"--run {run_dir}: not a folder; give a run folder of `pathtwt train-mil` (results/mil/.../seedN)")
    path = run_dir / CHECKPOINT
    if not path.is_file():
        nested = _nested_runs(run_dir)
        hint = f"; it holds runs in {', '.join(nested)}: give one of those (--run can be repeated)" if nested else (
            "; the run may be unfinished (resume.pt) or not a `pathtwt train-mil` folder")
        raise PathtwtError(f"--run {run_dir}: no {CHECKPOINT}{hint}")
    state = load_torch_file(path, remedy="re-run `pathtwt train-mil` for this run")
    if not isinstance(state, dict) or not {"model", "aggregator", "in_dim", "n_classes"} <= set(state):
        raise PathtwtError(f"{path}: not a checkpoint of `pathtwt train-mil` (needs model, aggregator, in_dim, n_classes)")
    aggregator = str(state["aggregator"])
    config = state.get("config") or {}
    provenance = dict(state.get("features") or {}) or _provenance_from_metrics(run_dir)
    model = None
    if is_buildable(aggregator):
        model = build_head(
            aggregator, in_dim=int(state["in_dim"]), n_classes=int(state["n_classes"]),
            hidden_dim=int(config.get("hidden_dim", 512)), dropout=0.0,
            heads=int(config.get("heads", 8)), landmarks=config.get("landmarks"),
        )
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[0]
            raise PathtwtError(f"{path}: weights do not fit a {aggregator} head with its recorded config ({first})") from None
        model.to(device).eval()
    return TrainedHead(run_dir=run_dir, model=model, aggregator=aggregator, in_dim=int(state["in_dim"]),
                       n_classes=int(state["n_classes"]), provenance=provenance)


def _provenance_from_metrics(run_dir: Path) -> dict[str, Any]:
    """Older runs: the attrs of a features file in the folder ``metrics.json`` names
    (relative paths tried from the working directory and from the run folder's ancestors)."""
    try:
        metrics = json.loads((run_dir / "metrics.json").read_text())
        folder = Path(metrics["sources"]["features"])
    except (OSError, KeyError, TypeError, ValueError):
        return {}
    candidates = [folder] if folder.is_absolute() else [folder, *(p / folder for p in run_dir.resolve().parents)]
    for candidate in candidates:
        files = sorted(candidate.glob("*.h5")) if candidate.is_dir() else []
        if files:
            try:
                return features_provenance(files[0])
            except OSError:
                return {}
    return {}


def check_applicable(head: TrainedHead, *, dim: int, backbone: str, weights_sha256: str, recipe: str, where: str) -> None:
    """Refuse, in one line naming both sides, a head trained on features of another width,
    embedding recipe or backbone (weights) than ``where`` (a variant or a features file)."""
    prov = head.provenance
    if dim != head.in_dim:
        raise PathtwtError(
            f"--run {head.run_dir}: the head takes {head.in_dim}-d features ({_describe(prov)}) but {where} gives "
            f"{dim}-d ({backbone}, {recipe}); use the backbone variant and --embedding the head was trained on"
        )
    head_recipe = prov.get("embedding_recipe")
    if head_recipe and recipe and head_recipe != recipe:
        raise PathtwtError(
            f"--run {head.run_dir}: the head was trained on {head_recipe} embeddings ({_describe(prov)}) but {where} "
            f"gives {recipe} ({backbone}); use --embedding {head_recipe}"
        )
    head_sha = prov.get("weights_sha256") or ""
    head_backbone = prov.get("backbone") or ""
    other_weights = bool(head_sha and weights_sha256 and head_sha != weights_sha256)
    other_name = bool(not (head_sha and weights_sha256) and head_backbone and backbone and head_backbone != backbone)
    if other_weights or other_name:
        raise PathtwtError(
            f"--run {head.run_dir}: the head was trained on features of {_describe(prov)} but {where} comes from "
            f"{backbone} (weights sha256 {weights_sha256[:12] or 'none: random init'}); use the backbone variant the head was trained on"
        )


def _describe(prov: dict[str, Any]) -> str:
    if not prov:
        return "provenance not recorded"
    sha = str(prov.get("weights_sha256") or "")
    return (f"{prov.get('backbone', '?')}, weights sha256 {sha[:12] or 'none: random init'}, "
            f"{prov.get('embedding_recipe', '?')}")
