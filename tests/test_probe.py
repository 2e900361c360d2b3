"""`pathtwt probe`: the split rules, the refusals (one line each), the files it writes,
and on real tiles that a pretrained backbone beats the same architecture at random init."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import torch
import pytest
from PIL import Image

from pathtwt.cli import main
from pathtwt.models.registry import create_backbone
from pathtwt.probe.data import draw_split, group_of, load_probe_set
from pathtwt.probe.fit import bootstrap_interval

COLOURS = {"red": (200, 40, 40), "blue": (40, 40, 200), "green": (40, 180, 40)}


def _tiles(root: Path, per_class: dict[str, int], size=(40, 40), names=None) -> Path:
    """Solid-colour tiles with mild noise: class = colour, so any backbone can tell them apart."""
    rng = np.random.default_rng(0)
    for cls, n in per_class.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            name = names(cls, i) if names else f"{cls}{i}.png"
            w, h = size if i % 2 == 0 else (size[0] * 2, size[1] + 7)  # tiles of mixed sizes
            arr = np.clip(np.array(COLOURS[cls]) + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(arr).save(root / cls / name)
    return root


def _split_file(path: Path, rows: list[tuple[str, str]]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["path", "split"])
        w.writerows(rows)
    return path


def _probe(tiles: Path, out: Path, *extra: str) -> int:
    return main(["probe", "--backbone", "vit-s14-tiny", "--random-init", "--tiles", str(tiles), "--out", str(out),
                 "--device", "cpu", "--batch-size", "8", *extra])


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_probe_writes_metrics_and_predictions(tmp_path):
    tiles = _tiles(tmp_path / "tiles", {"red": 10, "blue": 10, "green": 10})
    out = tmp_path / "out"
    assert _probe(tiles, out) == 0
    summary = json.loads((out / "probe.json").read_text())
    assert summary["classes"] == ["blue", "green", "red"]
    assert summary["probe_set"] == "tiles" and summary["variant"] == "vit-s14-tiny" and summary["random_init"]
    assert summary["weights_sha256"] is None
    assert summary["n_train"] + summary["n_test"] == 30 and summary["n_test"] == 9  # 3 of 10 per class
    for name in ("logistic", "knn"):
        m = summary["probes"][name]
        lo, hi = m["balanced_accuracy_ci95"]
        assert lo <= m["balanced_accuracy"] <= hi
        assert 0.0 <= m["accuracy"] <= 1.0 and 0.0 <= m["macro_auc"] <= 1.0
    # colour is all that differs: even random features separate the classes linearly
    assert summary["probes"]["logistic"]["balanced_accuracy"] == 1.0
    rows = list(csv.DictReader(open(out / "predictions.csv")))
    assert len(rows) == summary["n_test"]
    assert all(r["logistic_prediction"] == r["label"] for r in rows)
    probs = np.array([[float(r[f"knn_p_{c}"]) for c in summary["classes"]] for r in rows])
    assert np.allclose(probs.sum(axis=1), 1.0)
    assert not list(out.glob(".*"))  # no temporary file left behind


@pytest.mark.parametrize("bar,kept", [(-1.0, True), (1.01, False)], ids=["kept", "fell-back"])
def test_probe_embeds_as_extraction_does_with_its_bf16_guard(tmp_path, monkeypatch, bar, kept):
    """On hardware with native bf16, --precision auto embeds under bf16 autocast when the
    first tiles agree with fp32, as pathtwt extract does, and probe.json says which; below
    the bar the probe falls back to exactly the fp32 numbers."""
    from pathtwt.probe.data import load_probe_set
    from pathtwt.probe.fit import embed_probe_set

    monkeypatch.setattr("pathtwt.models.bf16_guard.BF16_MIN_COSINE", bar)
    probe_set = load_probe_set(_tiles(tmp_path / "tiles", {"red": 6, "blue": 6}), split_file=None, test_fraction=0.3,
                               seed=0, max_per_class=None)
    backbone = create_backbone("vit-s14-tiny", pretrained=False, init_seed=3, precision="fp32")
    ref, ref_precision = embed_probe_set(backbone, probe_set, batch_size=4)
    assert ref_precision == {"precision": "fp32"}
    feats, precision = embed_probe_set(backbone, probe_set, batch_size=4, bf16_autocast=True)
    if kept:
        assert precision["precision"] == "bf16-autocast" and precision["precision_check"].startswith("bf16 autocast kept")
        assert not np.array_equal(feats, ref)
        assert float(torch.nn.functional.cosine_similarity(torch.from_numpy(feats), torch.from_numpy(ref)).min()) > 0.98
    else:
        assert precision["precision"] == "fp32" and precision["precision_check"].startswith("fell back to fp32")
        assert np.array_equal(feats, ref)


def test_drawn_split_is_seeded_stratified_and_keeps_groups_together(tmp_path):
    # 4 slides per class, 3 tiles each, named SLIDE_x_y.png
    tiles = _tiles(tmp_path / "t", {"red": 12, "blue": 12}, names=lambda c, i: f"{c}S{i // 3}_{i % 3}_0.png")
    probe_set = load_probe_set(tiles, seed=3)
    by_group: dict[str, set[str]] = {}
    for t in probe_set.tiles:
        by_group.setdefault(group_of(t.path), set()).add(t.split)
    assert len(by_group) == 8 and all(len(s) == 1 for s in by_group.values())
    for label in (0, 1):
        assert sum(t.split == "test" and t.label == label for t in probe_set.tiles) == 6  # 2 slides of 4 reach 0.3
    again = load_probe_set(tiles, seed=3)
    assert [t.split for t in again.tiles] == [t.split for t in probe_set.tiles]
    splits = {seed: tuple(t.split for t in load_probe_set(tiles, seed=seed).tiles) for seed in range(6)}
    assert len(set(splits.values())) > 1  # the seed matters


def test_group_rule():
    assert group_of("tumour/TCGA-A1_1024_2048.png") == "TCGA-A1"
    assert group_of("lung_n/lungn17.jpeg") == "lungn17"
    split = draw_split({"a": ["a/s1_0.png", "a/s1_1.png", "a/s2_0.png"], "b": ["b/s1_5.png", "b/s3_0.png"]}, 0.5, 0)
    assert split["a/s1_0.png"] == split["a/s1_1.png"] == split["b/s1_5.png"]  # one slide, two classes: one side


def test_max_per_class_subsamples_each_split(tmp_path):
    tiles = _tiles(tmp_path / "t", {"red": 20, "blue": 20})
    probe_set = load_probe_set(tiles, max_per_class=4, seed=1)
    for label in (0, 1):
        for split in ("train", "test"):
            assert sum(t.label == label and t.split == split for t in probe_set.tiles) == 4


def test_bootstrap_interval_is_seeded_and_brackets_the_estimate():
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 30)
    pred = np.where(rng.random(90) < 0.7, y, (y + 1) % 3)
    a, b = bootstrap_interval(y, pred, seed=5), bootstrap_interval(y, pred, seed=5)
    assert a == b and a[0] < float(np.mean(pred == y)) < a[1]
    assert bootstrap_interval(y, y, seed=0) == [1.0, 1.0]


def test_refuses_fewer_than_two_classes(tmp_path, capsys):
    tiles = _tiles(tmp_path / "t", {"red": 6})
    (tmp_path / "t" / "empty").mkdir()
    assert _probe(tiles, tmp_path / "o") == 1
    err = _one_line_error(capsys)
    assert "at least two class subfolders" in err and "found 1 (red)" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("missing", ["train", "test"])
def test_refuses_a_class_without_train_or_test_tiles(tmp_path, capsys, missing):
    tiles = _tiles(tmp_path / "t", {"red": 4, "blue": 4})
    rows = [(f"red/red{i}.png", "train" if i < 2 else "test") for i in range(4)]
    rows += [(f"blue/blue{i}.png", "test" if missing == "train" else "train") for i in range(4)]
    assert _probe(tiles, tmp_path / "o", "--split-file", str(_split_file(tmp_path / "s.csv", rows))) == 1
    err = _one_line_error(capsys)
    assert f"class 'blue' has no {missing} tile" in err


def test_refuses_a_drawn_split_that_cannot_give_a_class_both_sides(tmp_path, capsys):
    # every blue tile comes from one slide, which must stay on one side
    tiles = _tiles(tmp_path / "t", {"red": 6, "blue": 3}, names=lambda c, i: f"{c}{i}.png" if c == "red" else f"B_{i}.png")
    assert _probe(tiles, tmp_path / "o") == 1
    assert "class 'blue' has no test tile" in _one_line_error(capsys)


def test_refuses_an_unreadable_image_naming_it(tmp_path, capsys):
    tiles = _tiles(tmp_path / "t", {"red": 5, "blue": 5})
    (tiles / "blue" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    assert _probe(tiles, tmp_path / "o") == 1
    err = _one_line_error(capsys)
    assert "broken.png" in err and "unreadable image" in err
    assert not (tmp_path / "o" / "probe.json").exists()


def test_refuses_a_split_file_naming_absent_files(tmp_path, capsys):
    tiles = _tiles(tmp_path / "t", {"red": 4, "blue": 4})
    rows = [(f"{c}/{c}{i}.png", "train" if i < 2 else "test") for c in ("red", "blue") for i in range(4)]
    rows.append(("blue/blue99.png", "test"))
    assert _probe(tiles, tmp_path / "o", "--split-file", str(_split_file(tmp_path / "s.csv", rows))) == 1
    err = _one_line_error(capsys)
    assert "do not exist" in err and "blue/blue99.png" in err


def test_refuses_a_split_file_with_an_unknown_split(tmp_path, capsys):
    tiles = _tiles(tmp_path / "t", {"red": 2, "blue": 2})
    rows = [("red/red0.png", "train"), ("red/red1.png", "validation"), ("blue/blue0.png", "train")]
    assert _probe(tiles, tmp_path / "o", "--split-file", str(_split_file(tmp_path / "s.csv", rows))) == 1
    assert "split must be train or test" in _one_line_error(capsys)


def test_pretrained_vit_s_beats_its_random_init_on_real_lung_tiles(tmp_path, shared_tiles, vit_s_weights):
    """LC25000 lung (3 classes, real H&E) with its split file, 30 tiles per class and split:
    the real ViT-S's logistic probe scores above the same architecture with random weights."""
    tiles = shared_tiles / "lc25000-lung"
    if not (tiles / "split.csv").is_file():
        pytest.skip(f"real test data not available: {tiles / 'split.csv'} is absent")
    common = ["--tiles", str(tiles), "--split-file", str(tiles / "split.csv"), "--max-per-class", "30",
              "--device", "cpu", "--batch-size", "30"]
    assert main(["probe", "--backbone", "vit-s14-imgfocus", "--weights", str(vit_s_weights), "--out",
                 str(tmp_path / "real"), *common]) == 0
    assert main(["probe", "--backbone", "vit-s14-imgfocus", "--random-init", "--out", str(tmp_path / "random"), *common]) == 0
    real = json.loads((tmp_path / "real" / "probe.json").read_text())
    floor = json.loads((tmp_path / "random" / "probe.json").read_text())
    assert real["n_train"] == real["n_test"] == 90 and real["classes"] == ["lung_aca", "lung_n", "lung_scc"]
    assert real["weights_sha256"] == "063d5a03b56f0809dc120b8f596da4cc8a7e57ebbae92a56d34497861f1ac520"
    assert floor["weights_sha256"] is None and floor["random_init"]
    # the split file's test tiles are numbers 141-200 of each class
    rows = list(csv.DictReader(open(tmp_path / "real" / "predictions.csv")))
    assert all(int("".join(ch for ch in Path(r["path"]).stem if ch.isdigit())) > 140 for r in rows)
    assert real["probes"]["logistic"]["balanced_accuracy"] > floor["probes"]["logistic"]["balanced_accuracy"]


def test_probes_config_fills_defaults_skips_or_stops_and_reserves_random_init(tmp_path):
    from pathtwt.config.check import available_probes, check_references, validate_schema
    from pathtwt.errors import ConfigError

    there = _tiles(tmp_path / "there", {"red": 1, "blue": 1})
    config = validate_schema({"probes": {
        "here": {"tiles": str(there)},
        "gone": {"tiles": str(tmp_path / "gone"), "if_missing": "skip"},
    }}, source="test")
    assert config["probes"]["here"] == {"tiles": str(there), "split_file": None, "max_per_class": None, "seed": 0,
                                        "if_missing": "stop"}
    assert available_probes(config, source="test") == (["here"], ["gone"])
    config["probes"]["here"]["split_file"] = str(tmp_path / "missing.csv")
    with pytest.raises(ConfigError, match=r"key probes.here.split_file: .*missing.csv not found"):
        available_probes(config, source="test")
    with pytest.raises(ConfigError, match="max_per_class"):
        validate_schema({"probes": {"p": {"tiles": "x", "max_per_class": 0}}}, source="test")
    config = validate_schema({"variants": {"random-init": {"method": "none"}}}, source="test")
    with pytest.raises(ConfigError, match="reserved"):
        check_references(config, source="test")
