# Tissue detection and tile coordinates, one job per slide whose tiles are not in the store
# (store.smk: the study's tiles/{cohort}/ and thumbnails/{cohort}/ link to them); label tables normalised
# to the slide_id,label,split layout the MIL step reads (with the drawn split recorded
# there when the cohort's table has none).
#
# A slide takes seconds to tile, so on a cluster tile jobs are submitted in groups
# (`group-components: tile=N` in the profiles): one SLURM job tiles N slides one after
# the other instead of N submissions of a few seconds each.


rule tile:
    """A slide's tiles entry in the store (coords, thumbnail and record), keyed by the
    slide's fingerprint and its cohort's tiling settings."""
    input:
        unpack(get_tile_inputs),
    output:
        coords=update(f"{STORE_DIR}/tiles/{{tkey}}.coords.h5"),
        thumbnail=update(
            report(
                f"{STORE_DIR}/tiles/{{tkey}}.thumbnail.png",
                caption="../report/thumbnail.rst",
                category="Tissue",
                labels={"tiles entry": "{tkey}"},
            )
        ),
    params:
        entry=lambda wc: str(STORE.tiles(wc.tkey).record),
        record=lambda wc: get_plan_json("tiles", wc.tkey),
        mpp=lambda wc: get_tiling(tile_wildcards(wc).cohort)["target_mpp"],
        tile_size=lambda wc: get_tiling(tile_wildcards(wc).cohort)["tile_size"],
        tissue=lambda wc: get_tiling(tile_wildcards(wc).cohort)["tissue"],
        min_tissue=lambda wc: get_tiling(tile_wildcards(wc).cohort)["min_tissue"],
        slide_mpp=lambda wc: get_mpp_fallback_arg(tile_wildcards(wc)),
        modality=lambda wc: get_modality_args(tile_wildcards(wc)),
        roi=lambda wc, input: ["--roi", *input.roi] if input.roi else [],
    log:
        study_log("tile/{tkey}.log"),
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
        "pathtwt store make --entry {params.entry:q} --record {params.record:q}"
        " --files {output.coords:q} {output.thumbnail:q} --check-slide {input.slide:q} --"
        " pathtwt tile --out {output.coords:q} --thumbnail {output.thumbnail:q}"
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
        [study_path(f"{kind}/{cohort}") for cohort in config["cohorts"] for kind in ("tiles", "thumbnails")],
