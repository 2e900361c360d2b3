# Frozen tile embeddings of every slide, per (backbone, variant, cohort).
#
# Default: one `pathtwt extract --manifest` job per (backbone variant, cohort), which loads
# the backbone once and embeds every slide (importing torch and loading a ViT costs more
# than embedding a small slide, so per-slide jobs would spend most of their time starting).
# With `extract: {per_slide_jobs: true}` there is one job per slide instead, grouped on a
# cluster (`group-components: extract=N` in the profile) so a submitted job still embeds
# many slides; use it for cohorts too large for a single job.

if config["extract"]["per_slide_jobs"]:

    rule extract:
        input:
            coords="results/tiles/{cohort}/{slide}.h5",
            slide=get_slide,
            model=get_model_inputs,
        output:
            "results/features/{backbone}/{variant}/{cohort}/{slide}.h5",
        params:
            model=get_model_args,
            batch_size=config["extract"]["batch_size"],
            device=config["extract"]["device"],
            failures=get_failures_arg,
        log:
            "logs/extract/{backbone}/{variant}/{cohort}/{slide}.log",
        group:
            "extract"
        threads: 2
        resources:
            mem_mb=8000,
            runtime=15,
            gpu=1,
        conda:
            "../envs/pathtwt.yaml"
        shell:
            "pathtwt extract {input.slide} --coords {input.coords} --out {output} {params.model}"
            " --batch-size {params.batch_size} --device {params.device} {params.failures} --quiet > {log} 2>&1"

else:

    rule extract_manifest:
        input:
            coords=get_cohort_coords,
        output:
            "results/manifests/extract/{backbone}/{variant}/{cohort}.tsv",
        log:
            "logs/extract/{backbone}/{variant}/{cohort}.manifest.log",
        localrule: True
        threads: 1
        resources:
            mem_mb=500,
            runtime=5,
        run:
            write_extract_manifest(wildcards, output[0])

    rule extract:
        input:
            manifest="results/manifests/extract/{backbone}/{variant}/{cohort}.tsv",
            coords=get_cohort_coords,
            model=get_model_inputs,
        output:
            directory("results/features/{backbone}/{variant}/{cohort}"),
        params:
            model=get_model_args,
            batch_size=config["extract"]["batch_size"],
            device=config["extract"]["device"],
            failures=get_failures_arg,
        log:
            "logs/extract/{backbone}/{variant}/{cohort}.log",
        threads: 2
        resources:
            mem_mb=8000,
            runtime=720,
            gpu=1,
        conda:
            "../envs/pathtwt.yaml"
        shell:
            "pathtwt extract --manifest {input.manifest} {params.model}"
            " --batch-size {params.batch_size} --device {params.device} {params.failures} --quiet > {log} 2>&1"
