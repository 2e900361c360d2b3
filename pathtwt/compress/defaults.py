"""The compression defaults, written here once: ``pathtwt compress``'s flags, the option
dataclasses (:class:`~pathtwt.compress.distill.DistillOptions`,
:class:`~pathtwt.compress.pipeline.CompressOptions`) and the workflow schema's ``compress``
section read them (tests/test_stage_defaults.py compares all four).

Three values were once written differently in different places; the one kept, and why:

- ``batch_size`` 32 (the workflow said 64): the CLI's value, which every shipped config
  overrides anyway; 32 tiles of a ViT-B fit a small GPU and a CPU job's memory.
- the budget: one epoch over the training tiles when neither ``steps`` nor ``epochs`` is
  given (the workflow said 2000 steps): a budget in epochs scales with the cohort, a fixed
  step count does not, and the same config now distils the same through either route.
- ``loss_norm`` "variance" (DistillOptions said "none"): what the CLI and the workflow
  always passed, chosen on BACH validation images (benchmarks/studies/results/bach_recipe.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CompressDefaults:
    steps: int | None = None  # optimiser steps; None (and epochs None): one epoch
    epochs: float | None = None  # passes over the training tiles; None (and steps None): one epoch
    batch_size: int = 32  # global micro-batch, split over the data-parallel ranks
    accumulate: int = 1  # micro-batches per optimiser step (effective batch = batch_size x accumulate)
    lr: float = 3e-4  # peak learning rate (the paper's)
    warmup_steps: int = 0  # linear warm-up before the cosine decay
    precision: str = "auto"  # autocast request; auto: bf16 where the device has native bf16
    augment: bool = True  # colour jitter + Gaussian blur; off lets the teacher's targets be cached
    loss_norm: str = "variance"  # each loss term over its teacher target's variance; "none": plain MSE
    seed: int = 0
    audition_steps: int = 50  # fitting steps per audition candidate (0: rank them as they are)
    schedule: bool | None = None  # staggered loss-weight ramp; None: off for pathology backbones, else on
    layer_scale: bool | None = None  # learnable scalar per surrogate branch; None: as schedule
    init: str = "audition"  # surrogate initialisation: audition | random (ablation)
    tokens: str = "all"  # token mode of the similarity matrix when compress discovers itself
    holdout: float = 0.1  # share of the drawn calibration tiles kept out of fitting (half select, half report)
    checkpoint_every: int = 100  # optimiser steps between distillation checkpoints
    # minutes a data-parallel rank waits for the others in a collective before the job ends
    # (torch's own default for a GPU run's group is 30): longer than any rank's work alone
    rank_timeout: float = 10.0


COMPRESS_DEFAULTS = CompressDefaults()
