"""The MIL training loop: one slide per forward pass, gradient accumulation, clipping,
class-weighted cross-entropy, cosine annealing, per-epoch evaluation, epoch selection
(:mod:`pathtwt.mil.selection`) and a resumable per-epoch checkpoint.

Determinism: the model is initialised from ``seed``; the slide order, the instance
subsampling and the dropout masks of epoch e are drawn from generators seeded by
``(seed, e)``. A resumed run therefore restores only model, optimiser, scheduler and
history and continues bit-identically on CPU."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from pathtwt.errors import ConfigError, NumericsError
from pathtwt.io.atomic import atomic_output
from pathtwt.io.torch_files import load_torch_file
from pathtwt.mil.data import Cohort, MILData, load_bag
from pathtwt.mil.heads import build_head, get_head
from pathtwt.mil.metrics import slide_metrics
from pathtwt.mil.protocols import MILConfig
from pathtwt.mil.selection import select_epoch

RESUME_FILE = "resume.pt"


@dataclass
class Evaluation:
    """Predictions of one cohort (attention only when asked for)."""

    cohort: Cohort
    probs: np.ndarray  # (n_slides, C)
    metrics: dict
    attention: list[tuple[np.ndarray, np.ndarray]] | None = None  # per slide: (scores (N,), coords (N, 2))


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` CPU threads (None: unchanged). MIL processes one bag per step;
    with small bags and heads, thread synchronisation costs more than it saves."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def make_model(config: MILConfig, data: MILData) -> torch.nn.Module:
    torch.manual_seed(config.seed)
    dropout = get_head(config.aggregator).dropout if config.dropout is None else config.dropout
    model = build_head(
        config.aggregator,
        in_dim=data.dim,
        n_classes=data.n_classes,
        hidden_dim=config.hidden_dim,
        dropout=dropout,
        heads=config.heads,
        landmarks=config.landmarks,
    )
    # standardise inputs with the training split's statistics only (no peeking at
    # validation, test or external cohorts)
    model.standardize.fit(load_bag(bag)[0] for bag in data.cohort("train").bags)
    return model


def class_weights(labels: np.ndarray, n_classes: int) -> torch.Tensor:
    """Inverse class frequency, normalised so a training slide weighs 1 on average;
    classes absent from training get 0 (they never occur as a training target)."""
    counts = np.bincount(labels, minlength=n_classes).astype(np.float64)
    present = counts > 0
    weights = np.zeros(n_classes)
    weights[present] = len(labels) / (present.sum() * counts[present])
    return torch.tensor(weights, dtype=torch.float32)


def _epoch_rngs(seed: int, epoch: int) -> tuple[np.random.Generator, np.random.Generator]:
    torch.manual_seed(seed * 100_003 + epoch)  # dropout masks of this epoch
    return np.random.default_rng([seed, epoch, 0]), np.random.default_rng([seed, epoch, 1])


def train_epoch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    cohort: Cohort,
    config: MILConfig,
    weights: torch.Tensor,
    epoch: int,
    device: torch.device,
    progress: bool,
) -> float:
    """One pass over the training slides in a seeded order; returns the mean loss."""
    from tqdm.auto import tqdm

    order_rng, subsample_rng = _epoch_rngs(config.seed, epoch)
    order = order_rng.permutation(len(cohort.bags))
    n, group = len(order), max(1, config.accumulation)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    bar = tqdm(order, desc=f"epoch {epoch}/{config.epochs}", unit="slide", leave=False, disable=not progress)
    for step, index in enumerate(bar, start=1):
        bag = cohort.bags[index]
        features, _ = load_bag(bag, max_instances=config.max_instances, rng=subsample_rng)
        target = torch.tensor([bag.label], device=device)
        logits, _ = model(_bag_tensor(features, device))
        loss = F.cross_entropy(logits, target) * (weights[bag.label] if config.class_weighted else 1.0)
        if not torch.isfinite(loss):
            raise NumericsError(
                f"training loss became {loss.item()} at epoch {epoch}, step {step} (slide {bag.slide_id}); "
                "lower --lr or check that slide's features"
            )
        # the last group of an epoch may hold fewer slides: average over what it holds
        group_start = (step - 1) // group * group
        (loss / min(group, n - group_start)).backward()
        if step % group == 0 or step == n:
            if config.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        total += loss.item()
        bar.set_postfix(loss=f"{total / step:.4f}", refresh=False)
    bar.close()
    return total / max(1, n)


def _bag_tensor(features: np.ndarray, device: torch.device) -> torch.Tensor:
    """A bag as a tensor on ``device``: a bag read from its file is shared (no copy on CPU);
    a bag served from memory is read-only and shared by later reads, so it is copied
    (torch only shares a read-only array with a warning)."""
    if features.flags.writeable:
        return torch.from_numpy(features).to(device)
    return torch.tensor(features, device=device)


@torch.no_grad()
def evaluate(model: torch.nn.Module, cohort: Cohort, *, n_classes: int, device: torch.device, keep_attention: bool = False) -> Evaluation:
    model.eval()
    probs = np.zeros((len(cohort.bags), n_classes), dtype=np.float64)
    attention = [] if keep_attention else None
    for i, bag in enumerate(cohort.bags):
        features, coords = load_bag(bag)
        logits, scores = model(_bag_tensor(features, device))
        probs[i] = torch.softmax(logits.double(), dim=-1)[0].cpu().numpy()
        if attention is not None:
            attention.append((scores.float().cpu().numpy(), coords))
    return Evaluation(cohort=cohort, probs=probs, metrics=slide_metrics(cohort.labels, probs, n_classes), attention=attention)


def _state_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _save(obj: dict, path: Path) -> None:
    with atomic_output(path) as tmp:
        torch.save(obj, tmp)


def _load_resume(path: Path, *, config: MILConfig, data: MILData) -> dict | None:
    if not path.exists():
        return None
    state = load_torch_file(path, remedy="delete it, or pass --no-resume to start over")
    if not isinstance(state, dict):
        raise ConfigError(f"{path}: not a resume state of `pathtwt train-mil`; delete it or pass --no-resume")
    if state.get("config") != config.to_dict() or state.get("data") != data.fingerprint():
        raise ConfigError(
            f"{path}: an unfinished run with a different config or different slides is in this folder; "
            "use another --out or pass --no-resume to start over"
        )
    return state


def fit(
    data: MILData,
    config: MILConfig,
    *,
    out_dir: Path,
    device: str | torch.device = "cpu",
    progress: bool = True,
    resume: bool = True,
    on_epoch_end: Callable[[int], None] | None = None,
) -> tuple[torch.nn.Module, dict]:
    """Train with per-epoch checkpoints; returns the model holding the selected epoch's
    weights and a summary (selected epoch, history)."""
    device = torch.device(device)
    model = make_model(config, data).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    if config.scheduler == "cosine":
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.epochs)
    elif config.scheduler == "none":
        scheduler = None
    else:
        raise ConfigError(f"scheduler {config.scheduler!r}: choose cosine or none")
    weights = class_weights(data.train.labels, data.n_classes).to(device)
    history: list[dict] = []
    best_state, best_epoch, start = None, None, 1
    resume_path = out_dir / RESUME_FILE
    state = _load_resume(resume_path, config=config, data=data) if resume else None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(state["scheduler"])
        history, best_state, best_epoch = state["history"], state["best_state"], state["best_epoch"]
        start = state["epoch"] + 1
    per_epoch = data.evaluated if config.eval_each_epoch == "all" else data.evaluated[:1]
    for epoch in range(start, config.epochs + 1):
        loss = train_epoch(model, optimizer, cohort=data.train, config=config, weights=weights, epoch=epoch, device=device, progress=progress)
        record = {"epoch": epoch, "train_loss": loss, "lr": optimizer.param_groups[0]["lr"]}
        record.update({c.name: evaluate(model, c, n_classes=data.n_classes, device=device).metrics for c in per_epoch})
        history.append(record)
        if progress:
            from tqdm.auto import tqdm

            shown = ", ".join(f"{c.name} {config.selection_metric} {_fmt(record[c.name][config.selection_metric])}" for c in per_epoch)
            tqdm.write(f"epoch {epoch}/{config.epochs}: train loss {loss:.4f}, {shown}")
        curve = [h["val"][config.selection_metric] for h in history]
        if select_epoch(curve, config.selection, config.selection_window, config.epochs) == epoch - 1:
            best_state, best_epoch = _state_copy(model), epoch
        if scheduler is not None:
            scheduler.step()
        _save(
            {
                "epoch": epoch,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "history": history,
                "best_state": best_state,
                "best_epoch": best_epoch,
                "config": config.to_dict(),
                "data": data.fingerprint(),
            },
            resume_path,
        )
        if on_epoch_end is not None:
            on_epoch_end(epoch)
    fallback = best_state is None
    if fallback:  # no epoch qualified (e.g. validation QWK undefined throughout): keep the last
        best_state, best_epoch = _state_copy(model), config.epochs
    model.load_state_dict(best_state)
    return model, {"selected_epoch": best_epoch, "selection_fallback_to_last": fallback, "history": history}


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
