"""config/bach.yaml, the real study on the BACH images: it checks and plans; its split is
drawn by image, seeded and stratified by class, and recorded; an external cohort of
BACH-like images drops in by YAML alone; bad cohorts stop before any job with one line
naming the file or key."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from PIL import Image

from conftest import SHARED, SHARED_BESIDE_REPO, _need
from pathtwt.config import check
from pathtwt.errors import ConfigError
from test_workflow_dag import job_counts, keyed_stems, snakemake, tiles_slides

REPO = Path(__file__).resolve().parents[1]
BACH = SHARED / "data" / "bach"
PATHTWT = Path(sys.executable).parent / "pathtwt"
VARIANTS = ["uncompressed", "random-init", "twt-6", "twt-4", "truncation-6", "linear-6"]


@pytest.fixture(scope="module")
def bach() -> Path:
    return _need(BACH / "labels.csv").parent


def bach_config(bach: Path) -> dict:
    """config/bach.yaml with its ../shared paths made absolute (tests run elsewhere)."""
    cfg = yaml.safe_load((REPO / "config" / "bach.yaml").read_text())
    cfg["cohorts"]["bach"].update(slides=str(bach / "images"), labels=str(bach / "labels.csv"))
    cfg["backbones"]["vit-s14-imgfocus"]["weights"] = str(SHARED / "weights" / "vit_s14_imgfocus.safetensors")
    return cfg


def small_cohort(root: Path, bach: Path, per_class: int = 2, rows: list[str] | None = None) -> Path:
    """A folder of a few BACH images (copied) and a label table in BACH's format."""
    table = pd.read_csv(bach / "labels.csv", dtype=str)
    picked = table.groupby("label").head(per_class)
    (root / "images").mkdir(parents=True)
    for sid in picked["slide_id"]:
        shutil.copy(bach / "images" / f"{sid}.jpeg", root / "images" / f"{sid}.jpeg")
    lines = ["slide_id,label,class_name"] + (rows if rows is not None else [",".join(r) for r in picked.values])
    (root / "labels.csv").write_text("\n".join(lines) + "\n")
    return root


def check_cohort(config: dict) -> dict:
    cfg = check.validate_schema(config, source="test")
    return check.check_config(cfg, source="test")


def test_bach_yaml_checks_and_plans_the_study(bach, tmp_path):
    if not SHARED_BESIDE_REPO:
        pytest.skip("config/bach.yaml names ../shared, which is not beside this checkout")
    res = subprocess.run([str(PATHTWT), "check-config", "config/bach.yaml"], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "'compress': 40" in res.stdout and "'cv': 160" in res.stdout
    cfg_path = tmp_path / "bach.yaml"
    cfg_path.write_text(yaml.safe_dump(bach_config(bach)))
    plan = snakemake(tmp_path / "work", "-n", "-p", "--configfile", str(cfg_path))
    counts = job_counts(plan.stdout)
    # 200 images tiled; 4 distilled variants (uncompressed and random-init need none);
    # 6 variants extracted; ABMIL, TransMIL and meanpool per variant and test fold, one seed each
    assert counts["tile"] == 200 and counts["compress"] == 4 and counts["extract"] == 6
    assert counts["train_mil_fold"] == 6 * 3 * 5 and "train_mil" not in counts and counts["labels"] == 1
    assert counts["summarize_mil"] == 6 * 3
    text = plan.stdout + plan.stderr
    assert "pathtwt labels split" in text and "--folds 5 --holdout 0.2 --seed 0" in text
    assert "--fractions" not in text
    assert "--backbone vit-s14-imgfocus --random-init" in text  # the floor is extracted like a variant
    assert "--slide-mpp 0.42" in text and "--precision auto" in text
    # distilled on the fit tiles in memory, augmentation off: the teacher's targets once per tile
    assert "--augment off" in text and "--train-coords" not in text
    steps = yaml.safe_load((REPO / "config" / "bach.yaml").read_text())["compress"]["steps"]
    assert f"--steps {steps}" in text
    mil = [line for line in plan.stdout.splitlines() if "pathtwt train-mil" in line]
    assert {re.search(r"--aggregator (\S+)", line).group(1) for line in mil} == {"abmil", "transmil", "meanpool"}
    assert {re.search(r"--fold (\d)", line).group(1) for line in mil} == {str(f) for f in range(5)}
    # compression sees the 40 hold-out images only; extraction the 160 the folds report on
    table = check.cohort_label_table(check.validate_schema(bach_config(bach), source="t"), "bach")
    held = {s for s, sp in zip(table.slide_ids, table.splits) if sp == "compress"}
    slides = tiles_slides(plan.stdout)
    block = plan.stdout.split("rule calibration_list:")[1]
    calib = keyed_stems(re.search(r"input: (.*)", block).group(1), slides)
    assert calib == held and len(held) == 40
    block = plan.stdout.split("rule extract:")[1]
    extracted = keyed_stems(re.search(r"input: (.*)", block).group(1), slides)
    assert len(extracted) == 160 and not extracted & held


def test_the_drawn_folds_are_stratified_seeded_and_what_the_workflow_records(bach, tmp_path):
    cfg = check.validate_schema(bach_config(bach), source="test")
    table = check.cohort_label_table(cfg, "bach")
    out = tmp_path / "labels.csv"
    assert subprocess.run([str(PATHTWT), "labels", "split", str(bach / "labels.csv"), "--folds", "5", "--holdout",
                           "0.2", "--seed", "0", "--out", str(out)], capture_output=True).returncode == 0
    written = pd.read_csv(out, dtype={"slide_id": str})
    assert list(written.columns[:4]) == ["slide_id", "label", "split", "fold"] and "class_name" in written.columns
    assert dict(zip(written.slide_id, written.split)) == dict(zip(table.slide_ids, table.splits))
    assert dict(zip(written.slide_id, written.fold)) == dict(zip(table.slide_ids, table.folds))
    counts = written.groupby(["fold", "label"]).size().unstack()
    assert (counts.loc[-1] == 10).all() and (counts.drop(index=-1) == 8).all().all()
    other = tmp_path / "other.csv"
    subprocess.run([str(PATHTWT), "labels", "split", str(bach / "labels.csv"), "--folds", "5", "--holdout", "0.2",
                    "--seed", "1", "--out", str(other)], check=True, capture_output=True)
    assert (pd.read_csv(other).fold != written.fold).any()  # the seed moves images


def test_an_external_cohort_drops_in_by_yaml_alone(bach, tmp_path):
    ext = small_cohort(tmp_path / "ext", bach)
    base = bach_config(bach)
    base_path = tmp_path / "base.yaml"
    base_path.write_text(yaml.safe_dump(base))
    before = job_counts(snakemake(tmp_path / "w1", "-n", "--configfile", str(base_path)).stdout)
    grown = bach_config(bach)
    grown["cohorts"]["bach-external"] = {
        "slides": str(ext / "images"), "labels": str(ext / "labels.csv"), "extensions": [".jpeg"],
        "mpp_fallback": 0.42, "tiling": grown["cohorts"]["bach"]["tiling"],
    }
    grown["tasks"]["bach"]["external"] = ["bach-external"]
    grown_path = tmp_path / "grown.yaml"
    grown_path.write_text(yaml.safe_dump(grown))
    plan = snakemake(tmp_path / "w2", "-n", "-p", "--configfile", str(grown_path))
    after = job_counts(plan.stdout)
    diff = {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}
    n = len(VARIANTS)
    # the external images are copies of BACH images the study tiles already: the same tiles
    # entries (a slide's tiles are keyed by its bytes, not its name), so no tile job of their own
    assert {k: v for k, v in diff.items() if v} == {
        "labels": 1, "extract": n, "extract_manifest": n, "view_features": n, "view_tiles": 1, "total": 1 + 3 * n + 1}
    mil = [line for line in plan.stdout.splitlines() if "pathtwt train-mil" in line]
    assert len(mil) == n * 3 * 5 and all("--seed 0 " in line for line in mil)  # a job per head and fold
    assert all("--external bach-external=results/grown/features/vit-s14-imgfocus/" in line for line in mil)
    # its label table has no split column: every image is tested
    table = check.check_config(check.validate_schema(grown, source="t"), source="t")["bach-external"]
    assert set(table.splits) == {"test"} and len(table.slide_ids) == 8

    # the affected stages on the real files: the external cohort's labels and tiles (two of them,
    # by their store entries; the study's tiles/ folder links to them)
    work = tmp_path / "w2"
    two = [k for k, stem in tiles_slides(plan.stdout).items() if stem in {p.stem for p in sorted((ext / "images").iterdir())[:2]}]
    targets = ["results/grown/labels/bach-external.csv"] + [f"results/store/tiles/{k}.coords.h5" for k in two]
    snakemake(work, *targets, "--cores", "1", "--configfile", str(grown_path))  # --configfile takes several
    labels = pd.read_csv(work / targets[0])
    assert set(labels.split) == {"test"} and len(labels) == 8
    import h5py

    with h5py.File(work / targets[1], "r") as f:
        assert f.attrs["reader"] == "image" and len(f["coords"]) > 10


def test_a_local_run_schedules_on_job_events_not_every_second(bach, tmp_path):
    """Snakemake's default job rate limit re-evaluates every ready job once a second while
    any job runs (workflow/rules/common.smk); a local run drops it and schedules when a
    job starts or ends, while an explicit --max-jobs-per-timespan is kept."""
    cfg_path = tmp_path / "bach.yaml"
    cfg_path.write_text(yaml.safe_dump(bach_config(bach)))
    sids = sorted(p.stem for p in (bach / "images").iterdir())[:4]

    keys = {stem: k for k, stem in tiles_slides(snakemake(tmp_path / "plan", "-n", "-p", "all_tiles", "--configfile",
                                                          str(cfg_path)).stdout).items()}

    def run(workdir: Path, *extra: str) -> tuple[str, int]:
        tiles = [f"results/store/tiles/{keys[sid]}.coords.h5" for sid in sids]
        res = snakemake(workdir, *tiles, "--cores", "1", "--verbose", "--configfile", str(cfg_path), *extra)
        assert all((workdir / t).exists() for t in tiles)
        log = res.stdout + res.stderr
        return log, log.count("Ready jobs:")  # one line per scheduling round with jobs waiting

    dropped = "local run: jobs are scheduled when a job starts or ends (no job rate limit)"
    log, on_events = run(tmp_path / "default")
    assert dropped in log
    assert on_events <= len(sids) + 1  # a round per job event, no more
    log, limited = run(tmp_path / "explicit", "--max-jobs-per-timespan", "1000/1s")
    assert dropped not in log  # the user's own limit is kept, with its extra rounds
    assert limited >= on_events


def test_a_local_run_keeps_its_bookkeeping_jobs_in_process(bach, tmp_path):
    """A `run:` job (here the calibration file list, beside real tile jobs) runs in the
    Snakemake process instead of a spawned Snakemake that parses the workflow again
    (workflow/rules/common.smk); the list it writes names every tile file of the
    compression hold-out, and only those."""
    root = small_cohort(tmp_path / "small", bach, per_class=4)
    cfg = bach_config(bach)
    cfg["cohorts"]["bach"].update(slides=str(root / "images"), labels=str(root / "labels.csv"),
                                  draw_split={"folds": 3, "holdout": 0.25, "seed": 0})
    cfg_path = tmp_path / "small.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    plan = snakemake(tmp_path / "run", "-n", "--configfile", str(cfg_path)).stdout
    listing = re.search(r"rule calibration_list:\n(?:.*\n)*?\s+output: (\S+\.coords\.txt)", plan).group(1)
    res = snakemake(tmp_path / "run", listing, "--cores", "2", "--verbose", "--configfile", str(cfg_path))
    log = res.stdout + res.stderr
    assert "local bookkeeping jobs (run: blocks) run in this process, not in spawned ones" in log
    assert "rule calibration_list" in log and "spawned job" not in log  # Snakemake logs each job it spawns
    listed = (tmp_path / "run" / listing).read_text().split()
    assert listed and all(p.endswith(".h5") and (tmp_path / "run" / p).is_file() for p in listed)
    table = check.cohort_label_table(check.validate_schema(cfg, source="t"), "bach")
    assert {Path(p).stem for p in listed} == {s for s, sp in zip(table.slide_ids, table.splits) if sp == "compress"}
    assert len(listed) == 4  # one image per class


# ---- bad input: one line naming the file or key, before any job ----------------------


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def _cohort_config(root: Path, **cohort) -> dict:
    entry = {"slides": str(root / "images"), "labels": str(root / "labels.csv"), "extensions": [".jpeg", ".png"],
             "mpp_fallback": 0.42, "draw_split": {"fractions": [0.5, 0.0, 0.5], "seed": 0}}
    entry.update(cohort)
    return {"cohorts": {"c": entry}, "tasks": {"t": {"cohort": "c", "classes": 4, "metric": "qwk"}}}


def test_bad_cohorts_are_refused_naming_file_and_key(bach, tmp_path):
    root = small_cohort(tmp_path / "ok", bach)
    assert len(check_cohort(_cohort_config(root))["c"].slide_ids) == 8

    # an image with no pixel size
    with pytest.raises(ConfigError) as err:
        check_cohort(_cohort_config(root, mpp_fallback=None))
    assert "cohorts.c.mpp_fallback" in _one_line(err) and ".jpeg" in str(err.value)

    # a label table naming an image that is absent
    (root / "labels.csv").write_text((root / "labels.csv").read_text() + "n999,0,normal\n")
    with pytest.raises(ConfigError) as err:
        check_cohort(_cohort_config(root))
    assert "n999" in _one_line(err) and "missing on disk" in str(err.value) and str(root / "labels.csv") in str(err.value)

    # an image listed twice
    lines = (root / "labels.csv").read_text().splitlines()[:-1]
    (root / "labels.csv").write_text("\n".join(lines + [lines[1]]) + "\n")
    with pytest.raises(ConfigError) as err:
        check_cohort(_cohort_config(root))
    assert lines[1].split(",")[0] in _one_line(err) and "more than once" in str(err.value)

    # a class with no training images after the split: one invasive image, drawn into test
    kept = [line for line in lines[1:] if line.split(",")[1] != "3"] + [next(l for l in lines if l.split(",")[1] == "3")]
    (root / "labels.csv").write_text("\n".join(lines[:1] + kept) + "\n")
    with pytest.raises(ConfigError) as err:
        check_cohort(_cohort_config(root, draw_split={"fractions": [0.3, 0.0, 0.7], "seed": 0}))
    message = _one_line(err)
    assert "class(es) 3 " in message and "'train'" in message and "cohorts.c.draw_split" in message
    # ... or a split column that puts no image of a class in train
    table = pd.read_csv(bach / "labels.csv", dtype=str).groupby("label").head(2)
    table["split"] = ["test" if lab == "1" else "train" for lab in table["label"]]
    table.to_csv(root / "labels.csv", index=False)
    with pytest.raises(ConfigError) as err:
        check_cohort(_cohort_config(root, draw_split=None))
    assert "class(es) 1 " in _one_line(err) and "split column" in str(err.value)


def test_mixed_pixel_sizes_without_per_image_sizes_are_refused_saying_which(bach, tmp_path):
    root = small_cohort(tmp_path / "mixed", bach)
    stated = sorted((root / "images").iterdir())[:2]
    for path in stated:  # these two state 0.25 um/px in their files; the rest take the cohort's 0.42
        with Image.open(path) as im:
            im.save(path.with_suffix(".png"), dpi=(25400 / 0.25, 25400 / 0.25))
        path.unlink()
    with pytest.raises(ConfigError) as err:
        check_cohort(_cohort_config(root))
    message = _one_line(err)
    assert "0.25 um/px: 2 image(s)" in message and "0.42 um/px: 6 image(s)" in message
    assert all(p.stem in message for p in stated) and "cohorts.c" in message
    # every image stating its own size is fine: each is tiled at its own scale
    for path in sorted((root / "images").glob("*.jpeg")):
        with Image.open(path) as im:
            im.save(path.with_suffix(".png"), dpi=(25400 / 0.5, 25400 / 0.5))
        path.unlink()
    assert len(check_cohort(_cohort_config(root))["c"].slide_ids) == 8


def test_a_corrupt_jpeg_is_refused_by_name_before_any_job(bach, tmp_path):
    root = small_cohort(tmp_path / "corrupt", bach)
    victim = sorted((root / "images").iterdir())[3]
    victim.write_bytes(victim.read_bytes()[:20000])
    with pytest.raises(ConfigError) as err:
        check_cohort(_cohort_config(root))
    assert str(victim) in _one_line(err) and "truncated" in str(err.value)


def test_a_corrupt_jpeg_can_be_recorded_and_left_out_instead(bach, tmp_path):
    import h5py

    from pathtwt.cli import main
    from pathtwt.io.failures import read_failures

    root = small_cohort(tmp_path / "corrupt", bach)
    victim = sorted((root / "images").iterdir())[3]
    victim.write_bytes(victim.read_bytes()[:20000])
    cfg = _cohort_config(root, tiling={"on_failure": "record"})
    assert len(check_cohort(cfg)["c"].slide_ids) == 8  # the config check lets it through to its tile job
    coords, thumb = tmp_path / "tiles" / f"{victim.stem}.h5", tmp_path / "thumbs" / f"{victim.stem}.png"
    coords.parent.mkdir(), thumb.parent.mkdir()
    assert main(["tile", str(victim), "--out", str(coords), "--thumbnail", str(thumb), "--slide-mpp", "0.42",
                 "--on-failure", "record"]) == 0
    with h5py.File(coords, "r") as f:
        assert f.attrs["status"] == "failed" and str(victim) in f.attrs["failure_reason"] and len(f["coords"]) == 0
    failures, features = tmp_path / "failures.tsv", tmp_path / "features" / f"{victim.stem}.h5"
    assert main(["extract", str(victim), "--coords", str(coords), "--out", str(features), "--backbone",
                 "vit-s14-tiny", "--random-init", "--device", "cpu", "--failures", str(failures), "--no-progress"]) == 0
    [failure] = read_failures(failures)
    assert failure.slide == victim.stem and "truncated" in failure.reason
    with h5py.File(features, "r") as f:
        assert f.attrs["status"] == "failed"  # the MIL heads exclude it (mil.failed_slides: exclude)
