"""Loss-weight and learning-rate schedules of the distillation, as pure functions of the step.

Staggered cosine ramp (deep supervision): term j (block j = 1..K, then the final features
as term K+1) has weight ``w_j(t) = (1 - cos(pi t / alpha_j)) / 2`` for ``t < alpha_j`` and 1
afterwards, so each boundary starts contributing smoothly and shallow blocks first.

Default activation times: ``alpha_j = T * (0.1 + 0.4 (j - 1) / K)`` for a budget of T steps,
i.e. the first block is fully on after 10 % of the budget and the final features after
50 %; the remaining half of the budget trains with every term at full weight. Being pure
functions of the step, both schedules resume exactly from a checkpoint.
"""

from __future__ import annotations

import math
from typing import Sequence

FIRST_ACTIVATION = 0.1  # fraction of the budget at which block 1 reaches full weight
LAST_ACTIVATION = 0.5  # fraction at which the final-feature term reaches full weight


def ramp_weight(step: int | float, alpha: float) -> float:
    """``(1 - cos(pi t / alpha)) / 2`` for ``t < alpha``, then 1 (alpha <= 0: always 1)."""
    if alpha <= 0 or step >= alpha:
        return 1.0
    return 0.5 * (1.0 - math.cos(math.pi * float(step) / float(alpha)))


def default_alphas(num_terms: int, total_steps: int) -> list[float]:
    """Activation steps for ``num_terms`` loss terms (K blocks + final features), shallow first."""
    if num_terms <= 0:
        return []
    k = max(num_terms - 1, 1)
    return [total_steps * (FIRST_ACTIVATION + (LAST_ACTIVATION - FIRST_ACTIVATION) * j / k) for j in range(num_terms)]


def term_weights(step: int, alphas: Sequence[float] | None, num_terms: int) -> list[float]:
    """Weights of every loss term at ``step``; all ones when the schedule is off (``alphas`` None)."""
    if alphas is None:
        return [1.0] * num_terms
    if len(alphas) != num_terms:
        raise ValueError(f"{len(alphas)} activation times for {num_terms} loss terms")
    return [ramp_weight(step, a) for a in alphas]


def cosine_lr_factor(step: int, total_steps: int, warmup_steps: int = 0, floor: float = 0.0) -> float:
    """Multiplier of the peak learning rate: linear warm-up, then cosine decay to ``floor``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
