# Calibration tiles (training splits only) -> layer-similarity discovery -> one
# compressed backbone per (backbone, variant): each an entry of the store (store.smk), made
# only when the store does not hold it; the study's models/ and discovery/ link to them.


rule calibration_list:
    """The coords files of a calibration (the study's tiles links) and its record."""
    input:
        tiles=get_calibration_tiles,
        views=get_calibration_cohort_views,
    output:
        listing=study_path("calibration/{ckey}.coords.txt"),
        record=study_path("calibration/{ckey}.record.json"),
    log:
        study_log("calibrate/{ckey}.list.log"),
    localrule: True
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    run:
        write_calibration_listing(wildcards, output.listing, output.record)


rule calibrate:
    """A calibration entry in the store: tiles drawn from the training slides."""
    input:
        unpack(get_calibrate_inputs),
    output:
        update(f"{STORE_DIR}/calibration/{{ckey}}.h5"),
    params:
        entry=lambda wc: str(STORE.calibration(wc.ckey).record),
        record=lambda wc: f"@{study_path(f'calibration/{wc.ckey}.record.json')}",
        n_tiles=config["calibration"]["n_tiles"],
        holdout=config["calibration"]["holdout"],
        holdout_by=config["calibration"]["holdout_by"],
        seed=config["calibration"]["seed"],
    # the longest chain of the study (calibrate -> discover -> compress -> extract -> MIL):
    # started before the teacher's own extraction jobs, which nothing waits on as long
    priority: 10
    log:
        study_log("calibrate/{ckey}.log"),
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
        "mapfile -t coords < {input.listing:q}; pathtwt store make --entry {params.entry:q}"
        " --record {params.record:q} --files {output:q} --"
        " pathtwt calibrate --coords \"${{coords[@]}}\""
        " --out {output:q} --n-tiles {params.n_tiles:q}"
        " --holdout {params.holdout:q} --holdout-by {params.holdout_by:q} --seed {params.seed:q} > {log:q} 2>&1"


rule discover:
    """A discovery entry in the store: the teacher's layer similarity on a calibration and
    the partition drawn on it."""
    input:
        unpack(get_discover_inputs),
    output:
        plan=update(f"{STORE_DIR}/discovery/{{dkey}}/plan.json"),
        similarity=update(f"{STORE_DIR}/discovery/{{dkey}}/similarity.npy"),
        figure=update(
            report(
                f"{STORE_DIR}/discovery/{{dkey}}/similarity.png",
                caption="../report/similarity.rst",
                category="Discovery",
                labels={"discovery entry": "{dkey}"},
            )
        ),
    params:
        entry=lambda wc: str(STORE.discovery(wc.dkey)),
        record=lambda wc: get_plan_json("discovery", wc.dkey),
        check=lambda wc: get_weights_check_args(backbone_wildcards("discovery", wc.dkey)),
        backbone=lambda wc: get_backbone_args(backbone_wildcards("discovery", wc.dkey).backbone),
        goal=lambda wc: get_discover_goal_args(backbone_wildcards("discovery", wc.dkey)),
        tokens=config["discovery"]["tokens"],
        seed=config["calibration"]["seed"],
        batch_size=config["discovery"]["batch_size"],
        device=get_rule_device("discover"),
        out=lambda wc: str(STORE.building(STORE.discovery(wc.dkey))),
    # the longest chain of the study (calibrate -> discover -> compress -> extract -> MIL):
    # started before the teacher's own extraction jobs, which nothing waits on as long
    priority: 10
    log:
        study_log("discover/{dkey}.log"),
    threads: config["compress"]["threads"]
    resources:
        mem_mb=16000,
        runtime=60,
        gpu=1,
    conda:
        CONDA_ENV
    shell:
        "pathtwt store make --entry {params.entry:q} --record {params.record:q}"
        " --files plan.json similarity.npy similarity.png {params.check:q} --"
        " pathtwt discover {params.backbone:q} --calibration {input.calibration:q}"
        " --out {params.out:q} {params.goal:q} --tokens {params.tokens:q}"
        " --seed {params.seed:q} --batch-size {params.batch_size:q} --device {params.device:q} > {log:q} 2>&1"


rule compress:
    input:
        unpack(get_compress_inputs),
    output:
        model=update(f"{STORE_DIR}/models/{{mkey}}/model.safetensors"),
        meta=update(f"{STORE_DIR}/models/{{mkey}}/model.json"),
    params:
        entry=lambda wc: str(STORE.model(wc.mkey)),
        record=lambda wc: get_plan_json("model", wc.mkey),
        check=lambda wc: get_weights_check_args(model_wildcards(wc)),
        backbone=lambda wc: get_backbone_args(model_wildcards(wc).backbone),
        method=lambda wc: get_variant(model_wildcards(wc))["method"],
        target=lambda wc: get_compress_target_args(model_wildcards(wc)),
        budget=lambda wc: get_compress_budget_args(model_wildcards(wc)),
        stream=lambda wc: get_compress_stream_args(model_wildcards(wc)),
        settings=lambda wc: get_compress_settings_args(model_wildcards(wc)),
        device=get_rule_device("compress"),
        cpu_ranks=config["compress"]["cpu_ranks"],
        extra=lambda wc: get_compress_extra_args(model_wildcards(wc)),
        out=lambda wc: str(STORE.building(STORE.model(wc.mkey))),
    # the longest chain of the study (calibrate -> discover -> compress -> extract -> MIL):
    # started before the teacher's own extraction jobs, which nothing waits on as long
    priority: 10
    log:
        study_log("compress/{mkey}.log"),
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
        " pathtwt store make --entry {params.entry:q} --record {params.record:q}"
        " --files model.safetensors model.json {params.check:q} --"
        " $run compress --method {params.method:q} {params.backbone:q}"
        " --calibration {input.calibration:q} {params.target:q}"
        " --out {params.out:q}"
        " {params.budget:q} {params.stream:q} {params.settings:q}"
        " --device {params.device:q} --no-progress {params.extra:q} > {log:q} 2>&1"
