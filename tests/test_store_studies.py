"""Studies over one store, each run as `snakemake --cores 2 --configfile X.yaml`, on a few real
BACH images with a tiny teacher whose (random) weights are a file: a second study over the
same slides (in the same checkout, under other cohort and task names) plans no tiling,
compression or extraction, completes its report and keeps its own results apart; a third
that changes one value-changing setting plans exactly the products it reaches; a study in a
second checkout naming the first's store plans nothing stored; two studies from two
checkouts started together on one store make each entry once; an extraction killed after
some slides keeps them and its rerun embeds only the rest; an entry whose record was
tampered with, and a study folder from before the store, are refused in one line."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from conftest import SHARED, _need
from test_workflow_dag import job_counts

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
# the rules that make store entries (and their bookkeeping): none is planned for a stored product
MAKERS = ("tile", "calibration_list", "calibrate", "discover", "compress", "extract_manifest", "extract")


def _cohort(root: Path) -> Path:
    """Eight BACH images, four normal and four invasive, labelled 0 and 1."""
    bach = _need(SHARED / "data" / "bach" / "labels.csv").parent
    table = pd.read_csv(bach / "labels.csv", dtype=str)
    picked = pd.concat([table[table.label == "0"].head(4), table[table.label == "3"].head(4)])
    (root / "images").mkdir(parents=True)
    for sid in picked.slide_id:
        shutil.copy(bach / "images" / f"{sid}.jpeg", root / "images" / f"{sid}.jpeg")
    rows = [f"{sid},{int(label == '3')}" for sid, label in zip(picked.slide_id, picked.label)]
    (root / "labels.csv").write_text("slide_id,label\n" + "\n".join(rows) + "\n")
    return root


def _weights(path: Path, seed: int) -> Path:
    """vit-s14-tiny's random weights (seeded) as a weights file: a teacher keyed by content."""
    from safetensors.torch import save_file

    from pathtwt.models.registry import create_backbone

    model = create_backbone("vit-s14-tiny", pretrained=False, init_seed=seed).model
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def _config(s, study: str, cohort: str = "bach", task: str = "grade", **changes) -> dict:
    cfg = {
        "study": study,
        "cohorts": {cohort: {"slides": str(s.data / "images"), "labels": str(s.data / "labels.csv"),
                             "extensions": [".jpeg"], "mpp_fallback": 0.42,
                             "draw_split": {"fractions": [0.5, 0.25, 0.25], "seed": 0},
                             "tiling": {"target_mpp": 0.5, "tile_size": 224, "tissue": "fraction", "min_tissue": 0.3}}},
        "tasks": {task: {"cohort": cohort, "classes": 2, "metric": "accuracy", "protocol": "grading"}},
        "backbones": {"vit-s14-tiny": {"weights": str(s.weights)}},
        "variants": {"uncompressed": {"method": "none"}, "twt-2": {"method": "twt", "depth": 2, "steps": 2}},
        "calibration": {"n_tiles": 32, "holdout": 0.25, "seed": 0},
        "discovery": {"batch_size": 16},
        "compress": {"batch_size": 8, "audition_steps": 1, "augment": False, "device": "cpu", "threads": 1},
        "extract": {"device": "cpu", "batch_size": 32, "threads": 1},
        "mil": {"heads": ["meanpool"], "seeds": [0], "device": "cpu", "threads": 1},
    }
    for dotted, value in changes.items():
        node = cfg
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return cfg


def _snakemake(work: Path, cfg: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    path = work / f"{cfg['study']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = subprocess.run([str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(work), "--cores", "2",
                          "--configfile", str(path), *args], capture_output=True, text=True, timeout=600)
    if check:
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def _files(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` (links followed) with its modification time (ns)."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


def _made(res: subprocess.CompletedProcess) -> dict[str, int]:
    """The store-making jobs a dry run plans."""
    out = res.stdout + res.stderr
    if "Nothing to be done" in out:
        return {}
    return {rule: n for rule, n in job_counts(res.stdout).items() if rule in MAKERS}


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """The first study, run: it makes every entry."""
    root = tmp_path_factory.mktemp("store-studies")
    s = SimpleNamespace(root=root, data=_cohort(root / "data"), weights=_weights(root / "tiny.safetensors", 0),
                        work=root / "checkout")
    s.work.mkdir()
    s.store = s.work / "results" / "store"
    _snakemake(s.work, _config(s, "first"))
    return s


def test_a_second_study_over_the_same_slides_makes_nothing_and_completes_its_report(first):
    results = first.work / "results"
    before = _files(results / "first")
    # another question of the same slides, under other names
    second = _config(first, "second", cohort="bach-again", task="second-look", **{"mil.seeds": [1]})
    plan = _snakemake(first.work, second, "-n")
    assert _made(plan) == {}
    assert ("study second reuses tiles 8, calibration 1, discovery 1, models 1, features 16 entries; makes nothing"
            in plan.stdout + plan.stderr)
    _snakemake(first.work, second)
    page = (results / "second" / "report" / "index.html").read_text()
    assert "Task: second-look" in page and "Task: grade" not in page
    table = pd.read_csv(results / "second" / "report" / "second-look.csv")
    assert {"uncompressed", "twt-2"} <= set(" ".join(map(str, table.values.ravel())).replace(",", " ").split())
    # each study keeps its own results: the first's are as they were, its report shows its task only
    assert _files(results / "first") == before and "second-look" not in (results / "first" / "report" / "index.html").read_text()
    assert "bach-again" not in "".join(_files(results / "first")) and "/bach/" not in "".join(_files(results / "second"))
    assert sorted(p.name for p in results.iterdir()) == ["first", "second", "store"]
    assert sorted(p.name for p in (first.work / "logs").iterdir()) == ["first", "second"]
    # both studies name the same entries, and link to them
    entries = [set(pd.read_csv(results / s / "store.tsv", sep="\t").entry) for s in ("first", "second")]
    assert entries[0] == entries[1] and any(e.startswith("models/") for e in entries[0])
    model = results / "second" / "models" / "vit-s14-tiny" / "twt-2" / "model.safetensors"
    assert model.is_symlink() and Path(os.path.realpath(model)).parent.parent == (first.store / "models").resolve()
    # the first study is complete as it was
    assert "Nothing to be done" in _snakemake(first.work, _config(first, "first"), "-n").stdout


@pytest.mark.parametrize("change, made", [
    ({"extract.precision": "fp32"}, {"extract_manifest": 2, "extract": 2}),
    ({"cohorts.bach.tiling.tile_size": 256},
     {"tile": 8, "calibration_list": 1, "calibrate": 1, "discover": 1, "compress": 1, "extract_manifest": 2, "extract": 2}),
    ({"cohorts.bach.tiling.target_mpp": 0.6},
     {"tile": 8, "calibration_list": 1, "calibrate": 1, "discover": 1, "compress": 1, "extract_manifest": 2, "extract": 2}),
    ({"backbones.vit-s14-tiny.weights": "other"}, {"discover": 1, "compress": 1, "extract_manifest": 2, "extract": 2}),
], ids=["precision", "tile-size", "pixel-size", "weights"])
def test_a_third_study_plans_exactly_what_its_changed_setting_reaches(first, change, made):
    if change.get("backbones.vit-s14-tiny.weights") == "other":
        change = {"backbones.vit-s14-tiny.weights": str(_weights(first.root / "other.safetensors", 1))}
    assert _made(_snakemake(first.work, _config(first, "third", **change), "-n")) == made


def test_weights_replaced_in_place_are_keyed_anew(first):
    original = first.weights.read_bytes()
    try:
        _weights(first.weights, 2)
        plan = _snakemake(first.work, _config(first, "replaced"), "-n")
        assert _made(plan) == {"discover": 1, "compress": 1, "extract_manifest": 2, "extract": 2}
        assert f"weights {first.weights} changed since they were last hashed" in plan.stdout + plan.stderr
    finally:
        first.weights.write_bytes(original)
    assert _made(_snakemake(first.work, _config(first, "replaced"), "-n")) == {}


def test_a_study_in_a_second_checkout_naming_the_store_plans_nothing_stored(first):
    other = first.root / "second-checkout"
    other.mkdir()
    plan = _snakemake(other, _config(first, "fourth", store=str(first.store)), "-n")
    assert _made(plan) == {} and f"pathtwt store {first.store}: study fourth reuses tiles 8" in plan.stdout + plan.stderr


def test_two_studies_from_two_checkouts_at_once_make_each_entry_once(first):
    """Both started together on a fresh store: both plan every entry, and each is made by one
    run while the other's job waits for it and uses it (its log says so)."""
    store = first.root / "lab-store"
    runs = []
    for name in ("left", "right"):
        work = first.root / f"checkout-{name}"
        work.mkdir()
        path = work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(_config(first, name, store=str(store))))
        runs.append((work / "logs" / name, subprocess.Popen(
            [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(work), "--cores", "2",
             "--configfile", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for _, proc in runs:
        out = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, out[-3000:]
    logs = [folder for folder, _ in runs]

    def entry_logs(folder: Path) -> set[str]:
        return {str(p.relative_to(folder)) for rule in ("tile", "calibrate", "discover", "compress")
                for p in (folder / rule).glob("*.log") if not p.name.endswith(".list.log")}

    both = entry_logs(logs[0]) & entry_logs(logs[1])
    assert {rel.split("/")[0] for rel in both} == {"tile", "calibrate", "discover", "compress"}
    made_twice = [rel for rel in both if not any("made by another run meanwhile" in (f / rel).read_text() for f in logs)]
    assert made_twice == []
    # each slide's features embedded once in all (8 slides, 2 models), whichever run claimed it
    embedded = [int(n) for f in logs for log in (f / "extract").rglob("*.log")
                for n in re.findall(r"embedding (\d+) of", log.read_text())]
    assert sum(embedded) == 16
    # nothing half-made, locked or beating is left; the two studies report the same cells
    leftovers = [p for p in store.rglob(".*") if p.is_file()]
    assert leftovers == []
    tables = [pd.read_csv(f.parent.parent / "results" / f.name / "report" / "grade.csv") for f in logs]
    pd.testing.assert_frame_equal(tables[0], tables[1])


def test_a_killed_extraction_keeps_its_slides_and_the_rerun_embeds_only_the_rest(first):
    from fault_injection import Kill, run_and_kill

    # features in fp32 (a new entry per slide), on the tiles the store holds
    cfg = _config(first, "killed", variants={"uncompressed": {"method": "none"}},
                  extract={"precision": "fp32", "device": "cpu", "batch_size": 4, "threads": 1})
    path = first.work / "killed.yaml"
    path.write_text(yaml.safe_dump(cfg))
    command = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(first.work), "--cores", "2",
               "--configfile", str(path)]
    # SIGKILL to the whole run (Snakemake and its job) as soon as a slide's features are published
    start = time.time()
    killed = run_and_kill(command, Kill(after="features/*/[0-9a-f]*.h5"), watch=first.store, timeout=300)
    assert killed.killed, killed.stderr[-2000:]
    fresh = next(p for p in (first.store / "features").iterdir()
                 if any(f.stat().st_mtime >= start for f in p.glob("[0-9a-f]*.h5")))
    # published names only: pathlib's glob also matches the hidden temporary file of the slide
    # being written when the kill came (".NAME.tmp-HOST-PID-XXXX.h5", pathtwt.io.atomic)
    done = {p.name: p.stat().st_mtime_ns for p in fresh.glob("[0-9a-f]*.h5")}
    assert 0 < len(done) < 8 and not list(fresh.glob("sets/*.json"))  # the job's own entry is not there
    assert not [p for p in fresh.iterdir() if p.name.startswith(".") and ".tmp-" not in p.name]
    _snakemake(first.work, cfg, "--unlock")
    _snakemake(first.work, cfg)
    log = next((first.work / "logs" / "killed" / "extract" / fresh.name).glob("*[0-9a-f].log")).read_text()
    assert f"embedding {8 - len(done)} of {8 - len(done)} missing slide(s)" in log
    assert {p: (fresh / p).stat().st_mtime_ns for p in done} == done  # the finished slides were kept as they were
    # every slide published and no temporary left: the rerun removed the killed writer's
    assert len(list(fresh.glob("*.h5"))) == 8 and len(list((fresh / "sets").glob("*.json"))) == 1
    assert (first.work / "results" / "killed" / "report" / "index.html").is_file()


def test_a_tampered_entry_and_a_folder_from_before_the_store_are_refused(first):
    record = next((first.store / "tiles").glob("*.json"))
    text = record.read_text()
    try:
        record.write_text(text.replace('"tile_size": 224.0', '"tile_size": 256.0'))
        res = _snakemake(first.work, _config(first, "tampered"), check=False)
        assert res.returncode != 0
        line = next(x for x in (res.stdout + res.stderr).splitlines() if f"{record.name}: its recorded inputs give key" in x)
        assert "delete the entry" in line
        assert not (first.work / "results" / "tampered" / "tiles" / "bach").exists()
    finally:
        record.write_text(text)
    # a model's record, read by many jobs, is checked when the plan is made: before any job
    record = next((first.store / "models").glob("*/entry.json"))
    text = record.read_text()
    try:
        record.write_text(text.replace('"steps": 2.0', '"steps": 3.0'))
        res = _snakemake(first.work, _config(first, "tampered"), "-n", check=False)
        errors = [x for x in res.stderr.splitlines() if x.startswith("Error:")]
        assert res.returncode == 1 and "Job stats" not in res.stdout and len(errors) == 1
        assert f"{record.parent.name}/entry.json: its recorded inputs give key" in errors[0]
    finally:
        record.write_text(text)
    old = first.work / "results" / "old"
    (old / "features" / "vit-s14-tiny" / "uncompressed" / "bach").mkdir(parents=True)
    (old / "features" / "vit-s14-tiny" / "uncompressed" / "bach" / "n002.h5").write_bytes(b"")  # a file, not a link
    res = _snakemake(first.work, _config(first, "old"), "-n", check=False)
    assert res.returncode == 1 and "Job stats" not in res.stdout
    errors = [x for x in res.stderr.splitlines() if x.startswith("Error:")]
    assert len(errors) == 1 and "results/old/ holds features/ of its own, from a pathtwt before the store" in errors[0]
    assert "mv results/old results/old.before-store" in errors[0]
