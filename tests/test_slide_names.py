"""Slide files named the way scanners and labs name them run through the real workflow, and
slide ids are names, never paths.

The workflow runs end to end (tiling, calibration, discovery, compression, extraction, MIL
heads, heatmaps, report) on copies of real slides (the CMU SVS and BACH JPEGs) named with
spaces, parentheses, brackets, ``#``, quotes, non-ASCII letters, a leading dash, ``;``,
``$(...)``, backticks and ``&|>``: names that, pasted unquoted into a shell, break the command
or run one (``x;touch PWNED;y``), which must never happen. Names the workflow cannot carry
(braces, which Snakemake reads as wildcards; a newline) and ids that are paths are refused
before anything runs, in one line naming the table, the row and the id."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import SHARED, SHARED_SLIDES, _need
from pathtwt.cli import main
from test_workflow_dag import snakemake

REPO = Path(__file__).resolve().parents[1]
PATHTWT = Path(sys.executable).parent / "pathtwt"

# (file name without suffix, label, split); the first is the CMU SVS, the others BACH JPEGs
ODD_NAMES = [
    ("2017-02-27 15.22.39 (387)", 0, "train"),  # a Hamamatsu export: spaces, a parenthesised count
    ("[HE] slide #3", 1, "train"),
    ("it's \"quoted\"", 0, "train"),
    ("Gewebe-é-ü-中", 1, "train"),
    ("-leading dash", 0, "val"),
    ("x;touch PWNED;y", 1, "val"),
    ("$(touch PWNED2)", 0, "test"),
    ("`touch PWNED3`", 1, "test"),
    ("a&b|c>d", 1, "train"),
]
BACH_IMAGES = ["b005", "n002", "b006", "n003", "b010", "n004", "b011", "n007"]


def odd_cohort(root: Path) -> Path:
    """The slides folder and label table of the odd names, as copies of real slides."""
    slides = root / "slides"
    slides.mkdir(parents=True)
    bach = _need(SHARED / "data" / "bach" / "images")
    cmu = _need(SHARED_SLIDES / "CMU-1-Small-Region.svs")
    shutil.copy(cmu, slides / f"{ODD_NAMES[0][0]}.svs")
    for (name, _, _), image in zip(ODD_NAMES[1:], BACH_IMAGES):
        shutil.copy(bach / f"{image}.jpeg", slides / f"{name}.jpeg")
    table = pd.DataFrame(ODD_NAMES, columns=["slide_id", "label", "split"])
    table.to_csv(root / "labels.csv", index=False)  # pandas quotes the names that need it
    return root


def study_config(root: Path) -> dict:
    """The demo config shrunk to seconds: one cohort of the odd names, the tiny ViT with
    random weights as the teacher (the demo's offline fallback), a truncated variant so
    calibration, discovery and compression read the odd coords files, one extraction job
    per variant, an attention head, heatmaps of the test slides."""
    return {
        "study": "odd",
        "demo": {"enabled": False},
        "cohorts": {"odd": {
            "slides": str(root / "slides"), "labels": str(root / "labels.csv"), "extensions": [".svs", ".jpeg"],
            "mpp_fallback": 0.42, "tiling": {"target_mpp": 2.0, "tile_size": 56, "tissue": "fraction", "min_tissue": 0.3},
        }},
        "tasks": {"odd": {"cohort": "odd", "classes": 2, "metric": "accuracy", "protocol": "metastasis"}},
        "backbones": {"vit-s14-imgfocus": {"weights": str(root / "absent.safetensors"), "fallback": "vit-s14-tiny"}},
        "variants": {"uncompressed": {"method": "none"}, "truncation-2": {"method": "truncation", "depth": 2}},
        "calibration": {"n_tiles": 16, "holdout": 0.25},
        "discovery": {"batch_size": 16},
        "compress": {"steps": 2, "batch_size": 4, "device": "cpu", "audition_steps": 0, "augment": False},
        "extract": {"batch_size": 32, "device": "cpu", "threads": 1},
        "mil": {"heads": ["abmil"], "seeds": [0], "epochs": 2, "device": "cpu", "accumulation": 1,
                "hidden_dim": 16, "threads": 1},
        "report": {"heatmaps": 2, "attention_slides": 1, "heatmap_mpp": 8.0},
    }


@pytest.mark.slow
def test_the_workflow_runs_slides_named_as_labs_name_them(tmp_path):
    root = odd_cohort(tmp_path / "data")
    cfg = tmp_path / "odd.yaml"
    cfg.write_text(yaml.safe_dump(study_config(root), allow_unicode=True))
    check = subprocess.run([str(PATHTWT), "check-config", str(cfg)], capture_output=True, text=True, cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    work = tmp_path / "work"
    res = snakemake(work, "--cores", "2", "--configfile", str(cfg), check=False, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    # nothing a name spelt ran: no file PWNED anywhere a job could have made it
    assert not [p for p in tmp_path.rglob("PWNED*")] and not list(REPO.glob("PWNED*"))
    results = work / "results" / "odd"
    for name, _, _ in ODD_NAMES:
        for path in (results / "tiles" / "odd" / f"{name}.h5", results / "thumbnails" / "odd" / f"{name}.png",
                     *(results / "features" / "vit-s14-tiny" / v / "odd" / f"{name}.h5"
                       for v in ("uncompressed", "truncation-2"))):
            assert path.is_file(), path
    # every slide's tiles are its own: the coords file records the file it came from
    import h5py

    for name, _, _ in ODD_NAMES:
        with h5py.File(results / "tiles" / "odd" / f"{name}.h5", "r") as h5:
            assert Path(str(h5.attrs["slide_path"])).name.startswith(name) and len(h5["coords"]) > 0
    # the test slides' heatmaps, named by their ids, and the report
    heatmaps = {p.name for p in (results / "heatmaps").rglob("*.heatmap.png")}
    assert heatmaps == {f"{name}.heatmap.png" for name, _, split in ODD_NAMES if split == "test"}
    predictions = pd.read_csv(results / "mil" / "vit-s14-tiny" / "uncompressed" / "odd" / "abmil" / "seed0"
                              / "predictions.csv", dtype={"slide_id": str}, keep_default_na=False)
    assert set(predictions["slide_id"]) >= {name for name, _, split in ODD_NAMES if split == "test"}
    assert (results / "report" / "index.html").is_file()

    # with one extraction job per slide, the slide's path is on the command line: each
    # command, read back as the shell reads it, hands pathtwt that path as one argument
    per_slide = study_config(root)
    per_slide["extract"]["per_slide_jobs"] = True
    cfg.write_text(yaml.safe_dump(per_slide, allow_unicode=True))
    plan = snakemake(tmp_path / "plan", "-n", "-p", "--configfile", str(cfg), "--forceall", "all_tiles",
                     "results/odd/features/vit-s14-tiny/uncompressed/odd")
    # each job's command: `pathtwt store make ... -- pathtwt tile|extract ... -- SLIDE`
    commands = [shlex.split(line.split("Shell command: ", 1)[1]) for line in (plan.stdout + plan.stderr).splitlines()
                if "Shell command: pathtwt store make " in line]
    slide_args = {"tile": [], "extract": []}
    for c in commands:
        inner = c[c.index("--") + 1:]
        slide_args[inner[1]].append(inner[len(inner) - 1 - inner[::-1].index("--") + 1])
    expected = sorted(str(p) for p in (root / "slides").iterdir())
    assert sorted(slide_args["tile"]) == sorted(slide_args["extract"]) == expected


def _refusal(capsys, argv) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def _config(tmp_path: Path, ids: list[str], suffix: str = ".svs", folder: str = "slides") -> Path:
    """A one-cohort config whose label table lists ``ids`` (empty slide files beside it)."""
    slides = tmp_path / folder
    slides.mkdir(parents=True, exist_ok=True)
    for slide_id in ids:
        if "/" not in slide_id and "\x00" not in slide_id and slide_id not in (".", ".."):
            (slides / f"{slide_id}{suffix}").write_bytes(b"")
    splits = ["train", "train", "val", "test"] + ["test"] * len(ids)
    pd.DataFrame({"slide_id": ids, "label": [i % 2 for i in range(len(ids))], "split": splits[: len(ids)]}).to_csv(
        tmp_path / "labels.csv", index=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"cohorts": {"c": {"slides": str(slides), "labels": str(tmp_path / "labels.csv")}},
                                   "tasks": {"t": {"cohort": "c"}}, "backbones": {"vit-s14-tiny": {}}}))
    return cfg


@pytest.mark.parametrize("bad, why", [
    ("../../../../outside/x", "path separator"),
    ("a\\b", "path separator"),
    ("..", "starts with '.'"),
    (".hidden", "starts with '.'"),
    ("tab\tname", "control character"),
    ("nul\x00name", "control character"),
    ("x" * 151, "longer than 150 bytes"),
    ("slide {1}", "brace, which Snakemake reads as a wildcard"),
    ("new\nline", "control character"),
])
def test_check_config_refuses_ids_that_are_paths_or_that_the_workflow_cannot_carry(tmp_path, capsys, bad, why):
    ids = ["s1", "s2", "s3", bad]
    err = _refusal(capsys, ["check-config", "--no-slides", str(_config(tmp_path, ids))])
    assert "labels.csv" in err and f"line 5 ({bad!r}" in err and why in err, err
    assert "rename" in err


def test_two_ids_that_are_one_file_on_many_file_systems_are_refused(tmp_path, capsys):
    err = _refusal(capsys, ["check-config", "--no-slides", str(_config(tmp_path, ["Slide-1", "s2", "s3", "slide-1"]))])
    assert "line 2 ('Slide-1') and line 5 ('slide-1')" in err and "case" in err


def test_a_slide_path_the_workflow_cannot_carry_is_refused(tmp_path, capsys):
    # a folder of the config
    cfg = _config(tmp_path / "a", ["s1", "s2", "s3", "s4"], folder="study {2024}")
    err = _refusal(capsys, ["check-config", "--no-read", str(cfg)])
    assert "study {2024}: the workflow cannot carry this path of cohorts.c.slides (it holds a brace" in err
    assert "rename the file or its folder" in err
    # a slide's file, named by a slides table
    cfg = _config(tmp_path / "b", ["s1", "s2", "s3", "s4"])
    slides = tmp_path / "b" / "slides"
    (slides / "s1.svs").rename(slides / "s1 {HE}.svs")
    (slides / "slides.csv").write_text("slide_id,path\n" + "".join(
        f"{s},{'s1 {HE}' if s == 's1' else s}.svs\n" for s in ("s1", "s2", "s3", "s4")))
    data = yaml.safe_load(cfg.read_text())
    data["cohorts"]["c"]["slides"] = str(slides / "slides.csv")
    cfg.write_text(yaml.safe_dump(data))
    err = _refusal(capsys, ["check-config", "--no-read", str(cfg)])
    assert "s1 {HE}.svs: the workflow cannot carry this path of the slide of" in err and "line 2" in err


def test_the_workflow_stops_an_id_that_is_a_path_before_planning(tmp_path):
    """The issue's table: the id ../../../../outside/x planned a tile job writing outside
    results/; now the plan stops in one line and nothing is written."""
    cfg = _config(tmp_path, ["s1", "s2", "s3", "../../../../outside/x"])
    res = snakemake(tmp_path / "work", "-n", "--configfile", str(cfg), check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "'../../../../outside/x': it holds a path separator" in out
    assert "Job stats" not in out and not (tmp_path / "outside").exists()


@pytest.mark.parametrize("command", ["labels-split", "train-mil", "label-table", "calibrate"])
def test_every_command_that_takes_a_label_table_refuses_an_id_that_is_a_path(tmp_path, capsys, command):
    table = tmp_path / "labels.csv"
    table.write_text("slide_id,label,split\ns1,0,train\n../x,1,train\ns3,0,val\n")
    argv = {
        "labels-split": ["labels", "split", str(table), "--out", str(tmp_path / "out.csv")],
        "train-mil": ["train-mil", "--features", str(tmp_path), "--labels", str(table), "--out", str(tmp_path / "run"),
                      "--protocol", "metastasis", "--device", "cpu"],
        "label-table": ["check-config", "--label-table", str(table), "--write-labels", str(tmp_path / "out.csv")],
        "calibrate": ["calibrate", "--coords", str(tmp_path), "--labels", str(table), "--out", str(tmp_path / "out.csv")],
    }[command]
    err = _refusal(capsys, argv)
    assert str(table) in err and "line 3 ('../x': it holds a path separator)" in err
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "run").exists()


def test_heatmap_refuses_a_slide_id_that_is_a_path(tmp_path, capsys):
    err = _refusal(capsys, ["heatmap", "slide.svs", "--coords", "c.h5", "--features", "f.h5", "--run",
                            str(tmp_path), "--out", str(tmp_path / "hm"), "--slide-id", "../../x"])
    assert "--slide-id" in err and "path separator" in err
