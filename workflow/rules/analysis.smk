# Optional analyses (analysis.enabled): norm growth of each teacher, the eps sensitivity
# of all discovered partitions, and intrinsic-dimension / stability trajectories of each
# TWT student against its teacher. Their figures carry sidecar JSON captions that the
# report shows.


rule analyze_norms:
    input:
        calibration="results/calibration/{backbone}.h5",
        weights=get_teacher_inputs,
    output:
        summary="results/analysis/{backbone}/norms/norms_summary.json",
        figure=report(
            "results/analysis/{backbone}/norms/norms.png",
            caption="../report/analysis.rst",
            category="Analyses",
            labels={"backbone": "{backbone}", "analysis": "norm growth"},
        ),
    params:
        backbone=lambda wc: get_backbone_args(wc.backbone),
        device=get_rule_device("analyze_norms"),
    log:
        "logs/analysis/{backbone}/norms.log",
    threads: 2
    resources:
        mem_mb=8000,
        runtime=30,
        gpu=1,
    conda:
        CONDA_ENV
    shell:
        "pathtwt analyze norms {params.backbone:q} --calibration {input.calibration:q}"
        " --out results/analysis/{wildcards.backbone:q}/norms --device {params.device:q} > {log:q} 2>&1"


rule analyze_eps:
    input:
        plans=expand("results/discovery/{backbone}/plan.json", backbone=get_discovered_backbones()),
    output:
        summary="results/analysis/eps/eps_sensitivity_summary.json",
        figure=report(
            "results/analysis/eps/eps_sensitivity.png",
            caption="../report/analysis.rst",
            category="Analyses",
            labels={"analysis": "eps sensitivity"},
        ),
    params:
        discovery=[f"{b}=results/discovery/{b}" for b in get_discovered_backbones()],
    log:
        "logs/analysis/eps.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        CONDA_ENV
    shell:
        "pathtwt analyze eps --discovery {params.discovery:q} --out results/analysis/eps > {log:q} 2>&1"


# Student trajectories: one rule per analysis (named analyze_intrinsic_dim and
# analyze_stability), each per (backbone, TWT variant).
for _analysis, _summary in (("intrinsic-dim", "intrinsic_dim.json"), ("stability", "stability.json")):

    rule:
        name:
            f"analyze_{_analysis.replace('-', '_')}"
        input:
            calibration="results/calibration/{backbone}.h5",
            student="results/models/{backbone}/{variant}/model.json",
            weights=get_teacher_inputs,
        output:
            f"results/analysis/{{backbone}}/{{variant}}/{_analysis}/{_summary}",
        params:
            backbone=lambda wc: get_backbone_args(wc.backbone),
            device=get_rule_device(f"analyze_{_analysis.replace('-', '_')}"),
            # Snakemake re-evaluates the shell expression when the job runs, after the loop
            # has moved on: the loop variable must reach the command through params.
            analysis=_analysis,
        log:
            f"logs/analysis/{{backbone}}/{{variant}}/{_analysis}.log",
        threads: 2
        resources:
            mem_mb=8000,
            runtime=60,
            gpu=1,
        conda:
            CONDA_ENV
        shell:
            "pathtwt analyze {params.analysis:q} {params.backbone:q} --calibration {input.calibration:q}"
            " --student results/models/{wildcards.backbone:q}/{wildcards.variant:q}"
            " --out results/analysis/{wildcards.backbone:q}/{wildcards.variant:q}/{params.analysis:q}"
            " --device {params.device:q} > {log:q} 2>&1"
