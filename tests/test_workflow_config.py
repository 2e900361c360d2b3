"""Config checks that run before any job: schema errors name the key and the file; label
tables with duplicate ids, unknown splits or slides missing on disk are rejected with the
offending rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pathtwt.cli import main
from pathtwt.config.check import check_references, load_and_check, read_label_table, validate_schema
from pathtwt.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def _cohort_files(root: Path, rows: list[tuple[str, str, str]], *, on_disk: list[str] | None = None) -> dict:
    slides = root / "slides"
    slides.mkdir(parents=True, exist_ok=True)
    for slide_id in on_disk if on_disk is not None else [r[0] for r in rows]:
        (slides / f"{slide_id}.svs").write_bytes(b"")
    (slides / ".half-written.svs.tmp-1.svs").write_bytes(b"")  # temporary names are never slides
    labels = root / "labels.csv"
    labels.write_text("slide_id,label,split\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows))
    return {"slides": str(slides), "labels": str(labels)}


def _config(tmp_path: Path, rows, **kw) -> Path:
    cfg = {
        "cohorts": {"c1": _cohort_files(tmp_path / "c1", rows, **kw)},
        "tasks": {"t1": {"cohort": "c1"}},
        "backbones": {"vit-s14-tiny": {}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


GOOD = [("s1", "0", "train"), ("s2", "1", "train"), ("s3", "0", "val"), ("s4", "1", "test")]


def test_valid_config_gets_schema_defaults(tmp_path):
    config, tables = load_and_check([_config(tmp_path, GOOD)])
    assert config["cohorts"]["c1"]["tiling"] == {"target_mpp": 0.5, "tile_size": 256, "tissue": "fraction", "min_tissue": 0.6,
                                                 "allow_upsample": False, "on_failure": "stop"}
    assert config["cohorts"]["c1"]["modality"] == "brightfield" and config["cohorts"]["c1"]["channels"] is None
    assert config["mil"]["seeds"] == [0, 1, 2, 3, 4]
    assert tables["c1"].ids_in_split("train") == ["s1", "s2"]


def test_tiling_defaults_are_one_table_for_the_config_the_cli_and_the_function():
    import argparse
    import inspect
    from dataclasses import asdict

    from pathtwt.cli import tile
    from pathtwt.wsi.tiling import DEFAULT_MIN_TISSUE, TILING_DEFAULTS, tile_slide

    config = validate_schema({"cohorts": {"a": {"slides": "x", "labels": "y"}}}, source="t")
    # on_failure is the workflow's (what a tile job does with an unreadable slide), not tile_slide's
    # and a null min_tissue is resolved to the filter's default when the config is read
    resolved = {**asdict(TILING_DEFAULTS), "min_tissue": DEFAULT_MIN_TISSUE[TILING_DEFAULTS.tissue]}
    assert {k: v for k, v in config["cohorts"]["a"]["tiling"].items() if k != "on_failure"} == resolved
    parser = argparse.ArgumentParser()
    tile.add_arguments(parser)
    flags = vars(parser.parse_args(["slide.svs", "--out", "x.h5"]))
    cli = {"target_mpp": flags["mpp"], "tile_size": flags["tile_size"], "tissue": flags["tissue"],
           "min_tissue": flags["min_tissue"], "allow_upsample": flags["allow_upsample"]}
    signature = {k: p.default for k, p in inspect.signature(tile_slide).parameters.items() if k in cli}
    assert cli == signature == asdict(TILING_DEFAULTS)


def test_defaults_are_not_shared_between_cohorts():
    config = validate_schema({"cohorts": {"a": {"slides": "x", "labels": "y"}, "b": {"slides": "x", "labels": "y"}}}, source="t")
    config["cohorts"]["a"]["tiling"]["tile_size"] = 512
    assert config["cohorts"]["b"]["tiling"]["tile_size"] == 256


def _edited(tmp_path: Path, edit) -> Path:
    """A valid config changed by ``edit(cfg)``."""
    path = _config(tmp_path, GOOD)
    cfg = yaml.safe_load(path.read_text())
    edit(cfg)
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_schema_error_names_key_and_file(tmp_path):
    path = _edited(tmp_path, lambda cfg: cfg["cohorts"]["c1"].update(tiling={"tissue": "magic"}))
    with pytest.raises(ConfigError) as exc:
        load_and_check([path])
    msg = str(exc.value)
    assert str(path) in msg and "cohorts.c1.tiling.tissue" in msg and "magic" in msg


@pytest.mark.parametrize("edit, message", [
    (lambda cfg: cfg.update(mil={"sedes": [1]}), r"key mil: .*sedes"),
    (lambda cfg: cfg["tasks"]["t1"].update(external=["nowhere"]), r"tasks.t1.external: unknown cohort 'nowhere'"),
    (lambda cfg: cfg.update(variants={"twt-x": {"method": "twt"}}), r"variants.twt-x: give exactly one of depth and eps"),
    (lambda cfg: cfg.update(variants={"nose-5": {"method": "nose", "depth": 5}}), r"variants.nose-5: the nose method keeps every layer"),
    (lambda cfg: cfg["tasks"]["t1"].update(val_split="dev"), r"tasks.t1.val_split: split 'dev' is not one of"),
])
def test_config_errors_name_the_key(tmp_path, edit, message):
    with pytest.raises(ConfigError, match=message):
        load_and_check([_edited(tmp_path, edit)])


def test_what_a_variant_gives_comes_from_the_method_registry(tmp_path, monkeypatch):
    # a method registered as keeping every layer (as nose is) refuses a depth; one that
    # takes an eps (as twt does) accepts it, and the message names the methods that do
    from pathtwt.compress import registry

    monkeypatch.setitem(registry.METHODS, "keep-all", registry.CompressionMethod("m:f", goal="none"))
    monkeypatch.setitem(registry.METHODS, "fewest", registry.CompressionMethod("m:f", goal="depth or eps"))
    with pytest.raises(ConfigError, match=r"variants.k: the keep-all method keeps every layer; give no depth"):
        load_and_check([_edited(tmp_path, lambda cfg: cfg.update(variants={"k": {"method": "keep-all", "depth": 5}}))])
    load_and_check([_edited(tmp_path, lambda cfg: cfg.update(variants={"f": {"method": "fewest", "eps": 0.1}}))])
    with pytest.raises(ConfigError, match=r"variants.r.eps: only twt, fewest takes eps"):
        load_and_check([_edited(tmp_path, lambda cfg: cfg.update(variants={"r": {"method": "raptor", "eps": 0.1}}))])


def test_duplicate_slide_ids_are_listed_by_row(tmp_path):
    rows = GOOD + [("s2", "0", "test")]
    with pytest.raises(ConfigError) as exc:
        load_and_check([_config(tmp_path, rows)])
    msg = str(exc.value)
    assert "duplicate slide_id" in msg and "line 3 ('s2')" in msg and "line 6 ('s2')" in msg
    assert "labels.csv" in msg


def test_rows_are_named_by_their_line_in_the_file(tmp_path):
    from pathtwt.config.check import read_label_table

    labels = tmp_path / "labels.csv"
    # header on line 1, a blank line 3: the duplicate s1 is on line 5
    labels.write_text("slide_id,label,split\ns1,0,train\n\ns2,1,test\ns1,1,test\n")
    with pytest.raises(ConfigError) as exc:
        read_label_table(labels)
    assert "line 2 ('s1')" in str(exc.value) and "line 5 ('s1')" in str(exc.value)


def test_unknown_split_is_listed_with_value(tmp_path):
    rows = GOOD + [("s5", "1", "training")]
    with pytest.raises(ConfigError) as exc:
        load_and_check([_config(tmp_path, rows)])
    assert "line 6 ('s5'): 'training'" in str(exc.value) and "splits" in str(exc.value)


def test_slides_missing_on_disk_are_listed(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_and_check([_config(tmp_path, GOOD, on_disk=["s1", "s3"])])
    msg = str(exc.value)
    assert "missing on disk" in msg and "line 3 ('s2')" in msg and "line 5 ('s4')" in msg and "'s1'" not in msg
    # planning elsewhere: the slides need not be here
    load_and_check([_config(tmp_path, GOOD, on_disk=["s1"])], require_slides=False)


def test_slide_table_and_glob_sources(tmp_path):
    path = _config(tmp_path, GOOD)
    cfg = yaml.safe_load(path.read_text())
    table = tmp_path / "slides.csv"
    table.write_text("slide_id,path\n" + "".join(f"{s},c1/slides/{s}.svs\n" for s, _, _ in GOOD))
    cfg["cohorts"]["c1"]["slides"] = str(table)
    path.write_text(yaml.safe_dump(cfg))
    load_and_check([path])
    cfg["cohorts"]["c1"]["slides"] = str(tmp_path / "c1" / "slides" / "s[1-3].svs")
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=r"line 5 \('s4'\)"):
        load_and_check([path])


def test_check_config_command(tmp_path, capsys):
    # the slide files are empty placeholders: checked on disk, not read (tests/test_check_config_reads.py reads)
    assert main(["check-config", "--no-read", str(_config(tmp_path, GOOD))]) == 0
    assert "cohort c1: 4 slides" in capsys.readouterr().out
    assert main(["check-config", "--no-read", str(_config(tmp_path, GOOD + [("s1", "0", "val")]))]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "duplicate slide_id" in err[0]


def test_label_table_normalised_for_mil(tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("slide_id,isup,fold,extra\na,3,training,x\nb,0,validation,y\nc,5,holdout,z\n")
    out = tmp_path / "out.csv"
    code = main([
        "check-config", "--label-table", str(src), "--label-column", "isup", "--split-column", "fold",
        "--splits", "training", "validation", "holdout", "--rename-split", "training=train",
        "--rename-split", "validation=val", "--rename-split", "holdout=test", "--write-labels", str(out),
    ])
    assert code == 0
    assert out.read_text() == "slide_id,label,split\na,3,train\nb,0,val\nc,5,test\n"
    table = read_label_table(src, label_column="isup", split_column="fold", splits=["training", "validation", "holdout"])
    assert table.labels == ("3", "0", "5")


def test_shipped_configs_validate():
    for name in ("config.yaml", "paper.yaml"):
        path = REPO / "config" / name
        config = validate_schema(yaml.safe_load(path.read_text()), source=str(path))
        check_references(config, source=str(path))
        assert config["tasks"] and config["backbones"] and config["variants"]


def test_every_schema_violation_is_listed_with_a_did_you_mean(tmp_path, capsys):
    def two_typos(cfg):
        cfg["cohorts"]["c1"]["tilling"] = {}
        cfg["mil"] = {"sedes": [1]}

    path = _edited(tmp_path, two_typos)
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "more problems" not in err and "2 problems" in err
    assert "'tilling': did you mean 'tiling'?" in err and "'sedes': did you mean 'seeds'?" in err


def test_top_level_help_names_every_mil_head(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "ABMIL, TransMIL or meanpool" in out


def test_a_study_is_named_by_its_key_or_its_config_file(tmp_path, capsys):
    from pathtwt.config.check import study_name

    assert study_name({"study": None}, ["config/config.yaml", "studies/My Cohort (v2).yaml"]) == "My-Cohort-v2"
    assert study_name({"study": "bach-5fold"}, ["config/bach.yaml"]) == "bach-5fold"
    with pytest.raises(ConfigError, match="key study: 'a/b' does not match"):
        validate_schema({"study": "a/b"}, source="c.yaml")
    # check-config says where a study's results go; the demo config names itself
    assert main(["check-config", "--no-slides", str(REPO / "config" / "config.yaml")]) == 0
    assert "study demo: its results and report go to results/demo/" in capsys.readouterr().out
    unnamed = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    del unnamed["study"]
    (tmp_path / "my-study.yaml").write_text(yaml.safe_dump(unnamed))
    assert main(["check-config", "--no-slides", str(tmp_path / "my-study.yaml")]) == 0
    assert "study my-study: its results and report go to results/my-study/" in capsys.readouterr().out
