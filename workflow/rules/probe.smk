# Tile-level probes: every backbone variant, the uncompressed teacher and the same
# architecture with random weights (the floor) on every labelled tile set of `probes`.
# Embedding uses the extraction settings (device, batch size).


rule probe:
    input:
        model=get_model_inputs,
        split=get_probe_split_inputs,
    output:
        summary=study_path("probes/{backbone}/{variant}/{probe}/probe.json"),
        predictions=study_path("probes/{backbone}/{variant}/{probe}/predictions.csv"),
    params:
        model=get_model_args,
        probe=get_probe_args,
        batch_size=config["extract"]["batch_size"],
        device=get_rule_device("probe"),
        out=lambda wc, output: os.path.dirname(output.summary),
    log:
        study_log("probes/{backbone}/{variant}/{probe}.log"),
    threads: config["extract"]["threads"]
    resources:
        mem_mb=8000,
        runtime=30,
        gpu=1,
    conda:
        CONDA_ENV
    shell:
        "pathtwt probe {params.model:q} {params.probe:q} --name {wildcards.probe:q}"
        " --out {params.out:q}"
        " --batch-size {params.batch_size:q} --device {params.device:q} > {log:q} 2>&1"
