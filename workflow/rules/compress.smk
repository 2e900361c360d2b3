# Calibration tiles (training splits only) -> layer-similarity discovery -> one
# compressed backbone per (backbone, variant).


rule calibration_list:
    input:
        get_calibration_coords,
    output:
        study_path("calibration/{backbone}.coords.txt"),
    log:
        study_log("calibrate/{backbone}.list.log"),
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
        listing=study_path("calibration/{backbone}.coords.txt"),
    output:
        study_path("calibration/{backbone}.h5"),
    params:
        n_tiles=config["calibration"]["n_tiles"],
        holdout=config["calibration"]["holdout"],
        holdout_by=config["calibration"]["holdout_by"],
        seed=config["calibration"]["seed"],
    # the longest chain of the study (calibrate -> discover -> compress -> extract -> MIL):
    # started before the teacher's own extraction jobs, which nothing waits on as long
    priority: 10
    log:
        study_log("calibrate/{backbone}.log"),
    # one process reads the tiles; a job asking for 2 cores would wait, on a machine of 2,
    # until no one-thread job runs, which keeps the chain behind it waiting
    threads: 1
    resources:
        mem_mb=8000,
        runtime=60,
    conda:
        CONDA_ENV
    shell:
        # the coords files one per line (check-config refuses a slide id holding a newline)
        "mapfile -t coords < {input.listing:q}; pathtwt calibrate --coords \"${{coords[@]}}\""
        " --out {output:q} --n-tiles {params.n_tiles:q}"
        " --holdout {params.holdout:q} --holdout-by {params.holdout_by:q} --seed {params.seed:q} > {log:q} 2>&1"


rule discover:
    input:
        calibration=study_path("calibration/{backbone}.h5"),
        weights=get_teacher_inputs,
    output:
        plan=study_path("discovery/{backbone}/plan.json"),
        similarity=study_path("discovery/{backbone}/similarity.npy"),
        figure=report(
            study_path("discovery/{backbone}/similarity.png"),
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
        device=get_rule_device("discover"),
        out=lambda wc, output: os.path.dirname(output.plan),
    # the longest chain of the study (calibrate -> discover -> compress -> extract -> MIL):
    # started before the teacher's own extraction jobs, which nothing waits on as long
    priority: 10
    log:
        study_log("discover/{backbone}.log"),
    threads: config["compress"]["threads"]
    resources:
        mem_mb=16000,
        runtime=60,
        gpu=1,
    conda:
        CONDA_ENV
    shell:
        "pathtwt discover {params.backbone:q} --calibration {input.calibration:q}"
        " --out {params.out:q} {params.goal:q} --tokens {params.tokens:q}"
        " --seed {params.seed:q} --batch-size {params.batch_size:q} --device {params.device:q} > {log:q} 2>&1"


rule compress:
    input:
        calibration=study_path("calibration/{backbone}.h5"),
        # the coords of the training tiles, streamed when compress.stream is on (the same
        # training-split slides as the calibration draw, less its held-out slides)
        listing=study_path("calibration/{backbone}.coords.txt"),
        # discovery first: its similarity matrix and figure belong to every TWT model
        plan=study_path("discovery/{backbone}/plan.json"),
        weights=get_teacher_inputs,
    output:
        model=study_path("models/{backbone}/{variant}/model.safetensors"),
        meta=study_path("models/{backbone}/{variant}/model.json"),
    params:
        backbone=lambda wc: get_backbone_args(wc.backbone),
        method=lambda wc: get_variant(wc)["method"],
        target=get_compress_target_args,
        budget=get_compress_budget_args,
        stream=get_compress_stream_args,
        settings=get_compress_settings_args,
        device=get_rule_device("compress"),
        cpu_ranks=config["compress"]["cpu_ranks"],
        extra=get_compress_extra_args,
        out=lambda wc, output: os.path.dirname(output.meta),
    # the longest chain of the study (calibrate -> discover -> compress -> extract -> MIL):
    # started before the teacher's own extraction jobs, which nothing waits on as long
    priority: 10
    log:
        study_log("compress/{backbone}/{variant}.log"),
    # compress.threads and the memory are per GPU (per data-parallel rank): compress.gpus of them
    threads: config["compress"]["threads"] * config["compress"]["gpus"]
    resources:
        mem_mb=32000 * config["compress"]["gpus"],
        runtime=720,
        # GPUs of the job (compress.gpus); above 1, one data-parallel rank per GPU through torchrun
        gpu=config["compress"]["gpus"],
    conda:
        CONDA_ENV
    shell:
        # MIOpen's caches (ROCm): every rank points them at node-local storage itself,
        # pathtwt.devices.use_node_local_miopen_cache, the one place
        # ranks: one per GPU the job got; on CPU (device cpu) compress.cpu_ranks gloo ranks
        "ranks={resources.gpu}; if [ {params.device:q} = cpu ]; then ranks={params.cpu_ranks:q}; fi;"
        # on GPUs through pathtwt.devices: it claims that many free GPUs of a shared machine
        # (none where SLURM chose them) and refuses more than the machine has, in one line
        " if [ \"$ranks\" -gt 1 ]; then run=\"torchrun --standalone --nproc-per-node $ranks -m pathtwt\";"
        " if [ {params.device:q} != cpu ]; then run=\"python -m pathtwt.devices --gpus $ranks -- $run\"; fi;"
        " else run=pathtwt; fi;"
        " $run compress --method {params.method:q} {params.backbone:q}"
        " --calibration {input.calibration:q} {params.target:q}"
        " --out {params.out:q}"
        " {params.budget:q} {params.stream:q} {params.settings:q}"
        " --device {params.device:q} --no-progress {params.extra:q} > {log:q} 2>&1"
