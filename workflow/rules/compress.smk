# Calibration tiles (training splits only) -> layer-similarity discovery -> one
# compressed backbone per (backbone, variant).


rule calibration_list:
    input:
        get_calibration_coords,
    output:
        "results/calibration/{backbone}.coords.txt",
    log:
        "logs/calibrate/{backbone}.list.log",
    localrule: True
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    run:
        write_file_list(input, output[0])


rule calibrate:
    input:
        coords=get_calibration_coords,
        listing="results/calibration/{backbone}.coords.txt",
    output:
        "results/calibration/{backbone}.h5",
    params:
        n_tiles=config["calibration"]["n_tiles"],
        holdout=config["calibration"]["holdout"],
        seed=config["calibration"]["seed"],
    log:
        "logs/calibrate/{backbone}.log",
    threads: 2
    resources:
        mem_mb=8000,
        runtime=60,
    conda:
        CONDA_ENV
    shell:
        "mapfile -t coords < {input.listing}; pathtwt calibrate --coords \"${{coords[@]}}\""
        " --out {output} --n-tiles {params.n_tiles}"
        " --holdout {params.holdout} --seed {params.seed} > {log} 2>&1"


rule discover:
    input:
        calibration="results/calibration/{backbone}.h5",
        weights=get_teacher_inputs,
    output:
        plan="results/discovery/{backbone}/plan.json",
        similarity="results/discovery/{backbone}/similarity.npy",
        figure=report(
            "results/discovery/{backbone}/similarity.png",
            caption="../report/similarity.rst",
            category="Discovery",
            labels={"backbone": "{backbone}"},
        ),
    params:
        backbone=lambda wc: get_backbone_args(wc.backbone),
        goal=get_discover_goal_args,
        tokens=config["discovery"]["tokens"],
        seed=config["calibration"]["seed"],
        batch_size=config["discovery"]["batch_size"],
        device=config["compress"]["device"],
    log:
        "logs/discover/{backbone}.log",
    threads: 2
    resources:
        mem_mb=16000,
        runtime=60,
        gpu=1,
    conda:
        CONDA_ENV
    shell:
        "pathtwt discover {params.backbone} --calibration {input.calibration}"
        " --out results/discovery/{wildcards.backbone} {params.goal} --tokens {params.tokens}"
        " --seed {params.seed} --batch-size {params.batch_size} --device {params.device} > {log} 2>&1"


rule compress:
    input:
        calibration="results/calibration/{backbone}.h5",
        # discovery first: its similarity matrix and figure belong to every TWT model
        plan="results/discovery/{backbone}/plan.json",
        weights=get_teacher_inputs,
    output:
        model="results/models/{backbone}/{variant}/model.safetensors",
        meta="results/models/{backbone}/{variant}/model.json",
    params:
        backbone=lambda wc: get_backbone_args(wc.backbone),
        method=lambda wc: get_variant(wc)["method"],
        target=get_compress_target_args,
        steps=get_compress_steps,
        batch_size=config["compress"]["batch_size"],
        seed=config["compress"]["seed"],
        device=config["compress"]["device"],
        extra=config["compress"]["extra_args"],
    log:
        "logs/compress/{backbone}/{variant}.log",
    threads: 2
    resources:
        mem_mb=32000,
        runtime=720,
        gpu=1,
    conda:
        CONDA_ENV
    shell:
        "pathtwt compress --method {params.method} {params.backbone}"
        " --calibration {input.calibration} {params.target}"
        " --out results/models/{wildcards.backbone}/{wildcards.variant}"
        " --steps {params.steps} --batch-size {params.batch_size} --seed {params.seed}"
        " --device {params.device} --no-progress {params.extra} > {log} 2>&1"
