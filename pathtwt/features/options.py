"""The options of an extraction job: one object, and the defaults written here once.

``pathtwt extract``'s flags, :class:`ExtractOptions` and the workflow schema's ``extract``
section read :data:`EXTRACT_DEFAULTS` (the schema's defaults are filled in from it when it
is loaded, :func:`pathtwt.config.check.stage_defaults`; tests/test_stage_defaults.py
compares all three).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pathtwt.models.defaults import FORWARD_BATCH_SIZE
from pathtwt.models.precision import INFERENCE_REQUESTS
from pathtwt.models.recipes import DEFAULT_RECIPE


@dataclass(frozen=True)
class ExtractDefaults:
    # tiles per forward pass; None: FORWARD_BATCH_SIZE on a CPU, sized from a GPU's memory
    # there (pathtwt.devices.forward_batch_size)
    batch_size: int | None = None
    # auto: the GPU decodes where the model runs on CUDA and a GPU decoder is installed
    decode: str = "auto"
    device: str = "auto"
    # auto: bf16 autocast where the device has it natively and the first tiles agree with fp32
    # (pathtwt.models.precision); the choices are INFERENCE_REQUESTS
    precision: str = INFERENCE_REQUESTS[0]
    embedding: str = DEFAULT_RECIPE  # the tile embedding (pathtwt.models.recipes.RECIPES)


EXTRACT_DEFAULTS = ExtractDefaults()


@dataclass(frozen=True)
class ExtractOptions:
    """How a job runs (not which slides: those are its :class:`~pathtwt.features.jobs.ExtractJob`)."""

    batch_size: int | None = EXTRACT_DEFAULTS.batch_size
    workers: int | None = None  # reading processes; None: pathtwt.devices.reading_workers
    decode: str = EXTRACT_DEFAULTS.decode  # the request; resolved once when the job starts
    embedding: str = EXTRACT_DEFAULTS.embedding
    progress: bool = True
    skip_existing: bool = False
    failures: Path | None = None  # this job's failures table; None: the first failure stops the job
    force: bool = False  # skip the slide-fingerprint check
    bf16_autocast: bool = False  # check bf16 autocast on the first tiles (precision auto)
    # the GPU decoder (pathtwt.features.gpu_decoders.GPU_DECODERS's key) instead of the first
    # one installed: "host" drives the GPU path on a CPU (tests, benchmarks)
    gpu_decoder: str | None = None

    @classmethod
    def of(cls, options: "ExtractOptions | None" = None, **overrides: Any) -> "ExtractOptions":
        base = options or cls()
        if overrides.get("failures") is not None:
            overrides["failures"] = Path(overrides["failures"])
        return replace(base, **overrides)

    def resolved_batch_size(self, device: Any) -> int:
        from pathtwt.devices import forward_batch_size

        return int(self.batch_size) if self.batch_size else forward_batch_size(device, FORWARD_BATCH_SIZE)
