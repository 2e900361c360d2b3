"""The MIL slide heads, one entry each in :data:`HEADS`: what ``train-mil --aggregator``
offers, what the config's ``mil.heads`` accepts (the schema's enum is filled from here),
the ``{head}`` component of a run folder, what the workflow trains and draws heatmaps for,
and how a checkpoint's head is rebuilt. Adding a head is its module plus one entry here.

Torch-free, because Snakemake and the config schema read it at parse time: a head's code
is named as "module:function" and imported only when the head is built or fitted.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class MILHead:
    name: str  # --aggregator, mil.heads, the run folder's {head}, a checkpoint's "aggregator"
    display: str  # the head's name in prose (help lines)
    summary: str  # one line for --aggregator's help and the config reference
    # "module:function" returning the torch module, called with in_dim, n_classes,
    # hidden_dim, dropout, heads, landmarks; the module maps a bag (N, D) to (logits, attention).
    # None for a head fitted outside the epoch loop (``fit``).
    build: str | None = None
    # "module:function" (MILData, MILConfig) -> (checkpoint state, summary, probabilities of
    # every evaluated cohort), for a head fitted in one go instead of by the epoch loop
    fit: str | None = None
    dropout: float | None = None  # the built module's dropout when the config leaves it to the head
    # what its per-tile score is, as a heatmap caption; None: no per-tile attention, so no heatmap
    attention: str | None = None
    # the epoch-selection rule metrics.json reports instead of the protocol's (None: the protocol's)
    selection: str | None = None
    in_workflow_default: bool = False  # trained by the workflow when the config does not set mil.heads

    def __post_init__(self) -> None:
        if (self.build is None) == (self.fit is None):
            raise ValueError(f"MIL head {self.name!r}: give exactly one of build (a torch module) and fit")

    @property
    def fitter(self) -> Callable[..., Any] | None:
        return None if self.fit is None else _resolve(self.fit)


ABMIL = MILHead(
    name="abmil", display="ABMIL", summary="gated attention pooling (Ilse et al., 2018)",
    build="pathtwt.mil.models:build_abmil", dropout=0.25,
    attention="ABMIL gated attention weights (softmax over the slide's tiles)", in_workflow_default=True,
)
TRANSMIL = MILHead(
    name="transmil", display="TransMIL", summary="Nystrom-attention transformer with a class token (Shao et al., 2021)",
    build="pathtwt.mil.models:build_transmil", dropout=0.1,
    attention="TransMIL class-token attention row of the first Nystrom layer, mean over heads", in_workflow_default=True,
)
MEANPOOL = MILHead(
    name="meanpool", display="meanpool",
    summary="logistic regression on the standardised mean tile embedding, its C chosen on the validation slides "
    "(the floor an attention head should beat)",
    fit="pathtwt.mil.meanpool:fit_meanpool", selection="best C",
)

HEADS: tuple[MILHead, ...] = (ABMIL, TRANSMIL, MEANPOOL)
DEFAULT_HEAD = ABMIL.name  # train-mil's --aggregator default
_BY_NAME = {h.name: h for h in HEADS}


def names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def attention_names() -> tuple[str, ...]:
    """The heads with per-tile attention: those a heatmap can be drawn for."""
    return tuple(h.name for h in HEADS if h.attention is not None)


def workflow_default() -> list[str]:
    return [h.name for h in HEADS if h.in_workflow_default]


def get_head(name: str) -> MILHead:
    head = _BY_NAME.get(name)
    if head is None:
        raise ValueError(f"unknown aggregator {name!r}; choose one of {names()}")
    return head


def has_attention(name: str) -> bool:
    head = _BY_NAME.get(name)
    return head is not None and head.attention is not None


def wildcard_pattern() -> str:
    """The regular expression of the workflow's {head} wildcard."""
    return "|".join(re.escape(n) for n in names())


def display_list() -> str:
    """"ABMIL, TransMIL or meanpool", for help lines."""
    shown = [h.display for h in HEADS]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def summaries() -> str:
    """"abmil: ...; transmil: ...", each head's one line."""
    return "; ".join(f"{h.name}: {h.summary}" for h in HEADS)


def default_dropouts() -> str:
    """"ABMIL 0.25, TransMIL 0.1": the dropout each built head takes when none is given."""
    return ", ".join(f"{h.display} {h.dropout:g}" for h in HEADS if h.dropout is not None)


def build_head(aggregator: str, *, in_dim: int, n_classes: int, hidden_dim: int, dropout: float, heads: int = 8,
               landmarks: int | None = None):
    """The torch module of ``aggregator`` (a head with ``build``); a ValueError names the
    buildable heads otherwise."""
    head = _BY_NAME.get(aggregator)
    if head is None or head.build is None:
        buildable = tuple(h.name for h in HEADS if h.build is not None)
        raise ValueError(f"unknown aggregator {aggregator!r}; choose one of {buildable}")
    return _resolve(head.build)(in_dim=in_dim, n_classes=n_classes, hidden_dim=hidden_dim, dropout=dropout,
                                heads=heads, landmarks=landmarks)


def is_buildable(name: str) -> bool:
    head = _BY_NAME.get(name)
    return head is not None and head.build is not None


def _resolve(target: str) -> Callable[..., Any]:
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)
