# Tissue detection and tile coordinates, one job per slide; label tables normalised
# to the slide_id,label,split layout the MIL step reads (with the drawn split recorded
# there when the cohort's table has none).
#
# A slide takes seconds to tile, so on a cluster tile jobs are submitted in groups
# (`group-components: tile=N` in the profiles): one SLURM job tiles N slides one after
# the other instead of N submissions of a few seconds each.


rule tile:
    input:
        slide=get_slide,
        roi=get_roi,
    output:
        coords=study_path("tiles/{cohort}/{slide}.h5"),
        thumbnail=report(
            study_path("thumbnails/{cohort}/{slide}.png"),
            caption="../report/thumbnail.rst",
            category="Tissue",
            subcategory="{cohort}",
            labels={"cohort": "{cohort}", "slide": "{slide}"},
        ),
    params:
        mpp=lambda wc: get_tiling(wc.cohort)["target_mpp"],
        tile_size=lambda wc: get_tiling(wc.cohort)["tile_size"],
        tissue=lambda wc: get_tiling(wc.cohort)["tissue"],
        min_tissue=lambda wc: get_tiling(wc.cohort)["min_tissue"],
        slide_mpp=get_mpp_fallback_arg,
        modality=get_modality_args,
        roi=lambda wc, input: ["--roi", *input.roi] if input.roi else [],
    log:
        study_log("tile/{cohort}/{slide}.log"),
    # upstream of the longest chain (calibrate -> discover -> compress -> ...): first
    priority: 10
    group:
        "tile"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
        # counted against the profiles' per-group limit, so a group of N slides runs a
        # few at a time on the cores it asked for
        cpu_slots=1,
    conda:
        CONDA_ENV
    shell:
        "pathtwt tile --out {output.coords:q} --thumbnail {output.thumbnail:q}"
        " --mpp {params.mpp:q} --tile-size {params.tile_size:q} --tissue {params.tissue:q}"
        " --min-tissue {params.min_tissue:q} {params.slide_mpp:q} {params.modality:q} {params.roi:q}"
        " -- {input.slide:q} > {log:q} 2>&1"


rule labels:
    input:
        table=lambda wc: str(config_check.resolve(config, config["cohorts"][wc.cohort]["labels"])),
    output:
        study_path("labels/{cohort}.csv"),
    params:
        command=get_labels_command,
    log:
        study_log("labels/{cohort}.log"),
    # upstream of the longest chain (calibrate -> discover -> compress -> ...): first
    priority: 10
    localrule: True
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        "{params.command:q} > {log:q} 2>&1"


rule all_tiles:
    """Target: tile every slide of every cohort (e.g. to check tissue detection first)."""
    input:
        lambda wc: get_all_tiles(),
