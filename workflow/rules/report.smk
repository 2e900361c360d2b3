# The results report: tables like the paper's (one per task), the tile-probe and fidelity
# tables, and the figures.


rule report:
    input:
        runs=get_mil_runs(),
        summaries=get_mil_summaries(),
        plans=expand("results/discovery/{backbone}/plan.json", backbone=get_discovered_backbones()),
        analyses=get_analysis_targets(),
        probes=get_probe_targets(),
        heatmaps=get_heatmaps(),
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
        "pathtwt report --results results --out results/report {params.metrics:q}"
        " --attention-slides {params.attention:q} > {log:q} 2>&1"


rule heatmap:
    """A head's attention over one test slide (report: {heatmaps: N}), with its top/bottom
    tiles and QuPath GeoJSON; the lowest seed's run."""
    input:
        slide=get_slide,
        coords="results/tiles/{cohort}/{slide}.h5",
        features=lambda wc: get_features(wc.backbone, wc.variant, wc.cohort),
        run=lambda wc: f"{get_heatmap_run(wc)}/metrics.json",
    output:
        png="results/heatmaps/{backbone}/{variant}/{task}/{head}/{cohort}/{slide}.heatmap.png",
        tiles="results/heatmaps/{backbone}/{variant}/{task}/{head}/{cohort}/{slide}.top_tiles.png",
        geojson="results/heatmaps/{backbone}/{variant}/{task}/{head}/{cohort}/{slide}.geojson",
    params:
        run=get_heatmap_run,
        features=lambda wc: f"{get_features_dir(wc.backbone, wc.variant, wc.cohort)}/{wc.slide}.h5",
        mpp=config["report"]["heatmap_mpp"],
        out=lambda wc: f"results/heatmaps/{wc.backbone}/{wc.variant}/{wc.task}/{wc.head}/{wc.cohort}",
    log:
        "logs/heatmaps/{backbone}/{variant}/{task}/{head}/{cohort}/{slide}.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=15,
    conda:
        CONDA_ENV
    shell:
        "pathtwt heatmap --coords {input.coords:q}"
        " --features {params.features:q}"
        " --run {params.run:q} --out {params.out:q}"
        " --slide-id={wildcards.slide:q} --mpp {params.mpp:q}"
        " -- {input.slide:q} > {log:q} 2>&1"
