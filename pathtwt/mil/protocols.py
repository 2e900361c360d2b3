"""Training configuration and the paper's two protocols as presets. Every field can be
overridden from the command line (and so from the workflow config); the merged config
is saved in metrics.json and checked when a run resumes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from pathtwt.mil.heads import DEFAULT_HEAD


@dataclass(frozen=True)
class MILConfig:
    protocol: str = "grading"
    aggregator: str = DEFAULT_HEAD
    seed: int = 0
    epochs: int = 20
    lr: float = 1e-4
    weight_decay: float = 1e-4
    scheduler: str = "cosine"  # cosine annealing over the epochs, stepped once per epoch; or "none"
    accumulation: int = 32  # slides per optimiser step (one slide per forward pass)
    grad_clip: float = 1.0  # max gradient norm; 0 disables clipping
    class_weighted: bool = True  # cross-entropy weighted by inverse training class frequency
    selection: str = "best"  # "best" validation score, or its trailing "moving-average"
    selection_metric: str = "qwk"  # validation metric the selection rule reads
    selection_window: int = 5  # epochs in the moving average
    eval_each_epoch: str = "val"  # cohorts evaluated after every epoch: "val" or "all"
    max_instances: int | None = None  # random tiles per training bag per epoch (None: all)
    hidden_dim: int = 512
    dropout: float | None = None  # None: the head's default (its registry entry's dropout)
    heads: int = 8  # TransMIL attention heads
    landmarks: int | None = None  # TransMIL Nystrom landmarks (None: hidden_dim // 2)
    n_classes: int | None = None  # None: from the label table (max label + 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PROTOCOLS: dict[str, MILConfig] = {
    # PANDA-style grading: keep the checkpoint with the best validation QWK, then test it
    "grading": MILConfig(protocol="grading", epochs=20, selection="best", selection_metric="qwk", eval_each_epoch="val"),
    # CAMELYON-style metastasis: evaluate everything every epoch, select by the 5-epoch
    # moving average of validation accuracy, report that epoch's test/external accuracy
    "metastasis": MILConfig(
        protocol="metastasis", epochs=100, selection="moving-average", selection_metric="accuracy", eval_each_epoch="all"
    ),
}

OVERRIDABLE = tuple(f.name for f in fields(MILConfig) if f.name != "protocol")


def make_config(protocol: str, **overrides: Any) -> MILConfig:
    """The protocol's preset with the given fields replaced (``None`` values are treated
    as "not given", except for fields whose default is None)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose one of {tuple(PROTOCOLS)}")
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    if unknown:
        raise ValueError(f"unknown MIL config field(s) {unknown}")
    return replace(PROTOCOLS[protocol], **{k: v for k, v in overrides.items() if v is not None})
