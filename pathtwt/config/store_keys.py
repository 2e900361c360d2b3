"""Which settings change what a stage makes: the one table the store keys are derived from.

Every key of the config sections that make stored products is classed here:

- ``VALUE``: it changes the values of what the stage makes, so it is one of the inputs of
  that product's store key (tile size, pixel size, precision, a distillation setting);
- ``CONTENT``: it names a file whose content is an input (a slide's ROI GeoJSON, a weights
  file): the content's hash is in the key, not the path;
- ``RUN``: how the job runs, never what it makes (batch size of a forward pass, workers,
  threads, where the slides or labels lie): in no key, so changing it reuses what is stored.

tests/test_store.py checks that every key the schema has in these sections is classed,
so a new setting cannot be forgotten silently: it must be given a class, and a ``VALUE`` one
is in its product's key at once (:func:`values`). A setting that changes values only through
others is classed by what it does to the product's inputs (``calibrate_on`` picks the
calibration slides, whose tiles keys are in the key: ``VALUE``).
"""

from __future__ import annotations

from typing import Any, Mapping

VALUE, CONTENT, RUN = "value", "content", "run"

# schema section (as a path; "*" for each named entry) -> key -> class
SETTINGS: dict[tuple[str, ...], dict[str, str]] = {
    # tiles: the slide (its fingerprint), how it is read and tiled
    ("cohorts", "*"): {
        "slides": RUN, "extensions": RUN, "labels": RUN, "label_column": RUN, "split_column": RUN, "splits": RUN,
        "draw_split": RUN,  # which slides train: in the calibration key through its slide list
        "demo": RUN, "roi": CONTENT, "mpp_fallback": VALUE, "modality": VALUE, "channels": VALUE,
    },
    ("cohorts", "*", "tiling"): {
        "target_mpp": VALUE, "tile_size": VALUE, "tissue": VALUE, "min_tissue": VALUE, "allow_upsample": VALUE,
        "on_failure": RUN,  # a slide that fails has no tiles either way; record or stop is the job's
    },
    # calibration tiles: which slides (their tiles keys, cohort and slide names), how drawn
    ("calibration",): {"n_tiles": VALUE, "holdout": VALUE, "holdout_by": VALUE, "seed": VALUE},
    ("discovery",): {"tokens": VALUE, "depth": VALUE, "eps": VALUE, "batch_size": RUN},
    # a compressed model; cpu_ranks and gpus change how the batches are dealt to ranks (and
    # their random streams), device the precision auto resolves to
    ("compress",): {
        "steps": VALUE, "epochs": VALUE, "batch_size": VALUE, "accumulate": VALUE, "precision": VALUE, "lr": VALUE,
        "warmup_steps": VALUE, "audition_steps": VALUE, "schedule": VALUE, "layer_scale": VALUE, "augment": VALUE,
        "loss_norm": VALUE, "stream": VALUE, "cpu_ranks": VALUE, "gpus": VALUE, "seed": VALUE, "device": VALUE,
        "threads": RUN, "extra_args": VALUE,
        "rank_timeout": RUN,  # how long ranks wait for each other before the job ends
    },
    # features: device and decode change pixels and arithmetic (a GPU decoder's JPEG, auto's bf16)
    ("extract",): {
        "batch_size": RUN, "device": VALUE, "decode": VALUE, "threads": RUN, "on_failure": RUN, "precision": VALUE,
        "embedding": VALUE, "per_slide_jobs": RUN,
    },
    ("backbones", "*"): {"weights": CONTENT, "fallback": VALUE, "calibrate_on": VALUE, "variants": RUN},
    ("variants", "*"): {"method": VALUE, "depth": VALUE, "eps": VALUE, "steps": VALUE, "epochs": VALUE, "options": VALUE},
}


def values(section: tuple[str, ...], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The ``VALUE`` settings of ``section`` (a key of :data:`SETTINGS`) from ``settings``."""
    return {k: settings.get(k) for k, cls in SETTINGS[section].items() if cls == VALUE}
