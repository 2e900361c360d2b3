"""`pathtwt check-config` checks what would fail an hour later: every labelled slide is
opened, tiled and read at the level extraction reads (a corrupt file named with its
reader's reason), in parallel and cached by the slide's fingerprint; every backbone name
is resolved (with a did-you-mean); fold counts that leave no training slide are refused;
a calibration asking more tiles than its slides hold is said. Each refusal is one line,
exit status 1."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import SHARED, SHARED_SLIDES, _need
from pathtwt.cli import main

BACH_MPP = 0.42


@pytest.fixture()
def cohort(tmp_path):
    """Copies of real slides: the CMU SVS, four BACH JPEGs and the corrupt SVS of ../shared."""
    slides = tmp_path / "slides"
    slides.mkdir()
    shutil.copy(_need(SHARED_SLIDES / "CMU-1-Small-Region.svs"), slides / "cmu.svs")
    for name in ("b005", "n002", "b006", "n003"):
        shutil.copy(_need(SHARED / "data" / "bach" / "images" / f"{name}.jpeg"), slides / f"{name}.jpeg")
    shutil.copy(_need(SHARED_SLIDES / "unreadable.svs"), slides / "broken.svs")
    return slides


def _config(tmp_path: Path, slides: Path, rows: list[tuple[str, int, str]], **edits) -> Path:
    pd.DataFrame(rows, columns=["slide_id", "label", "split"]).to_csv(tmp_path / "labels.csv", index=False)
    cfg = {
        "cohorts": {"c": {"slides": str(slides), "labels": str(tmp_path / "labels.csv"), "extensions": [".svs", ".jpeg"],
                          "mpp_fallback": BACH_MPP, "tiling": {"target_mpp": 0.5, "tile_size": 224}}},
        "tasks": {"t": {"cohort": "c"}},
        "backbones": {"vit-s14-imgfocus": {}},
        "variants": {"uncompressed": {"method": "none"}},
    }
    for key, value in edits.items():
        section, _, sub = key.partition("__")
        if sub:
            cfg[section][sub].update(value) if isinstance(value, dict) else cfg[section].__setitem__(sub, value)
        else:
            cfg[section] = value
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


GOOD = [("cmu", 0, "train"), ("b005", 1, "train"), ("n002", 0, "val"), ("b006", 1, "test"), ("n003", 0, "test")]


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["check-config", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(code: int, err: str) -> str:
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_a_corrupt_slide_among_the_labelled_is_named_with_its_readers_reason(cohort, tmp_path, capsys):
    cfg = _config(tmp_path, cohort, GOOD + [("broken", 1, "train")])
    line = _one_line(*_run(capsys, cfg)[::2])
    assert "labels.csv: 1 labelled slide(s) of cohorts.c" in line and "line 7 ('broken')" in line
    assert "broken.svs: cannot decode region" in line and "Bogus marker length" in line  # OpenSlide's reason
    # the other slides passed: without the corrupt one the config is ok, every slide read
    code, out, err = _run(capsys, _config(tmp_path, cohort, GOOD))
    assert code == 0, err
    assert "read 5 labelled slides" in out and "config ok" in out


def test_a_cohort_that_records_failures_is_told_and_goes_on(cohort, tmp_path, capsys):
    cfg = _config(tmp_path, cohort, GOOD + [("broken", 1, "train")], cohorts__c={"tiling": {"on_failure": "record"}})
    code, out, err = _run(capsys, cfg)
    assert code == 0, err
    assert "warning: 1 slide(s) of cohorts.c cannot be read and will be recorded as failed" in err


def test_what_tiling_would_refuse_is_refused_before_any_job(cohort, tmp_path, capsys):
    # tiles at 0.25 um/px from images scanned at 0.42: tiling refuses to upsample, hours later
    cfg = _config(tmp_path, cohort, GOOD, cohorts__c={"tiling": {"target_mpp": 0.25, "tile_size": 224}})
    line = _one_line(*_run(capsys, cfg)[::2])
    assert "finer than the slide's level 0" in line and "tiling.allow_upsample" in line


def test_slide_checks_are_cached_by_fingerprint_and_read_in_parallel(cohort, tmp_path, monkeypatch):
    from pathtwt.config import check, slide_reads
    from pathtwt.wsi import slide_check

    cfg = check.validate_schema(yaml.safe_load(_config(tmp_path, cohort, GOOD + [("broken", 1, "train")]).read_text()),
                                source="t")
    cfg["cohorts"]["c"]["tiling"]["on_failure"] = "record"
    tables = check.check_config(cfg, source="t")
    cache = tmp_path / "cache"
    paths = {"c": check.check_slides_on_disk(cfg, "c", tables["c"])}
    first = slide_reads.read_slides(cfg, paths, jobs=2, cache=cache)  # two processes
    assert first["c"]["cmu"]["tiles"] > 0 and first["c"]["b005"]["tiles"] > 0 and first["c"]["broken"]["error"]
    assert len(list(cache.glob("*.json"))) == 6
    # the same bytes under another name: nothing is read again, the error names the new path
    moved = tmp_path / "moved"
    shutil.copytree(cohort, moved)
    calls = []
    real = slide_check.check_slide
    monkeypatch.setattr(slide_check, "check_slide", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    again = slide_reads.read_slides(cfg, {"c": {s: moved / p.name for s, p in paths["c"].items()}}, jobs=1, cache=cache)
    assert calls == []
    assert again["c"]["cmu"] == first["c"]["cmu"] and str(moved / "broken.svs") in again["c"]["broken"]["error"]
    # a slide whose bytes changed is read again; so is every slide under other tiling settings
    with open(moved / "b005.jpeg", "ab") as fh:
        fh.write(b"\0")
    slide_reads.read_slides(cfg, {"c": {s: moved / p.name for s, p in paths["c"].items()}}, jobs=1, cache=cache)
    assert calls == [str(moved / "b005.jpeg")]
    cfg["cohorts"]["c"]["tiling"]["tile_size"] = 112
    slide_reads.read_slides(cfg, paths, jobs=1, cache=cache)
    assert len(calls) == 7


def test_an_unknown_backbone_name_gets_a_did_you_mean(cohort, tmp_path, capsys):
    cfg = _config(tmp_path, cohort, GOOD, backbones={"h0-minii": {}})
    line = _one_line(*_run(capsys, "--no-slides", cfg)[::2])
    assert "key backbones.h0-minii: unknown backbone 'h0-minii'; did you mean 'h0-mini'?" in line
    cfg = _config(tmp_path, cohort, GOOD, backbones={"vit-s14-imgfocus": {"fallback": "vit-s14-tiney"}})
    line = _one_line(*_run(capsys, "--no-slides", cfg)[::2])
    assert "key backbones.vit-s14-imgfocus.fallback: unknown backbone 'vit-s14-tiney'; did you mean 'vit-s14-tiny'" in line


def test_two_folds_leave_no_training_slide_and_are_refused(cohort, tmp_path, capsys):
    """With 2 folds the heads of test fold f select on fold f+1 and train on nothing
    (train-mil: no 'train' slides with features, an hour into the study)."""
    pd.DataFrame({"slide_id": [s for s, _, _ in GOOD], "label": [0, 1, 0, 1, 0]}).to_csv(tmp_path / "l.csv", index=False)
    cfg = _config(tmp_path, cohort, GOOD, cohorts__c={"labels": str(tmp_path / "l.csv"), "draw_split": {"folds": 2}})
    line = _one_line(*_run(capsys, "--no-slides", cfg)[::2])
    assert "key cohorts.c.draw_split.folds: folds 2 leaves no training slide" in line and "at least 3 folds" in line


def test_a_calibration_that_asks_more_tiles_than_its_slides_hold_is_said(cohort, tmp_path, capsys):
    cfg = _config(tmp_path, cohort, GOOD, variants={"uncompressed": {"method": "none"},
                                                    "twt-2": {"method": "twt", "depth": 2}},
                  calibration={"n_tiles": 10_000})
    code, out, err = _run(capsys, cfg)
    assert code == 0, err
    # the training split, the CMU slide and b005: as many tiles as `pathtwt tile` keeps of them
    from pathtwt.io.h5 import read_coords

    held = 0
    for name, extra in (("cmu.svs", []), ("b005.jpeg", ["--slide-mpp", str(BACH_MPP)])):
        assert main(["tile", str(cohort / name), "--out", str(tmp_path / f"{name}.h5"), "--mpp", "0.5",
                     "--tile-size", "224", *extra]) == 0
        held += len(read_coords(tmp_path / f"{name}.h5")[0])
    assert held > 20
    assert f"warning: calibration.n_tiles 10000 is more than the {held} tiles the 2 calibration slide(s) of backbone " \
           "vit-s14-imgfocus hold (cohort c)" in err
