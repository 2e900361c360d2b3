# Frozen tile embeddings of every slide, per (backbone, variant, cohort).
#
# Default: one `pathtwt extract --manifest` job per (backbone variant, cohort), which loads
# the backbone once and embeds every slide (importing torch and loading a ViT costs more
# than embedding a small slide, so per-slide jobs would spend most of their time starting).
# With `extract: {per_slide_jobs: true}` there is one job per slide instead, grouped on a
# cluster (`group-components: extract=N` in the profile) so a submitted job still embeds
# many slides; use it for cohorts too large for a single job.
#
# With `extract: {on_failure: record}` every job writes its own failures table (declared
# as an output, so a rerun replaces it) and `merge_failures` joins a cohort's tables:
# no job appends to a file another job writes.
#
# Threads: decoding tiles is the CPU side of a GPU job; `pathtwt extract` gets the job's
# cores as --workers (threads - 1 reading processes beside the main one). `extract.threads`
# sets them (default 8); the profiles size them per site (LUMI-G: 7 cores per GCD).

if not PER_SLIDE_EXTRACT:

    rule extract_manifest:
        input:
            coords=get_cohort_coords,
        output:
            EXTRACT_MANIFEST,
        log:
            study_log("extract/{backbone}/{variant}/{cohort}.manifest.log"),
        localrule: True
        threads: 1
        resources:
            mem_mb=500,
            runtime=5,
        run:
            write_extract_manifest(wildcards, output[0])


rule extract:
    input:
        unpack(get_extract_inputs),
    output:
        **get_extract_outputs(),
    params:
        jobs=get_extract_jobs_args,
        model=get_model_args,
        batch_size=config["extract"]["batch_size"] or "auto",
        device=get_rule_device("extract"),
        decode=config["extract"]["decode"],
        failures=get_failures_arg,
        workers=get_workers,
    log:
        study_log(f"extract/{{backbone}}/{{variant}}/{{cohort}}/{EXTRACT_JOB}.log"),
    # per-slide jobs are grouped on a cluster (the profile's group-components)
    group:
        "extract" if PER_SLIDE_EXTRACT else None
    threads: config["extract"]["threads"]
    resources:
        mem_mb=8000,
        runtime=15 if PER_SLIDE_EXTRACT else 720,
        gpu=1,
    conda:
        CONDA_ENV
    shell:
        "pathtwt extract {params.model:q}"
        " --batch-size {params.batch_size:q} --device {params.device:q} --decode {params.decode:q}"
        " --workers {params.workers:q}"
        " {params.failures:q} --no-progress {params.jobs:q} > {log:q} 2>&1"


rule merge_failures:
    """A cohort's failures.tsv: the per-job tables of its extraction merged (header only
    when no slide failed)."""
    input:
        get_failure_tables,
    output:
        study_path("failures/{backbone}/{variant}/{cohort}.tsv"),
    log:
        study_log("failures/{backbone}/{variant}/{cohort}.log"),
    localrule: True
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    run:
        from pathtwt.io.failures import merge_failures

        merge_failures(input, output[0])
