"""The results tree between the stages, written once: the workflow's rules, the config
checks and the report read these names and paths from here.

Every study has a results folder of its own, ``results/{study}`` (:func:`study_results`),
and its logs lie in ``logs/{study}``: studies run one after the other in one checkout
never mix into nor overwrite each other. The templates below are relative to a study's
results folder and formatted with ``str.format`` (or used as Snakemake wildcard patterns
as they are)."""

from __future__ import annotations

# Variant names with a fixed meaning. UNCOMPRESSED: the teacher itself (a config variant of
# method none, added under this name to the probes when no configured variant is the
# teacher). RANDOM_INIT: the teacher's architecture with random weights, the floor row
# (both a reserved config variant name and a method).
UNCOMPRESSED = "uncompressed"
RANDOM_INIT = "random-init"

TILES = "tiles/{cohort}/{slide}.h5"
LABELS = "labels/{cohort}.csv"
MODEL_DIR = "models/{backbone}/{variant}"
DISCOVERY_DIR = "discovery/{backbone}"
# a cohort's features folder (one {slide}.h5 per slide)
FEATURES_DIR = "features/{backbone}/{variant}/{cohort}"
# a MIL run folder; of test fold {fold} in a cross-validated task (pathtwt.mil.layout.run_dir
# chooses between them)
MIL_RUN_DIR = "mil/{backbone}/{variant}/{task}/{head}/seed{seed}"
MIL_FOLD_RUN_DIR = "mil/{backbone}/{variant}/{task}/{head}/fold{fold}/seed{seed}"
PROBE_RESULT = "probes/{backbone}/{variant}/{probe}/probe.json"


def study_results(study: str) -> str:
    """A study's results folder, relative to the working directory."""
    return f"results/{study}"


def study_logs(study: str) -> str:
    """A study's log folder, relative to the working directory."""
    return f"logs/{study}"
