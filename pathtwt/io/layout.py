"""The results tree between the stages, written once: the workflow's rules, the config
checks and the report read these names and paths from here.

Paths are relative to the working directory and formatted with ``str.format`` (or used as
Snakemake wildcard patterns as they are)."""

from __future__ import annotations

# Variant names with a fixed meaning. UNCOMPRESSED: the teacher itself (a config variant of
# method none, added under this name to the probes when no configured variant is the
# teacher). RANDOM_INIT: the teacher's architecture with random weights, the floor row
# (both a reserved config variant name and a method).
UNCOMPRESSED = "uncompressed"
RANDOM_INIT = "random-init"

TILES = "results/tiles/{cohort}/{slide}.h5"
LABELS = "results/labels/{cohort}.csv"
MODEL_DIR = "results/models/{backbone}/{variant}"
DISCOVERY_DIR = "results/discovery/{backbone}"
# a cohort's features folder (one {slide}.h5 per slide)
FEATURES_DIR = "results/features/{backbone}/{variant}/{cohort}"
# a MIL run folder; of test fold {fold} in a cross-validated task (pathtwt.mil.layout.run_dir
# chooses between them)
MIL_RUN_DIR = "results/mil/{backbone}/{variant}/{task}/{head}/seed{seed}"
MIL_FOLD_RUN_DIR = "results/mil/{backbone}/{variant}/{task}/{head}/fold{fold}/seed{seed}"
PROBE_RESULT = "results/probes/{backbone}/{variant}/{probe}/probe.json"
