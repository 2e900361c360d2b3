# The synthetic demo cohorts (demo config only). A checkpoint: the slide lists of the
# demo cohorts are known only once their label tables exist.


checkpoint demo_slides:
    output:
        get_demo_labels(),
    params:
        out=lambda wc: get_demo_data(),
        scale=config["demo"]["scale"],
        seed=config["demo"]["seed"],
    log:
        study_log("demo/make_slides.log"),
    # upstream of the longest chain (calibrate -> discover -> compress -> ...): first
    priority: 10
    threads: 2
    resources:
        mem_mb=2000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "pathtwt demo make-slides --out {params.out:q} --scale {params.scale:q} --seed {params.seed:q} --workers {threads} > {log:q} 2>&1"
