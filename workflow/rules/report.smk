# The results report: tables like the paper's (one per task), the tile-probe and fidelity
# tables, and the figures.


rule report:
    input:
        runs=get_mil_runs(),
        summaries=get_mil_summaries(),
        plans=expand("results/discovery/{backbone}/plan.json", backbone=get_discovered_backbones()),
        analyses=get_analysis_targets(),
        probes=get_probe_targets(),
    output:
        html=report(
            "results/report/index.html",
            caption="../report/results.rst",
            category="Results",
        ),
        tables=expand("results/report/{task}.{ext}", task=list(config["tasks"]), ext=["csv", "md"]),
    params:
        metrics=get_report_metric_args(),
        attention=config["report"]["attention_slides"],
    log:
        "logs/report.log",
    localrule: True
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        CONDA_ENV
    shell:
        "pathtwt report --results results --out results/report {params.metrics}"
        " --attention-slides {params.attention} > {log} 2>&1"
