# Optional analyses (analysis.enabled): norm growth of each teacher, the eps sensitivity
# of all discovered partitions, and intrinsic-dimension / stability trajectories of each
# TWT student against its teacher. Their figures carry sidecar JSON captions that the
# report shows.


rule analyze_norms:
    input:
        calibration=lambda wc: get_calibration_entry(wc.backbone),
        weights=get_teacher_inputs,
    output:
        summary=study_path("analysis/{backbone}/norms/norms_summary.json"),
        figure=report(
            study_path("analysis/{backbone}/norms/norms.png"),
            caption="../report/analysis.rst",
            category="Analyses",
            labels={"backbone": "{backbone}", "analysis": "norm growth"},
        ),
    params:
        backbone=lambda wc: get_backbone_args(wc.backbone),
        device=get_rule_device("analyze_norms"),
        out=lambda wc, output: os.path.dirname(output.summary),
    log:
        study_log("analysis/{backbone}/norms.log"),
    threads: 2
    resources:
        mem_mb=8000,
        runtime=30,
        gpu=1,
    conda:
        CONDA_ENV
    shell:
        "pathtwt analyze norms {params.backbone:q} --calibration {input.calibration:q}"
        " --out {params.out:q} --device {params.device:q} > {log:q} 2>&1"


rule analyze_eps:
    input:
        plans=get_discovery_views(),
    output:
        summary=study_path("analysis/eps/eps_sensitivity_summary.json"),
        figure=report(
            study_path("analysis/eps/eps_sensitivity.png"),
            caption="../report/analysis.rst",
            category="Analyses",
            labels={"analysis": "eps sensitivity"},
        ),
    params:
        discovery=[f"{b}={study_path(layout.DISCOVERY_DIR.format(backbone=b))}" for b in get_discovered_backbones()],
        out=lambda wc, output: os.path.dirname(output.summary),
    log:
        study_log("analysis/eps.log"),
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        CONDA_ENV
    shell:
        "pathtwt analyze eps --discovery {params.discovery:q} --out {params.out:q} > {log:q} 2>&1"


# Student trajectories: one rule per analysis (named analyze_intrinsic_dim and
# analyze_stability), each per (backbone, TWT variant).
for _analysis, _summary in (("intrinsic-dim", "intrinsic_dim.json"), ("stability", "stability.json")):

    rule:
        name:
            f"analyze_{_analysis.replace('-', '_')}"
        input:
            calibration=lambda wc: get_calibration_entry(wc.backbone),
            student=lambda wc: f"{get_model_dir(wc.backbone, wc.variant)}/model.json",
            weights=get_teacher_inputs,
        output:
            study_path(f"analysis/{{backbone}}/{{variant}}/{_analysis}/{_summary}"),
        params:
            backbone=lambda wc: get_backbone_args(wc.backbone),
            device=get_rule_device(f"analyze_{_analysis.replace('-', '_')}"),
            # Snakemake re-evaluates the shell expression when the job runs, after the loop
            # has moved on: the loop variable must reach the command through params.
            analysis=_analysis,
            student=lambda wc, input: os.path.dirname(input.student),
            out=lambda wc, output: os.path.dirname(output[0]),
        log:
            study_log(f"analysis/{{backbone}}/{{variant}}/{_analysis}.log"),
        threads: 2
        resources:
            mem_mb=8000,
            runtime=60,
            gpu=1,
        conda:
            CONDA_ENV
        shell:
            "pathtwt analyze {params.analysis:q} {params.backbone:q} --calibration {input.calibration:q}"
            " --student {params.student:q}"
            " --out {params.out:q}"
            " --device {params.device:q} > {log:q} 2>&1"
