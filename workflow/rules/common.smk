# Helpers shared by the rules: which slides, splits, backbones and variants the config
# asks for, and the paths between stages. Every helper the rules call is named get_*.
#
# Command lines are built from argument lists: a get_*_args helper returns a list, and the
# rules paste every path, wildcard and list with Snakemake's `:q`, which quotes each word.
# A slide file named `2017-02-27 15.22.39 (387).ndpi` or `x;touch PWNED;y.jpeg` reaches its
# command as one argument, never as shell syntax; a positional slide path follows `--`,
# so a name starting with `-` is not read as an option.
import os
import shlex
import subprocess
import sys
from pathlib import Path

from pathtwt.compress.registry import PAPER_METHOD, goal_of
from pathtwt.config import check as config_check
from pathtwt.config.products import StudyProducts
from pathtwt.config.slide_reads import cache_root
from pathtwt.config.extra_args import extra_args_command
from pathtwt.errors import ConfigError
from pathtwt.io import layout
from pathtwt.io.layout import RANDOM_INIT, UNCOMPRESSED
from pathtwt.mil import heads as mil_heads
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger


# Rules call the `pathtwt` console script. Snakemake started as .venv/bin/snakemake
# (without activating the venv) would otherwise not find it on PATH, or find another
# installation; the interpreter's own bin folder is where pip put it. Under
# --use-conda the job's environment prepends its own bin folder, which wins.
os.environ.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
# HDF5 file locking fails on some network filesystems (Lustre, NFS); every file here is
# written once under a temporary name and renamed, so the lock adds nothing.
os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")

# Errors name the config file(s) actually read: --configfile FILE replaces the demo config.
CONFIG_SOURCE = " + ".join(str(f) for f in (workflow.overwrite_configfiles or ["config/config.yaml"])) + (
    " (with --config overrides)" if workflow.config_settings.overwrite_config else ""
)

# The one validation of the config: the package's schema with its defaults filled in
# (deep copies, so no two cohorts share a default dict), then the checks the schema
# cannot express. Snakemake's own `validate` is not called as well.
try:
    config.update(config_check.validate_schema(config, source=CONFIG_SOURCE))
    config["study"] = config_check.study_name(config, workflow.overwrite_configfiles or ["config/config.yaml"])
    LABEL_TABLES = config_check.check_config(config, source=CONFIG_SOURCE)
except ConfigError as exc:
    # A bad config is the user's to fix, not a workflow bug: its message alone, without the
    # traceback frame Snakemake prints for a WorkflowError raised here.
    print(f"Error: {exc}", file=sys.stderr)
    sys.exit(1)
# Every output of the study lies in its own results folder, named by the config's `study`
# (default: the config file's name), and its logs in its own log folder: a second study
# run in this checkout never mixes into nor overwrites the first. Rules name their files
# with study_path() and study_log().
STUDY = config["study"]
RESULTS = layout.study_results(STUDY)
LOGS = layout.study_logs(STUDY)


def study_path(path):
    """``path`` (a file or pattern relative to a study's results) in this study's results."""
    return f"{RESULTS}/{path}"


def study_log(path):
    """``path`` (relative) in this study's log folder."""
    return f"{LOGS}/{path}"


# extra_args are flags of the command line, whose parsers the workflow does not import:
# the command checks them, only for a config that has some.
if extra_args_command(config, source=CONFIG_SOURCE):
    _checked = subprocess.run(extra_args_command(config, source=CONFIG_SOURCE), capture_output=True, text=True)
    if _checked.returncode != 0:
        print(f"Error: {_checked.stderr.strip().removeprefix('pathtwt check-config: error: ')}", file=sys.stderr)
        sys.exit(1)

# The rules that declare a GPU and the config section whose `device` they run on.
GPU_RULE_DEVICES = {
    "discover": "compress", "compress": "compress", "analyze_norms": "compress", "analyze_intrinsic_dim": "compress",
    "analyze_stability": "compress", "extract": "extract", "probe": "extract", "train_mil": "mil",
    "train_mil_fold": "mil",
}


def get_rule_device(name):
    """The `device` of the GPU rule `name`, from its config section (named once in GPU_RULE_DEVICES)."""
    return config[GPU_RULE_DEVICES[name]]["device"]


include: "snakemake_internals.smk"


keep_cpu_stages_off_gpus(GPU_RULE_DEVICES)
check_local_gpus()  # first: a local run's GPU limit, which give_compress_its_gpus reads
give_compress_its_gpus()


onstart:
    wake_local_scheduler_on_job_events_only()
    run_bookkeeping_jobs_in_process()


# slides fingerprinted after the plan was made (a demo cohort, once its checkpoint wrote it)
# are kept for the next plan as well
onsuccess:
    PRODUCTS.fingerprints.save()

# The jobs' environment under --use-conda (relative to workflow/rules/, where the rules are).
CONDA_ENV = f"../envs/{config['conda_env']}.yaml"


def _jobs_software():
    """Where the jobs' torch comes from, in words: the image, the conda env, or this environment."""
    methods = {str(m).rsplit(".", 1)[-1].lower() for m in getattr(workflow.deployment_settings, "deployment_method", ())}
    if "apptainer" in methods and config.get("container"):
        return f"the image {config['container']}"
    if "conda" in methods:
        return f"workflow/envs/{config['conda_env']}.yaml"
    return f"this environment (with --use-conda: workflow/envs/{config['conda_env']}.yaml)"


if not workflow.remote_exec:
    logger.info(f"pathtwt workflow: jobs run in {_jobs_software()}")


wildcard_constraints:
    cohort=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    slide=r"[^/]+",
    backbone=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    variant=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    task=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    head=mil_heads.wildcard_pattern(),
    seed=r"\d+",
    fold=r"\d+",
    probe=r"[A-Za-z0-9][A-Za-z0-9_.-]*",


DEMO_COHORTS = [c for c, cfg in config["cohorts"].items() if cfg["demo"]]


def get_demo_labels():
    """Label tables the demo rule writes (one per demo cohort)."""
    return [str(config_check.resolve(config, config["cohorts"][c]["labels"])) for c in DEMO_COHORTS]


def get_demo_data():
    """Where the demo cohorts are written (by `pathtwt demo make-slides`), read from where
    the config puts their folders, e.g. the demo config's results/demo/demo_data."""
    folders = sorted({str(Path(p).parent.parent) for p in get_demo_labels()})
    if len(folders) != 1:
        raise WorkflowError(f"{CONFIG_SOURCE}: the demo cohorts' label tables lie in {len(folders)} folders "
                            f"({', '.join(folders)}); put every demo cohort under one folder, as config/config.yaml does")
    return folders[0]


def _cohort_table(cohort):
    # A demo cohort exists only once the demo checkpoint has run: asking for it before
    # makes Snakemake schedule the checkpoint and re-evaluate this helper afterwards.
    if cohort not in LABEL_TABLES:
        checkpoints.demo_slides.get()
        try:
            table = config_check.cohort_label_table(config, cohort)
            config_check.check_slides_on_disk(config, cohort, table)
        except ConfigError as exc:
            raise WorkflowError(str(exc)) from None
        LABEL_TABLES[cohort] = table
    return LABEL_TABLES[cohort]


_SLIDE_PATHS = {}


def get_slide_paths(cohort):
    """slide_id -> slide file, for every labelled slide of the cohort."""
    if cohort not in _SLIDE_PATHS:
        table = _cohort_table(cohort)
        _SLIDE_PATHS[cohort] = config_check.check_slides_on_disk(config, cohort, table)
    return _SLIDE_PATHS[cohort]


def get_slide_ids(cohort, split=None):
    table = _cohort_table(cohort)
    return list(table.slide_ids) if split is None else table.ids_in_split(split)


def get_slide(wildcards):
    return str(get_slide_paths(wildcards.cohort)[wildcards.slide])


def get_tiling(cohort):
    return config["cohorts"][cohort]["tiling"]


def get_mpp_fallback_arg(wildcards):
    value = config["cohorts"][wildcards.cohort]["mpp_fallback"]
    return [] if value is None else ["--slide-mpp", str(value)]


def get_modality_args(wildcards):
    """--modality/--channels/--allow-upsample/--on-failure of a cohort for `pathtwt tile` ([] for the defaults)."""
    cohort = config["cohorts"][wildcards.cohort]
    args = []
    if cohort.get("modality", "brightfield") != "brightfield":
        args += ["--modality", cohort["modality"]]
    if cohort.get("channels"):
        args += ["--channels", ",".join(str(int(c)) for c in cohort["channels"])]
    if get_tiling(wildcards.cohort).get("allow_upsample"):
        args.append("--allow-upsample")
    if get_tiling(wildcards.cohort).get("on_failure", "stop") != "stop":
        args += ["--on-failure", get_tiling(wildcards.cohort)["on_failure"]]
    return args


def get_labels_command(wildcards, input, output):
    """The `pathtwt` command (a word list) that writes labels/{cohort}.csv: a seeded split
    drawn per class (`draw_split`, or every slide in test for an external cohort without a
    split column), else the cohort's own split column checked and normalised."""
    cohort = config["cohorts"][wildcards.cohort]
    draw = config_check.split_draw(config, wildcards.cohort)
    if draw:
        return ["pathtwt", "labels", "split", "--label-column", cohort["label_column"], *get_draw_args(draw),
                "--seed", str(draw["seed"]), "--out", str(output), "--", input.table]
    return ["pathtwt", "check-config", "--label-table", input.table, "--label-column", cohort["label_column"],
            "--split-column", cohort["split_column"], "--splits", *cohort["splits"], *get_split_renames(wildcards),
            "--write-labels", str(output)]


def get_split_renames(wildcards):
    """`pathtwt train-mil` knows the splits as train/val/test: rename the cohort's own
    split names as the (first) task training on this cohort defines them."""
    for task in config["tasks"].values():
        if task["cohort"] == wildcards.cohort:
            pairs = [(task["train_split"], "train"), (task["val_split"], "val"), (task["test_split"], "test")]
            return [word for old, new in pairs if old != new for word in ("--rename-split", f"{old}={new}")]
    return []


def get_task_cohorts(task):
    """The training cohort first, then the external test cohorts."""
    t = config["tasks"][task]
    return [t["cohort"]] + list(t["external"])


# ---- backbones and variants ---------------------------------------------------------


def _say(line):
    print(line, file=sys.stderr)


# The study's products and their store keys, computed once per slide and model and kept
# (pathtwt.config.products); the store's helpers and its rules are in store.smk.
PRODUCTS = StudyProducts(config, table_of=_cohort_table, slide_paths_of=get_slide_paths, cache=cache_root(), say=_say)
# Backbone name used in paths -> how to build its teacher (a configured weights file that
# is absent, with a `fallback`: that backbone with random weights, said once).
BACKBONES = PRODUCTS.backbones


def get_backbones():
    return list(BACKBONES)


def get_backbone_args(backbone):
    """`pathtwt` arguments that build the teacher of a backbone."""
    b = BACKBONES[backbone]
    if b["random"]:
        return ["--backbone", b["teacher"], "--random-init"]
    return ["--backbone", b["teacher"]] + (["--weights", str(b["weights"])] if b["weights"] else [])


def get_teacher_inputs(wildcards):
    b = BACKBONES[wildcards.backbone]
    return [b["weights"]] if b["weights"] else []


def get_weights_check_args(wildcards):
    """`pathtwt store make --check-weights` for a teacher with a weights file: a file replaced
    between the plan and the job is refused, not made into an entry of the old key."""
    b = BACKBONES[wildcards.backbone]
    return ["--check-weights", str(b["weights"])] if b["weights"] else []


def get_variants(backbone):
    """Variant names for a backbone, the uncompressed one included."""
    return PRODUCTS.variants(backbone)


def get_compressed_variants(backbone):
    return PRODUCTS.compressed_variants(backbone)


def get_variant(wildcards):
    return config["variants"][wildcards.variant]


def get_model_dir(backbone, variant):
    """A compressed variant's model: its entry in the store."""
    return str(STORE.model(PRODUCTS.model_key(backbone, variant)))


def get_features_dir(backbone, variant, cohort):
    """A cohort's features folder (one {slide}.h5 per slide)."""
    return study_path(layout.FEATURES_DIR.format(backbone=backbone, variant=variant, cohort=cohort))


def _variant_kind(variant):
    return PRODUCTS.variant_kind(variant)


def get_model_args(wildcards):
    """`pathtwt extract` / `pathtwt probe` arguments that build a backbone variant."""
    kind = _variant_kind(wildcards.variant)
    if kind == RANDOM_INIT:
        return ["--backbone", BACKBONES[wildcards.backbone]["teacher"], "--random-init"]
    if kind == "teacher":
        return get_backbone_args(wildcards.backbone)
    return ["--backbone", get_model_dir(wildcards.backbone, wildcards.variant)]


def get_model_inputs(wildcards):
    """The files a backbone variant is built from (none for random weights)."""
    kind = _variant_kind(wildcards.variant)
    if kind == RANDOM_INIT:
        return []
    if kind == "teacher":
        return get_teacher_inputs(wildcards)
    return [f"{get_model_dir(wildcards.backbone, wildcards.variant)}/model.json"]


# one extraction job embeds one slide (extract.per_slide_jobs) or a whole cohort's missing
# slides through its manifest (store.smk); its failures reach the cohort's failures table
# through each slide's entry (features/{backbone}/{variant}/{cohort} views, store.smk).
PER_SLIDE_EXTRACT = config["extract"]["per_slide_jobs"]
RECORD_FAILURES = config["extract"]["on_failure"] == "record"


def get_failure_summaries():
    """The failures table of every extracted (backbone, variant, cohort)."""
    if not RECORD_FAILURES:
        return []
    cohorts = list(dict.fromkeys(c for task in config["tasks"] for c in get_task_cohorts(task)))
    return [study_path(f"failures/{b}/{v}/{c}.tsv") for b in get_backbones() for v in get_variants(b) for c in cohorts]


def get_workers(wildcards, threads):
    """Tile-reading processes of an extraction job: its cores but the main process."""
    return max(1, threads - 1)


def get_discover_goal_args(wildcards):
    depth, eps = PRODUCTS.discovery_goal(wildcards.backbone)
    return ["--depth", str(depth)] if depth is not None else ["--eps", str(eps)]


def get_compress_target_args(wildcards):
    """A TWT variant whose depth (or eps) is the one discovery partitioned for reuses
    that plan (no second similarity pass over the calibration tiles); others give their
    depth or eps and `pathtwt compress` partitions the similarity matrix itself."""
    v = get_variant(wildcards)
    if PRODUCTS.uses_plan(wildcards.backbone, wildcards.variant):
        return ["--plan", f"{STORE.discovery(PRODUCTS.discovery_key(wildcards.backbone))}/plan.json"]
    if goal_of(v["method"]) == "none":  # every layer kept (NOSE: attention removed)
        return []
    return ["--depth", str(v["depth"])] if v["depth"] is not None else ["--eps", str(v["eps"])]


def get_compress_budget_args(wildcards):
    """The distillation budget: the variant's steps or epochs, else compress.epochs, else
    compress.steps, else none (`pathtwt compress` distils one epoch)."""
    v, c = get_variant(wildcards), config["compress"]
    if v["steps"] is not None:
        return ["--steps", str(v["steps"])]
    if v["epochs"] is not None:
        return ["--epochs", str(v["epochs"])]
    if c["epochs"] is not None:
        return ["--epochs", str(c["epochs"])]
    return ["--steps", str(c["steps"])] if c["steps"] is not None else []


def get_compress_settings_args(wildcards):
    """The compress section's distillation settings as `pathtwt compress` flags (a key
    left null, e.g. schedule, is left to the command's own default), and the
    discovery tokens for a job that partitions the similarity matrix itself."""
    c = config["compress"]
    flags = {"batch_size": c["batch_size"], "accumulate": c["accumulate"], "precision": c["precision"],
             "seed": c["seed"], "lr": c["lr"], "warmup_steps": c["warmup_steps"],
             "audition_steps": c["audition_steps"], "schedule": c["schedule"], "layer_scale": c["layer_scale"],
             "augment": c["augment"], "loss_norm": c["loss_norm"], "tokens": config["discovery"]["tokens"],
             "rank_timeout": c["rank_timeout"]}
    return [
        word for key, value in flags.items() if value is not None
        for word in (f"--{key.replace('_', '-')}", ("on" if value else "off") if isinstance(value, bool) else str(value))
    ]


def get_compress_stream_args(wildcards):
    """Stream the training tiles from the calibration cohort's coords (compress.stream)."""
    if not config["compress"]["stream"]:
        return []
    return ["--train-coords", get_calibration_listing(PRODUCTS.calibration_key(wildcards.backbone))]


def get_compress_extra_args(wildcards):
    """The variant's method settings (`--option KEY=VALUE`) and compress.extra_args."""
    options = get_variant(wildcards)["options"] or {}
    pairs = [word for k, v in sorted(options.items())
             for word in ("--option", f"{k}={str(v).lower() if isinstance(v, bool) else v}")]
    return pairs + get_extra_args("compress")


def get_extra_args(section):
    """A section's extra_args: a shell word list (checked by pathtwt.config.extra_args), as its words."""
    return shlex.split(config[section]["extra_args"] or "")


# ---- stage paths --------------------------------------------------------------------


def write_file_list(files, out):
    """One path per line: long lists go to commands through a file, since a single
    shell command line is limited to 128 KiB on Linux."""
    from pathtwt.io.atomic import write_text_atomic

    write_text_atomic(out, "".join(f"{f}\n" for f in files))


def get_features(backbone, variant, cohort):
    """Features of a cohort: the study's folder of links to its slides' entries (store.smk)."""
    return [get_features_dir(backbone, variant, cohort)]


def get_labels_table(cohort):
    """The cohort's label table as train-mil reads it (written by rule labels)."""
    return study_path(layout.LABELS.format(cohort=cohort))


def get_mil_inputs(wildcards):
    files = []
    for cohort in get_task_cohorts(wildcards.task):
        files += get_features(wildcards.backbone, wildcards.variant, cohort)
        files.append(get_labels_table(cohort))
    return files


def get_external_args(wildcards):
    return [
        word for c in config["tasks"][wildcards.task]["external"]
        for word in ("--external", f"{c}={get_features_dir(wildcards.backbone, wildcards.variant, c)}:{get_labels_table(c)}")
    ]


def get_mil_override_args(wildcards):
    """`pathtwt train-mil` overrides of the protocol's preset: the mil keys that are set."""
    m = config["mil"]
    return [word for key, flag in config_check.MIL_OVERRIDES.items() if m[key] is not None for word in (flag, str(m[key]))]


def get_mil_runs():
    """Every (backbone, variant, task, head, [fold,] seed) metrics file of the study."""
    return [
        f"{run}/metrics.json"
        for b in get_backbones()
        for v in get_variants(b)
        for task in config["tasks"]
        for head in config["mil"]["heads"]
        for run in get_head_runs(b, v, task, head)
    ]


def get_mil_summaries():
    return [
        study_path(f"mil/{b}/{v}/{task}/{head}/summary.json")
        for b in get_backbones()
        for v in get_variants(b)
        for task in config["tasks"]
        for head in config["mil"]["heads"]
    ]


def get_report_metric_args():
    return [word for task, t in config["tasks"].items() for word in ("--metric", f"{task}={t['metric']}")]


def get_report_selection_args():
    """`pathtwt report` shows the tasks, backbones, variants (the probed references too)
    and heads of this config only, whatever else its results folder holds."""
    variants = dict.fromkeys(v for b in get_backbones() for v in get_variants(b) + get_probe_variants(b))
    parts = {"tasks": list(config["tasks"]), "backbones": get_backbones(), "variants": list(variants),
             "heads": list(config["mil"]["heads"])}
    return [word for key, names in parts.items() if names for word in (f"--{key}", *names)]


def get_discovered_backbones():
    """Backbones with at least one compressed variant (their discovery runs)."""
    return [b for b in get_backbones() if get_compressed_variants(b)]


def get_analysis_targets():
    if not config["analysis"]["enabled"]:
        return []
    targets = [study_path(f"analysis/{b}/norms/norms_summary.json") for b in get_backbones()]
    if get_discovered_backbones():
        targets.append(study_path("analysis/eps/eps_sensitivity_summary.json"))
    for b in get_backbones():
        for v in get_compressed_variants(b):
            if config["variants"][v]["method"] == PAPER_METHOD:
                targets += [
                    study_path(f"analysis/{b}/{v}/intrinsic-dim/intrinsic_dim.json"),
                    study_path(f"analysis/{b}/{v}/stability/stability.json"),
                ]
    return targets


# ---- tile probes ---------------------------------------------------------------------


def _resolve_probes():
    """Probe sets to run; one whose tiles are absent and whose `if_missing` is `skip` is
    left out with a warning (the demo's probe on ../shared)."""
    try:
        run, skipped = config_check.available_probes(config, source=CONFIG_SOURCE)
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None
    for name in skipped:
        print(
            f"pathtwt workflow: tiles of probe set {name} ({config['probes'][name]['tiles']}) not found; "
            f"skipping its tile probes (probes.{name}.if_missing: skip)",
            file=sys.stderr,
        )
    return run


PROBES = _resolve_probes()


def get_probe_variants(backbone):
    """Variants probed for a backbone: its configured ones, the uncompressed teacher
    (named `uncompressed` when no configured variant is) and the random-init floor."""
    variants = get_variants(backbone)
    if not any(config["variants"][v]["method"] == "none" for v in variants):
        variants.append(UNCOMPRESSED)
    return [v for v in variants if v != RANDOM_INIT] + [RANDOM_INIT]


def get_probe_split_inputs(wildcards):
    split_file = config["probes"][wildcards.probe]["split_file"]
    return [split_file] if split_file else []


def get_probe_args(wildcards):
    p = config["probes"][wildcards.probe]
    args = ["--tiles", str(p["tiles"]), "--seed", str(p["seed"])]
    if p["split_file"]:
        args += ["--split-file", str(p["split_file"])]
    if p["max_per_class"] is not None:
        args += ["--max-per-class", str(p["max_per_class"])]
    return args


def get_probe_targets():
    """probe.json of every (backbone, probed variant, probe set)."""
    return [
        study_path(layout.PROBE_RESULT.format(backbone=b, variant=v, probe=p))
        for b in get_backbones()
        for v in get_probe_variants(b)
        for p in PROBES
    ]


def get_final_targets():
    return [study_path("report/index.html"), study_path("store.tsv")] + get_failure_summaries()


# ---- cross-validation (cohorts.*.draw_split.folds) -----------------------------------
# A cohort drawn into k folds: its compression-only hold-out (split `compress`) is what
# calibration reads and is never extracted; one MIL job per (variant, task, head, fold)
# trains every seed of that fold. Run folders: pathtwt.mil.layout.run_dir.

from pathtwt.mil.layout import run_dir as mil_run_dir


def get_draw_args(draw):
    """`pathtwt labels split` arguments of a cohort's draw_split: folds or fractions."""
    if draw.get("folds"):
        args = ["--folds", str(draw["folds"])]
        if draw.get("group_column"):
            args += ["--group-column", draw["group_column"]]
        if draw.get("holdout"):
            args += ["--holdout", str(draw["holdout"])]
        return args
    return ["--fractions", *(str(f) for f in config_check.split_fractions(draw))]


def get_task_folds(task):
    """The test folds of a task whose cohort is cross-validated, else [None]."""
    k = config_check.cohort_folds(config, config["tasks"][task]["cohort"])
    return list(range(k)) if k else [None]


def get_extracted_slide_ids(cohort):
    """Slides whose features are extracted: all but a compression-only hold-out."""
    return PRODUCTS.extracted_slides(cohort)


def get_mil_job_files(name, fold=False):
    """Output patterns of a MIL job: file `name` of every seed's run folder (of the
    job's test fold with `fold`)."""
    folder = mil_run_dir("{backbone}", "{variant}", "{task}", "{head}", "{seed}", "{fold}" if fold else None, RESULTS)
    return [os.path.join(folder.replace("{seed}", str(seed)), name) for seed in config["mil"]["seeds"]]


def get_head_runs(backbone, variant, task, head):
    """Run folders of one head: every seed, in every test fold of a cross-validated task."""
    return [
        mil_run_dir(backbone, variant, task, head, seed, fold, RESULTS)
        for fold in get_task_folds(task)
        for seed in config["mil"]["seeds"]
    ]


def get_test_slide_ids(task):
    """The internal test slides of a task: its cohort's test split, or the first test fold
    of a cross-validated cohort."""
    t = config["tasks"][task]
    fold = get_task_folds(task)[0]
    if fold is None:
        return get_slide_ids(t["cohort"], t["test_split"])
    table = _cohort_table(t["cohort"])
    return [s for s, f in zip(table.slide_ids, table.folds) if f == fold]


def get_fold_arg(wildcards):
    """`pathtwt train-mil --fold F` of a cross-validation job ([] otherwise)."""
    return ["--fold", wildcards.fold] if "fold" in wildcards.keys() else []


def get_mil_out_pattern(wildcards):
    """The job's run folders as `pathtwt train-mil --out` takes them ({seed} left open)."""
    fold = wildcards.fold if "fold" in wildcards.keys() else None
    return mil_run_dir(wildcards.backbone, wildcards.variant, wildcards.task, wildcards.head, "{seed}", fold, RESULTS)


# ---- QuPath regions and heatmaps ------------------------------------------------------


def get_roi(wildcards):
    """The slide's GeoJSON in its cohort's `roi` folder, as a list ([] when none)."""
    path = config_check.roi_file(config, wildcards.cohort, wildcards.slide)
    return [str(path)] if path is not None else []


# heads with per-tile attention (a head without it has no heatmap)
HEATMAP_HEADS = mil_heads.attention_names()


def get_heatmap_slides(task):
    """(cohort, slide): the first `report.heatmaps` test slides by id of each reported cohort."""
    n, pairs = config["report"]["heatmaps"], []
    for i, cohort in enumerate(get_task_cohorts(task)):
        # the training cohort's test split (of a cross-validated cohort: the first test fold,
        # which get_heatmap_run's head tested); an external cohort is tested whole
        ids = get_slide_ids(cohort) if i else get_test_slide_ids(task)
        pairs += [(cohort, s) for s in sorted(ids)[:n]]
    return pairs


def get_heatmap_run(wildcards):
    """The run folder a report heatmap uses: the head's lowest seed (in the first test fold
    of a cross-validated task)."""
    return mil_run_dir(wildcards.backbone, wildcards.variant, wildcards.task, wildcards.head, min(config["mil"]["seeds"]),
                       get_task_folds(wildcards.task)[0], RESULTS)


def get_heatmaps():
    return [
        study_path(f"heatmaps/{b}/{v}/{task}/{head}/{cohort}/{slide}.heatmap.png")
        for b in get_backbones()
        for v in get_variants(b)
        for task in config["tasks"]
        for head in config["mil"]["heads"]
        if head in HEATMAP_HEADS and config["report"]["heatmaps"] > 0
        for cohort, slide in get_heatmap_slides(task)
    ]
