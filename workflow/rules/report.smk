# The results report: tables like the paper's (one per task), the tile-probe and fidelity
# tables, and the figures.


rule report:
    input:
        runs=get_mil_runs(),
        summaries=get_mil_summaries(),
        # the study's links to the entries it used: the report reads them by the study's names
        plans=get_discovery_views(),
        models=get_model_views(),
        tiles=get_tiles_views(),
        analyses=get_analysis_targets(),
        probes=get_probe_targets(),
        heatmaps=get_heatmaps(),
    output:
        html=report(
            study_path("report/index.html"),
            caption="../report/results.rst",
            category="Results",
        ),
        tables=expand(study_path("report/{task}.{ext}"), task=list(config["tasks"]), ext=["csv", "md"]),
    params:
        metrics=get_report_metric_args(),
        selection=get_report_selection_args(),
        # the study's results folder, which holds the report's folder
        results=lambda wc, output: os.path.dirname(os.path.dirname(output.html)),
        out=lambda wc, output: os.path.dirname(output.html),
        attention=config["report"]["attention_slides"],
    log:
        study_log("report.log"),
    localrule: True
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        CONDA_ENV
    shell:
        "pathtwt report --results {params.results:q} --out {params.out:q} {params.metrics:q} {params.selection:q}"
        " --attention-slides {params.attention:q} > {log:q} 2>&1"


rule heatmap:
    """A head's attention over one test slide (report: {heatmaps: N}), with its top/bottom
    tiles and QuPath GeoJSON; the lowest seed's run."""
    input:
        slide=get_slide,
        coords=lambda wc: str(get_tiles_entry(wc.cohort, wc.slide).coords),
        features=lambda wc: get_features(wc.backbone, wc.variant, wc.cohort),
        run=lambda wc: f"{get_heatmap_run(wc)}/metrics.json",
    output:
        png=study_path("heatmaps/{backbone}/{variant}/{task}/{head}/{cohort}/{slide}.heatmap.png"),
        tiles=study_path("heatmaps/{backbone}/{variant}/{task}/{head}/{cohort}/{slide}.top_tiles.png"),
        geojson=study_path("heatmaps/{backbone}/{variant}/{task}/{head}/{cohort}/{slide}.geojson"),
    params:
        run=get_heatmap_run,
        features=lambda wc: f"{get_features_dir(wc.backbone, wc.variant, wc.cohort)}/{wc.slide}.h5",
        mpp=config["report"]["heatmap_mpp"],
        out=lambda wc, output: os.path.dirname(output.png),
    log:
        study_log("heatmaps/{backbone}/{variant}/{task}/{head}/{cohort}/{slide}.log"),
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
