# Slide heads on frozen features: one run per (backbone variant, task, head, seed), then
# mean +- std over seeds.


rule train_mil:
    input:
        get_mil_inputs,
    output:
        metrics="results/mil/{backbone}/{variant}/{task}/{head}/seed{seed}/metrics.json",
        predictions="results/mil/{backbone}/{variant}/{task}/{head}/seed{seed}/predictions.csv",
    params:
        cohort=lambda wc: config["tasks"][wc.task]["cohort"],
        protocol=lambda wc: config["tasks"][wc.task]["protocol"],
        classes=lambda wc: config["tasks"][wc.task]["classes"],
        external=get_external_args,
        epochs=get_epochs_arg,
        device=config["mil"]["device"],
        failed=config["mil"]["failed_slides"],
        extra=config["mil"]["extra_args"],
    log:
        "logs/mil/{backbone}/{variant}/{task}/{head}/seed{seed}.log",
    # a run takes minutes: on a cluster several seeds share one submitted job
    # (`group-components: train_mil=N` in the profiles), one after the other on one GPU
    group:
        "train_mil"
    threads: config["mil"]["threads"]
    resources:
        mem_mb=8000,
        runtime=120,
        gpu=1,
    conda:
        CONDA_ENV
    shell:
        "pathtwt train-mil --features results/features/{wildcards.backbone}/{wildcards.variant}/{params.cohort}"
        " --labels results/labels/{params.cohort}.csv --protocol {params.protocol} --classes {params.classes}"
        " --aggregator {wildcards.head} --seed {wildcards.seed}"
        " --out results/mil/{wildcards.backbone}/{wildcards.variant}/{wildcards.task}/{wildcards.head}/seed{wildcards.seed}"
        " {params.external} {params.epochs} --device {params.device} --threads {threads} --failed-slides {params.failed} --no-progress {params.extra} > {log} 2>&1"


rule summarize_mil:
    input:
        lambda wc: [
            f"results/mil/{wc.backbone}/{wc.variant}/{wc.task}/{wc.head}/seed{seed}/metrics.json"
            for seed in config["mil"]["seeds"]
        ],
    output:
        json="results/mil/{backbone}/{variant}/{task}/{head}/summary.json",
        csv="results/mil/{backbone}/{variant}/{task}/{head}/summary.csv",
    params:
        runs=lambda wc, input: " ".join(str(Path(p).parent) for p in input),
    log:
        "logs/mil/{backbone}/{variant}/{task}/{head}/summary.log",
    localrule: True
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        "pathtwt summarize-mil {params.runs} --out {output.json} {output.csv} > {log} 2>&1"
