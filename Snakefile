# pathtwt workflow: slides -> tiles -> calibration -> discovery -> compressed backbones
# -> tile features -> MIL heads -> report. This file only wires; the rules and their
# get_* helpers live in workflow/rules/, every step is a `pathtwt` subcommand. Tiles,
# calibration, discovery, models and features are entries of the store (store.smk), made
# only when it does not hold them; a study's folder keeps its labels, MIL runs and report.
from snakemake.utils import min_version

min_version("9.0")  # the tested major (pyproject.toml, workflow/rules/snakemake_internals.smk)


# The demo config is the default. A study config given with --configfile replaces it
# rather than being merged into it (a merge would mix the demo cohorts into the study).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


# The config is validated once, in workflow/rules/common.smk, by pathtwt's own checker
# (the schema shipped in pathtwt/config/schema.yaml, plus the checks a schema cannot
# express), the same code `pathtwt check-config` runs.


report: "workflow/report/workflow.rst"


# With --software-deployment-method apptainer every job runs in this image (e.g. the
# LUMI image built from workflow/envs/pathtwt-lumi.def); unset, jobs use --use-conda's
# environment or the current one.
if config.get("container"):

    container: config["container"]



include: "workflow/rules/common.smk"
include: "workflow/rules/store.smk"
include: "workflow/rules/views.smk"
include: "workflow/rules/demo.smk"
include: "workflow/rules/tiling.smk"
include: "workflow/rules/compress.smk"
include: "workflow/rules/extract.smk"
include: "workflow/rules/mil.smk"
include: "workflow/rules/probe.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        get_final_targets(),
    default_target: True
