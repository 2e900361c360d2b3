"""Truncation, the floor every method is compared with: keep the teacher's first K layers
and distil them with the same budget as TWT. Only the final features are matched (there is
no block boundary for the kept layers to hit: layer j already reproduces teacher layer j).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pathtwt.compress.pipeline import CompressOptions, distill_and_export

if TYPE_CHECKING:
    from torch import nn

    from pathtwt.compress.calibration import CalibrationSet
    from pathtwt.models.registry import Backbone


def truncated_student(teacher: Backbone, depth: int) -> nn.Module:
    from pathtwt.compress.student import clone_layers, stitch_student

    return stitch_student(teacher.model, clone_layers(teacher.model, range(depth)), spec=teacher.spec)


def compress(teacher: Backbone, calib: CalibrationSet, options: CompressOptions) -> Path | None:
    """Registry entry (``--method truncation``): the first K layers, distilled, exported."""
    from pathtwt.errors import ConfigError
    from pathtwt.compress.distill import DeepSupervision
    from pathtwt.compress.pipeline import read_plan

    num_layers = len(teacher.model.blocks)
    depth = options.depth
    if options.plan is not None:
        depth = len(read_plan(options.plan, num_layers)["blocks"])  # same depth as the plan's student
    if depth is None or not 1 <= depth <= num_layers:
        raise ConfigError(f"truncation needs --depth between 1 and {num_layers} (or --plan); --eps does not fix a depth")
    student = truncated_student(teacher, depth)
    return distill_and_export(
        teacher, calib, options, method="truncation", student=student, objective=DeepSupervision(None),
        boundaries=list(range(1, depth + 1)), extra={"kept_layers": list(range(1, depth + 1))},
    )
