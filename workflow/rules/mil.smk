# Slide heads on frozen features: one job per (backbone variant, task, head) trains every
# seed, one run after the other in one process (the features are read and torch imported
# once; for a small cohort that start-up costs more than a run), then mean +- std over
# seeds. A job killed part-way resumes its unfinished run from that run's resume.pt.
# A cross-validated task (cohorts.*.draw_split.folds) has one job per test fold
# (train_mil_fold), its runs one folder level deeper (pathtwt.mil.layout.run_dir).


rule train_mil:
    input:
        get_mil_inputs,
    output:
        metrics=get_mil_job_files("metrics.json"),
        predictions=get_mil_job_files("predictions.csv"),
    params:
        features=lambda wc: get_features_dir(wc.backbone, wc.variant, config["tasks"][wc.task]["cohort"]),
        labels=lambda wc: get_labels_table(config["tasks"][wc.task]["cohort"]),
        protocol=lambda wc: config["tasks"][wc.task]["protocol"],
        classes=lambda wc: config["tasks"][wc.task]["classes"],
        external=get_external_args,
        overrides=get_mil_override_args,
        seeds=[str(s) for s in config["mil"]["seeds"]],
        device=get_rule_device("train_mil"),
        failed=config["mil"]["failed_slides"],
        extra=get_extra_args("mil"),
        fold=get_fold_arg,
        out=get_mil_out_pattern,
    log:
        study_log("mil/{backbone}/{variant}/{task}/{head}.log"),
    # the seeds of a head are one job: on a cluster one submitted GPU job each
    group:
        "train_mil"
    threads: config["mil"]["threads"]
    resources:
        mem_mb=8000,
        runtime=120 * len(config["mil"]["seeds"]),  # minutes: 2 h per run
        gpu=1,
    conda:
        CONDA_ENV
    shell:
        "pathtwt train-mil --features {params.features:q}"
        " --labels {params.labels:q} --protocol {params.protocol:q} --classes {params.classes:q}"
        " --aggregator {wildcards.head:q} --seed {params.seeds:q}"
        " --out {params.out:q}"
        " {params.external:q} {params.overrides:q} --device {params.device:q} --threads {threads}"
        " --failed-slides {params.failed:q} --no-progress {params.fold:q} {params.extra:q} > {log:q} 2>&1"


use rule train_mil as train_mil_fold with:
    output:
        metrics=get_mil_job_files("metrics.json", fold=True),
        predictions=get_mil_job_files("predictions.csv", fold=True),
    log:
        study_log("mil/{backbone}/{variant}/{task}/{head}/fold{fold}.log"),


rule summarize_mil:
    input:
        lambda wc: [f"{run}/metrics.json" for run in get_head_runs(wc.backbone, wc.variant, wc.task, wc.head)],
    output:
        json=study_path("mil/{backbone}/{variant}/{task}/{head}/summary.json"),
        csv=study_path("mil/{backbone}/{variant}/{task}/{head}/summary.csv"),
    log:
        study_log("mil/{backbone}/{variant}/{task}/{head}/summary.log"),
    # milliseconds of work: run in the Snakemake process (no new interpreter; see
    # `onstart` in common.smk) rather than as a `pathtwt summarize-mil` command
    localrule: True
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    run:
        from pathtwt.mil.summary import write_summary

        write_summary([Path(p).parent for p in input], [output.json, output.csv])
