# A study's view of the store: its results folder links to the entries it used, laid out as
# its readers expect them (tiles/, thumbnails/, models/, discovery/, features/), each entry
# checked against its key as it is linked; store.tsv lists them. Milliseconds of work each,
# run in the Snakemake process (see `onstart` in common.smk).


rule view_tiles:
    """A cohort's tiles and thumbnails in the study's folder: links to their entries."""
    input:
        lambda wc: get_tiles_coords(wc.cohort),
    output:
        tiles=directory(study_path("tiles/{cohort}")),
        thumbnails=directory(study_path("thumbnails/{cohort}")),
    log:
        study_log("views/tiles/{cohort}.log"),
    localrule: True
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    run:
        write_tiles_view(wildcards, output)


rule view_features:
    """A cohort's features by a backbone variant in the study's folder ({slide}.h5 links to
    the slides' entries, each checked), and its failures table."""
    input:
        get_features_view_inputs,
    output:
        **get_features_view_outputs(),
    log:
        study_log("views/features/{backbone}/{variant}/{cohort}.log"),
    localrule: True
    threads: 1
    resources:
        mem_mb=500,
        runtime=10,
    run:
        write_features_view(wildcards, output)


rule view_model:
    """A compressed variant's model in the study's folder: links to its entry's files."""
    input:
        lambda wc: f"{get_model_dir(wc.backbone, wc.variant)}/model.json",
    output:
        directory(study_path(layout.MODEL_DIR)),
    log:
        study_log("views/models/{backbone}/{variant}.log"),
    localrule: True
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    run:
        store_views.entry_view(Path(output[0]), Path(get_model_dir(wildcards.backbone, wildcards.variant)), "model")


rule view_discovery:
    """A backbone's discovery (plan, similarity matrix and figure) in the study's folder."""
    input:
        lambda wc: f"{get_discovery_entry(wc.backbone)}/plan.json",
    output:
        directory(study_path(layout.DISCOVERY_DIR)),
    log:
        study_log("views/discovery/{backbone}.log"),
    localrule: True
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    run:
        store_views.entry_view(Path(output[0]), Path(get_discovery_entry(wildcards.backbone)), "discovery")


rule store_manifest:
    """results/STUDY/store.tsv: the store entries the study used."""
    input:
        get_tiles_views(),
        get_model_views(),
        get_discovery_views(),
        [get_features_dir(b, v, c) for b in get_backbones() for v in get_variants(b) for c in PRODUCTS.task_cohorts()],
    output:
        study_path("store.tsv"),
    log:
        study_log("store.log"),
    localrule: True
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    run:
        write_store_manifest(output[0])
