# The store (the config's `store:`): tiles, calibration tiles, discovery plans, compressed
# models and tile features kept under keys derived from what made them (pathtwt.io.store,
# keys from pathtwt.config.products), shared by every study and checkout naming it.
#
# A product already in the store is not made again: the rule that makes it is given the
# input STORED, which no rule makes and which never exists, so Snakemake takes the entry as
# it finds it (as it takes any existing file whose maker lacks an input) and plans no job
# for it; nothing of the study's own triggers (a newer slide, changed parameters) reaches it.
# An entry the plan makes is an `update()` output: Snakemake neither deletes one that
# another run published meanwhile nor removes it after a failure, and its job
# (`pathtwt store make`) makes it under the entry's lock, or leaves it as another run made it.
#
# The study's own folder links to the entries it uses (tiles/, thumbnails/, models/,
# discovery/, features/: the layout the MIL heads and the report read) and lists them in
# store.tsv.
import json
from types import SimpleNamespace

from pathtwt.io.store import views as store_views
from pathtwt.io.store.keys import KEY_PATTERN

STORE = PRODUCTS.store
STORE_DIR = str(STORE.root)
STORED = f"{STORE_DIR}/.stored-entries-are-not-made-again"


wildcard_constraints:
    tkey=KEY_PATTERN,
    ckey=KEY_PATTERN,
    dkey=KEY_PATTERN,
    mkey=KEY_PATTERN,
    ekey=KEY_PATTERN,
    skey=KEY_PATTERN,


def store_refusal():
    """One line when the store cannot be used: not a store, or not writable while this plan
    has entries to make in it (a store others made, read-only, serves a study it holds)."""
    from pathtwt.errors import StoreError

    if (STORE.root / "STORE.json").exists():
        try:
            STORE.check_marker()
        except StoreError as exc:
            return str(exc)
    return STORE.writable()


def stored(has, *keys):
    """Whether the store holds an entry, as the plan sees it (``has``: a Store method). A job
    submitted to a cluster parses the workflow again: it makes what it was planned to make,
    whatever the store holds by then (its `pathtwt store make` finds an entry another run
    made meanwhile and leaves it as it is)."""
    return not workflow.remote_exec and has(*keys)


def _owner(kind, key):
    """The names (cohort and slide, backbone and variant) of the first product with that key.
    A job that parses the workflow anew (on a cluster node, or a `run:` job in a Snakemake of
    its own) starts from its output's key: the study's keys are derived once to find it."""
    try:
        return PRODUCTS.names_of(kind, key)
    except KeyError:
        PRODUCTS.study_entries()
        for cohort in config["cohorts"]:
            for slide in get_slide_ids(cohort):
                PRODUCTS.tiles_key(cohort, slide)
    try:
        return PRODUCTS.names_of(kind, key)
    except KeyError:
        raise WorkflowError(f"{STORE_DIR}: no product of study {STUDY} has the {kind} key {key}") from None


def get_plan_json(kind, key):
    """An entry's inputs and names, for `pathtwt store make --record`."""
    return json.dumps({"kind": kind, "inputs": PRODUCTS.inputs_of(kind, key),
                       "names": dict(_owner(kind, key), study=STUDY)})


def model_wildcards(wildcards):
    """The (backbone, variant) names of a model entry's key, as a rule's wildcards."""
    return SimpleNamespace(**_owner("model", wildcards.mkey))


def backbone_wildcards(kind, key):
    return SimpleNamespace(backbone=_owner(kind, key)["backbone"])


# ---- tiles ------------------------------------------------------------------------------


def get_tiles_entry(cohort, slide):
    return STORE.tiles(PRODUCTS.tiles_key(cohort, slide))


def get_tiles_coords(cohort, slides=None):
    """The coords files (store entries) of a cohort's slides (all labelled ones by default)."""
    return [str(get_tiles_entry(cohort, s).coords) for s in (get_slide_ids(cohort) if slides is None else slides)]


def get_tile_inputs(wildcards):
    """The slide (and its ROI) of a tiles entry to make; STORED for one in the store."""
    if stored(STORE.has_tiles, wildcards.tkey):
        return {"stored": STORED}
    o = _owner("tiles", wildcards.tkey)
    return {"slide": str(get_slide_paths(o["cohort"])[o["slide"]]), "roi": get_roi(SimpleNamespace(**o))}


def tile_wildcards(wildcards):
    o = _owner("tiles", wildcards.tkey)
    return SimpleNamespace(cohort=o["cohort"], slide=o["slide"])


def get_study_tiles(cohort):
    """A study's view of a cohort's tiles (links named {slide}.h5), as calibration reads them."""
    return study_path(f"tiles/{cohort}")


# ---- calibration, discovery, models ---------------------------------------------------------


def get_calibration_entry(backbone):
    return str(STORE.calibration(PRODUCTS.calibration_key(backbone)).file)


def get_calibration_listing(ckey):
    """The coords files of a calibration, one a line: the study's links, named {slide}.h5
    under tiles/{cohort}/, so the draw reads them in the order of their names."""
    return study_path(f"calibration/{ckey}.coords.txt")


def get_calibration_tiles(wildcards):
    """The tiles entries of a calibration's slides: only the TRAINING split of each task's
    training cohort (or a cross-validated cohort's compression hold-out), so no validation,
    internal test or external slide can leak into compression."""
    backbone = _owner("calibration", wildcards.ckey)["backbone"]
    return [str(get_tiles_entry(c, s).coords) for c, s in PRODUCTS.calibration_slides(backbone)]


def get_calibration_cohort_views(wildcards):
    backbone = _owner("calibration", wildcards.ckey)["backbone"]
    return [get_study_tiles(c) for c in dict.fromkeys(c for c, _ in PRODUCTS.calibration_slides(backbone))]


def write_calibration_listing(wildcards, listing, record):
    from pathtwt.io.atomic import write_json_atomic

    backbone = _owner("calibration", wildcards.ckey)["backbone"]
    write_file_list([f"{get_study_tiles(c)}/{s}.h5" for c, s in PRODUCTS.calibration_slides(backbone)], listing)
    write_json_atomic(record, json.loads(get_plan_json("calibration", wildcards.ckey)))


def get_calibrate_inputs(wildcards):
    if stored(STORE.has_calibration, wildcards.ckey):
        return {"stored": STORED}
    return {"listing": get_calibration_listing(wildcards.ckey), "views": get_calibration_cohort_views(wildcards)}


def get_discovery_entry(backbone):
    return str(STORE.discovery(PRODUCTS.discovery_key(backbone)))


def get_discover_inputs(wildcards):
    if stored(STORE.has_folder_entry, STORE.discovery(wildcards.dkey)):
        return {"stored": STORED}
    b = backbone_wildcards("discovery", wildcards.dkey)
    return {"calibration": get_calibration_entry(b.backbone), "weights": get_teacher_inputs(b)}


def get_compress_inputs(wildcards):
    if stored(STORE.has_folder_entry, STORE.model(wildcards.mkey)):
        return {"stored": STORED}
    wc = model_wildcards(wildcards)
    inputs = {
        "calibration": get_calibration_entry(wc.backbone),
        # discovery first: its similarity matrix and figure belong to every TWT model
        "plan": f"{get_discovery_entry(wc.backbone)}/plan.json",
        "weights": get_teacher_inputs(wc),
    }
    if config["compress"]["stream"]:
        # the coords of the training tiles, streamed (the same training-split slides as the
        # calibration draw, less its held-out slides): the study's links, listed
        ckey = PRODUCTS.calibration_key(wc.backbone)
        inputs.update(listing=get_calibration_listing(ckey), views=get_calibration_cohort_views(SimpleNamespace(ckey=ckey)))
    return inputs


# ---- features ----------------------------------------------------------------------------


def get_extractor(backbone, variant):
    return PRODUCTS.extractor_key(backbone, variant)


def get_extract_manifest(wildcards):
    return study_path(f"manifests/extract/{wildcards.ekey}/{wildcards.skey}.tsv")


def extract_wildcards(wildcards):
    """backbone, variant (and cohort, slide) of an extraction job, from its keys."""
    names = dict(_owner("extractor", wildcards.ekey))
    if PER_SLIDE_EXTRACT:
        names.update(_owner("tiles", wildcards.tkey))
    else:
        names["cohort"] = _owner("features-set", wildcards.skey)["cohort"]
    return SimpleNamespace(**names)


def get_extract_inputs(wildcards):
    """A per-slide job's coords and slide, or a cohort job's manifest and the coords of the
    slides whose features are not in the store yet; STORED for an entry in the store."""
    wc = extract_wildcards(wildcards)
    model = get_model_inputs(wc)
    if PER_SLIDE_EXTRACT:
        if stored(STORE.has_features, wildcards.ekey, wildcards.tkey):
            return {"stored": STORED}
        return {"coords": str(STORE.tiles(wildcards.tkey).coords), "slide": get_slide(wc), "model": model}
    missing = [s for s in get_extracted_slide_ids(wc.cohort)
               if not STORE.has_features(wildcards.ekey, PRODUCTS.tiles_key(wc.cohort, s))]
    # a set whose slides are all there (one deleted by hand is embedded again)
    if stored(STORE.has_features_set, wildcards.ekey, wildcards.skey) and not missing:
        return {"stored": STORED}
    manifest = get_extract_manifest(wildcards)
    return {"manifest": manifest, "record": f"{manifest}.record.json", "coords": get_tiles_coords(wc.cohort, missing),
            "model": model}


def write_extract_manifest(wildcards, out, record):
    """slide, coords, features entry per line: the slides of one extraction job (its
    `pathtwt store make` embeds those not in the store), and the set's record."""
    from pathtwt.io.atomic import write_json_atomic

    wc = extract_wildcards(wildcards)
    slides = get_slide_paths(wc.cohort)
    write_file_list([f"{slides[s]}\t{get_tiles_entry(wc.cohort, s).coords}\t"
                     f"{STORE.features(wildcards.ekey, PRODUCTS.tiles_key(wc.cohort, s))}"
                     for s in get_extracted_slide_ids(wc.cohort)], out)
    write_json_atomic(record, json.loads(get_plan_json("features-set", wildcards.skey)))


def get_extract_jobs_args(wildcards, input, output):
    """`pathtwt store make`'s entry and record, then the extraction's own arguments (a
    cohort job's manifest is added by `pathtwt store make`: the slides it claims)."""
    extractor = ["--extractor", get_plan_json("extractor", wildcards.ekey)]
    if PER_SLIDE_EXTRACT:
        return ["--entry", output.features, "--record", get_plan_json("extractor", wildcards.ekey)]
    return ["--entry", output.features, "--record", f"@{input.record}", *extractor, "--manifest", input.manifest]


def get_extract_slide_args(wildcards, input, output):
    """A per-slide job's --coords, --out and slide (after `--`: a slide named like an option)."""
    if not PER_SLIDE_EXTRACT:
        return []
    return ["--coords", input.coords, "--out", output.features, "--", input.slide]


def get_extract_failures_arg(wildcards):
    """`pathtwt extract --failures`: the job's own table beside its log (each slide's entry
    records its failure; the study's failures table is made from the entries)."""
    job = wildcards.tkey if PER_SLIDE_EXTRACT else wildcards.skey
    return ["--failures", study_log(f"extract/{wildcards.ekey}/{job}.failures.tsv")] if RECORD_FAILURES else []


def get_features_view_inputs(wildcards):
    """What a cohort's features view links to: the cohort job's set entry while it is to be
    made or is in the store, else (slides all stored by other jobs) the slides' entries."""
    e = get_extractor(wildcards.backbone, wildcards.variant)
    keys = [PRODUCTS.tiles_key(wildcards.cohort, s) for s in get_extracted_slide_ids(wildcards.cohort)]
    slides = [str(STORE.features(e, k)) for k in keys]
    if PER_SLIDE_EXTRACT:
        return slides
    skey = PRODUCTS.set_key(wildcards.backbone, wildcards.variant, wildcards.cohort)
    if STORE.has_features_set(e, skey) or not all(STORE.has_features(e, k) for k in keys):
        return [str(STORE.features_set(e, skey))]
    return slides


def write_tiles_view(wildcards, output):
    store_views.tiles_view(STORE, Path(output.tiles), Path(output.thumbnails),
                           {s: PRODUCTS.tiles_key(wildcards.cohort, s) for s in get_slide_ids(wildcards.cohort)})


def write_features_view(wildcards, output):
    """The cohort's {slide}.h5 links to its slides' entries (each checked) and its failures table."""
    store_views.features_view(
        STORE, Path(output.features), get_extractor(wildcards.backbone, wildcards.variant),
        {s: PRODUCTS.tiles_key(wildcards.cohort, s) for s in get_extracted_slide_ids(wildcards.cohort)},
        Path(output.failures) if RECORD_FAILURES else None,
    )


def get_features_view_outputs():
    out = {"features": directory(study_path(layout.FEATURES_DIR))}
    if RECORD_FAILURES:
        out["failures"] = study_path("failures/{backbone}/{variant}/{cohort}.tsv")
    return out


# ---- the study's view and manifest ----------------------------------------------------------


def get_tiles_views():
    """The study's tiles/ and thumbnails/ views of every cohort its tasks use."""
    return [study_path(f"{kind}/{c}") for c in PRODUCTS.task_cohorts() for kind in ("tiles", "thumbnails")]


def get_model_views():
    return [study_path(layout.MODEL_DIR.format(backbone=b, variant=v)) for b in get_backbones()
            for v in get_compressed_variants(b)]


def get_discovery_views():
    return [study_path(layout.DISCOVERY_DIR.format(backbone=b)) for b in get_discovered_backbones()]


def write_store_manifest(out):
    """results/STUDY/store.tsv: every entry the study uses, by what the study calls it."""
    from pathtwt.io.atomic import write_text_atomic

    rows = ["entry\tkey\tnames\n"]
    for name, key, names in PRODUCTS.study_entries(sets=not PER_SLIDE_EXTRACT):
        rows.append(f"{name}\t{key}\t{' '.join(f'{k}={v}' for k, v in names.items())}\n")
    write_text_atomic(out, "".join(rows))


def check_shared_records():
    """The records of the few entries many jobs read (calibration tiles, discovery plans,
    models, extractors), checked against their keys when the plan is made; a slide's tiles
    and features are checked as the study's folder links them (views.smk)."""
    from pathtwt.errors import StoreError
    from pathtwt.io.store.records import read_checked

    records = {}
    for name, key, names in PRODUCTS.study_entries(sets=False):
        kind = names["kind"]
        if kind == "calibration":
            records[STORE.calibration(key).record] = ("calibration", key)
        elif kind in ("discovery", "models"):
            records[STORE.root / name / "entry.json"] = ("discovery" if kind == "discovery" else "model", key)
    for backbone in PRODUCTS.backbones:
        for variant in PRODUCTS.variants(backbone):
            extractor = PRODUCTS.extractor_key(backbone, variant)
            records[STORE.extractor(extractor) / "entry.json"] = ("extractor", extractor)
    try:
        for path, (kind, key) in records.items():
            if path.is_file():
                read_checked(path, kind=kind, key=key)
    except StoreError as exc:
        refuse(str(exc))


def say_store_plan():
    """The dry run's (and every run's) account of the store: what the study reuses and what
    it makes, by kind (once the demo cohorts it names are written)."""
    if any(config_check.demo_pending(config, c) for c in config["cohorts"]):
        return None
    counts = {}
    for name, key, names in PRODUCTS.study_entries(sets=False):
        kind = names["kind"]
        counts.setdefault(kind, [0, 0])[0 if STORE.has(name) else 1] += 1
    reused = ", ".join(f"{kind} {n[0]}" for kind, n in counts.items())
    made = ", ".join(f"{kind} {n[1]}" for kind, n in counts.items() if n[1]) or "nothing"
    logger.info(f"pathtwt store {STORE_DIR}: study {STUDY} reuses {reused} entries; makes {made} "
                f"(results/{STUDY}/store.tsv names them once made; pathtwt store ls lists the store)")
    return sum(n[1] for n in counts.values())


# ---- when the workflow is planned -----------------------------------------------------------


def refuse(line):
    """Stop the plan with one line (a user's matter, not a workflow bug: no traceback)."""
    print(f"Error: {line}", file=sys.stderr)
    sys.exit(1)


if not workflow.remote_exec:
    _before = store_views.products_before_the_store(RESULTS)
    if _before:
        refuse(f"{RESULTS}/ holds {', '.join(_before)} of its own, from a pathtwt before the store ({STORE_DIR}), where "
               f"this one keeps links into the store: set the folder aside (mv {RESULTS} {RESULTS}.before-store) and "
               "run again, which makes those products anew in the store (docs/workflow.md, 'Results from before the "
               "store')")
    _to_make = say_store_plan()  # None until the demo cohorts it names are written
    if _to_make is not None:
        check_shared_records()
    if _to_make and (_refusal := store_refusal()):
        refuse(_refusal)
    PRODUCTS.fingerprints.save()  # the slides hashed for this plan are not hashed at the next
