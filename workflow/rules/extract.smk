# Frozen tile embeddings: each slide's features by a backbone variant are an entry of the
# store, features/{extractor}/{tiles}.h5 (store.smk), published as soon as the slide is done.
#
# Default: one `pathtwt extract --manifest` job per (backbone variant, cohort) whose slides
# are not all in the store; it loads the backbone once and embeds the missing slides
# (importing torch and loading a ViT costs more than embedding a small slide, so per-slide
# jobs would spend most of their time starting). Its `pathtwt store make` claims each
# missing slide (another run embedding one is waited for, not repeated) and publishes the
# job's own entry, the cohort's set, once all are there; a job killed at slide k keeps the
# slides before it, and its rerun embeds the rest. With `extract: {per_slide_jobs: true}`
# there is one job per slide instead, grouped on a cluster (`group-components: extract=N` in
# the profile); use it for cohorts too large for a single job.
#
# With `extract: {on_failure: record}` a slide that fails gets an entry that says so (and
# the job's own failures table beside its log); the study's failures table per cohort is
# made from the entries (rule view_features).
#
# Threads: decoding tiles is the CPU side of a GPU job; `pathtwt extract` gets the job's
# cores as --workers (threads - 1 reading processes beside the main one). `extract.threads`
# sets them (default 8); the profiles size them per site (LUMI-G: 7 cores per GCD).

if not PER_SLIDE_EXTRACT:

    rule extract_manifest:
        """A cohort job's slides (slide, coords, features entry per line) and its set's record."""
        output:
            manifest=study_path("manifests/extract/{ekey}/{skey}.tsv"),
            record=study_path("manifests/extract/{ekey}/{skey}.tsv.record.json"),
        log:
            study_log("extract/{ekey}/{skey}.manifest.log"),
        localrule: True
        threads: 1
        resources:
            mem_mb=500,
            runtime=5,
        run:
            write_extract_manifest(wildcards, output.manifest, output.record)


rule extract:
    input:
        unpack(get_extract_inputs),
    output:
        features=update(f"{STORE_DIR}/features/{{ekey}}/{{tkey}}.h5" if PER_SLIDE_EXTRACT
                        else f"{STORE_DIR}/features/{{ekey}}/sets/{{skey}}.json"),
    params:
        entry=get_extract_jobs_args,
        check=lambda wc: get_weights_check_args(extract_wildcards(wc)) if _variant_kind(extract_wildcards(wc).variant) == "teacher" else [],
        model=lambda wc: get_model_args(extract_wildcards(wc)),
        batch_size=config["extract"]["batch_size"] or "auto",
        device=get_rule_device("extract"),
        decode=config["extract"]["decode"],
        precision=config["extract"]["precision"],
        embedding=config["extract"]["embedding"],
        failures=get_extract_failures_arg,
        workers=get_workers,
        slide=get_extract_slide_args,
    log:
        study_log("extract/{ekey}/{tkey}.log" if PER_SLIDE_EXTRACT else "extract/{ekey}/{skey}.log"),
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
        "pathtwt store make {params.entry:q} {params.check:q} --"
        " pathtwt extract {params.model:q}"
        " --batch-size {params.batch_size:q} --device {params.device:q} --decode {params.decode:q}"
        " --precision {params.precision:q} --embedding {params.embedding:q} --workers {params.workers:q}"
        " {params.failures:q} --no-progress {params.slide:q} > {log:q} 2>&1"
