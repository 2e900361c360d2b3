"""A slide head applied to one bag of tile features: the class probabilities and the
per-tile score a heatmap shows.

The per-tile score is the head's own attention (:mod:`pathtwt.mil.models`), captioned by
its registry entry's ``attention`` line (:mod:`pathtwt.mil.heads`):

- ABMIL: the gated attention weights, a softmax over the slide's tiles (they sum to 1);
- TransMIL: the class token's attention row over the tiles in the *first* Nystrom layer,
  as the approximation applies it, averaged over heads (the layer where the class token
  gathers from the tiles; after the PPEG and by the second layer its row mixes the
  slide summary). Not a rollout through both layers: one documented row, cheap for any
  bag size. Being an approximation, single scores can be slightly negative.

A head without per-tile attention (a mean-pooling linear head) has no heatmap: asked
for one, it is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pathtwt.errors import PathtwtError
from pathtwt.explain.runs import TrainedHead
from pathtwt.mil import heads as mil_heads

# head name -> what its per-tile score is, for the heatmap and montage captions
ATTRIBUTION = {h.name: h.attention for h in mil_heads.HEADS if h.attention is not None}


@dataclass
class SlideScores:
    probs: np.ndarray  # (C,) float64
    attention: np.ndarray  # (N,) float32

    @property
    def predicted(self) -> int:
        return int(np.argmax(self.probs))


def _check_head(head: TrainedHead, what: str) -> None:
    if head.model is None:
        raise PathtwtError(
            f"--run {head.run_dir}: a {head.aggregator} head {what}; this command handles "
            + ", ".join(sorted(ATTRIBUTION)) + " heads"
        )


@torch.inference_mode()
def score_bag(head: TrainedHead, features: np.ndarray) -> SlideScores:
    """Probabilities and per-tile attention of ``head`` on one bag (N, D)."""
    _check_head(head, "cannot be run here")
    if len(features) == 0:
        raise PathtwtError("a slide without tiles has no prediction")
    param = next(head.model.parameters())
    x = torch.as_tensor(np.ascontiguousarray(features, dtype=np.float32)).to(param.device)
    logits, attention = head.model(x)
    probs = torch.softmax(logits.double(), dim=-1)[0].cpu().numpy()
    return SlideScores(probs=probs, attention=attention.float().cpu().numpy())


def attention_for_heatmap(head: TrainedHead, features: np.ndarray) -> SlideScores:
    """:func:`score_bag`, refusing in one line a head that has no per-tile attention."""
    if not head.has_attention:
        raise PathtwtError(
            f"--run {head.run_dir}: a {head.aggregator} head has no per-tile attention, so no heatmap; "
            f"give a run of a head with attention ({' or '.join(mil_heads.attention_names())})"
        )
    return score_bag(head, features)
