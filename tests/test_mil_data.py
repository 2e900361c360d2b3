"""Bags and the bad input the MIL stage must refuse with a clear, slide-naming error."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pathtwt.cli import main
from pathtwt.errors import ConfigError, NumericsError
from pathtwt.io.h5 import write_features
from pathtwt.mil.data import load_bag, parse_external, prepare_data
from planted_cohorts import write_planted_cohort


@pytest.fixture()
def cohort(tmp_path):
    return write_planted_cohort(tmp_path / "c", task="metastasis", splits={"train": 4, "val": 2, "test": 2}, dim=8, bag_size=(5, 9))


def _prepare(cohort, **kw):
    return prepare_data(features_dir=cohort.features_dir, labels=cohort.labels_csv, **kw)


def test_prepare_splits_and_lazy_bags(cohort):
    data = _prepare(cohort)
    assert [c.name for c in data.evaluated] == ["val", "test"]
    assert len(data.train.bags) == 4 and data.dim == 8 and data.n_classes == 2
    bag = data.train.bags[0]
    features, coords = load_bag(bag)
    assert features.shape == (bag.n_tiles, 8) and coords.shape == (bag.n_tiles, 2)
    sub, sub_coords = load_bag(bag, max_instances=3, rng=np.random.default_rng(0))
    assert sub.shape == (3, 8)
    # the subset is made of real rows of the bag, in file order
    rows = [int(np.flatnonzero((features == row).all(1))[0]) for row in sub]
    assert rows == sorted(rows) and (coords[rows] == sub_coords).all()


def test_bags_read_once_then_from_memory_give_the_same_rows(cohort, monkeypatch):
    import pathtwt.mil.data as mil_data

    monkeypatch.setattr(mil_data, "_bag_cache", {})
    bag = _prepare(cohort).train.bags[0]
    subset_from_file = load_bag(bag, max_instances=3, rng=np.random.default_rng(5))
    first = load_bag(bag)  # read from the file and kept
    assert len(mil_data._bag_cache) == 1 and not first[0].flags.writeable
    again = load_bag(bag)
    assert again[0] is first[0]  # not read again
    subset_from_memory = load_bag(bag, max_instances=3, rng=np.random.default_rng(5))
    for a, b in zip(subset_from_file, subset_from_memory):
        np.testing.assert_array_equal(a, b)
    # a rewritten file is read anew, not served from memory
    write_features(bag.path, np.full((2, 8), 7.0, np.float32), np.zeros((2, 2), np.int64), {})
    assert (load_bag(bag)[0] == 7.0).all()
    # over the budget nothing more is kept, and reads still work
    monkeypatch.setattr(mil_data, "BAG_CACHE_BYTES", 0)
    mil_data._bag_cache.clear()
    assert load_bag(bag)[0].shape == (2, 8) and not mil_data._bag_cache


def test_missing_features_listed_or_skipped_with_count(cohort):
    (cohort.features_dir / "train-001.h5").unlink()
    (cohort.features_dir / "val-000.h5").unlink()
    with pytest.raises(ConfigError, match=r"2 slide\(s\).*train-001, val-000.*--allow-missing"):
        _prepare(cohort)
    data = _prepare(cohort, allow_missing=True)
    assert data.skipped()["main"]["missing_features"] == 2
    assert len(data.train.bags) == 3


def test_unlisted_features_file_is_an_error(cohort):
    table = cohort.table[cohort.table.slide_id != "test-001"]
    table.to_csv(cohort.labels_csv, index=False)
    with pytest.raises(ConfigError, match="not in the label table: test-001"):
        _prepare(cohort)
    # temporary files of an interrupted writer are not slides
    (cohort.features_dir / ".test-001.h5.tmp-x.h5").write_bytes(b"")
    assert _prepare(cohort, allow_missing=True).skipped()["main"]["unlisted_features"] == 1


def test_labels_outside_classes(cohort, tmp_path):
    with pytest.raises(ConfigError, match=r"outside the task's classes 0\.\.0:.*train-001=1"):
        _prepare(cohort, n_classes=1)
    table = cohort.table.astype({"label": object})
    table.loc[table.slide_id == "val-001", "label"] = -1
    table.loc[table.slide_id == "test-000", "label"] = "high"
    table.to_csv(cohort.labels_csv, index=False)
    with pytest.raises(ConfigError, match="non-integer label for slide.*test-000"):
        _prepare(cohort)
    table.loc[table.slide_id == "test-000", "label"] = 0
    table.to_csv(cohort.labels_csv, index=False)
    with pytest.raises(ConfigError, match="val-001=-1"):
        _prepare(cohort)


def test_empty_bag_and_nan_features_name_the_slides(cohort):
    write_features(cohort.features_dir / "train-002.h5", np.zeros((0, 8), np.float32), np.zeros((0, 2)), {"status": "ok"})
    with pytest.raises(ConfigError, match=r"empty bag.*train-002 \(0 tiles"):
        _prepare(cohort)
    bad = np.ones((4, 8), np.float32)
    bad[2, 3] = np.nan
    write_features(cohort.features_dir / "train-002.h5", bad, np.zeros((4, 2)), {"status": "ok"})
    inf = np.ones((4, 8), np.float32)
    inf[0, 0] = np.inf
    write_features(cohort.features_dir / "val-001.h5", inf, np.zeros((4, 2)), {"status": "ok"})
    with pytest.raises(NumericsError, match="train-002, val-001"):
        _prepare(cohort)


def test_slide_without_tiles_is_excluded_and_counted_only_when_asked(cohort):
    # a slide that kept no tile at the cohort's tissue threshold (status ok, 0 tiles)
    write_features(cohort.features_dir / "train-002.h5", np.zeros((0, 8), np.float32), np.zeros((0, 2)), {"status": "ok"})
    with pytest.raises(ConfigError, match=r"empty bag.*train-002"):
        _prepare(cohort, failed="stop")
    data = _prepare(cohort, failed="exclude")
    assert "train-002" not in [b.slide_id for b in data.train.bags] and len(data.train.bags) == 3
    assert data.train.skipped["no_tiles"] == 1 and data.train.skipped["failed_extraction"] == 0


def test_external_cohorts(cohort, tmp_path):
    ext = write_planted_cohort(tmp_path / "ext", task="metastasis", splits={"test": 3}, dim=8, bag_size=(5, 9), seed=5)
    name, folder, csv = parse_external(f"cam16={ext.features_dir}:{ext.labels_csv}")
    data = _prepare(cohort, externals=[(name, folder, csv)])
    assert [c.name for c in data.evaluated] == ["val", "test", "cam16"]
    with pytest.raises(ConfigError, match="NAME=FEATURES_DIR:LABELS_CSV"):
        parse_external("no-folder-given")
    with pytest.raises(ConfigError, match="name is taken"):
        _prepare(cohort, externals=[("test", folder, csv)])
    wide = write_planted_cohort(tmp_path / "wide", task="metastasis", splits={"test": 2}, dim=4, bag_size=(5, 9))
    with pytest.raises(ConfigError, match="4-d but the training features are 8-d"):
        _prepare(cohort, externals=[("wide", wide.features_dir, wide.labels_csv)])


def test_cli_reports_bad_input_in_one_line(cohort, tmp_path, capsys):
    (cohort.features_dir / "train-000.h5").unlink()
    code = main(["train-mil", "--features", str(cohort.features_dir), "--labels", str(cohort.labels_csv),
                 "--protocol", "metastasis", "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "train-000" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run" / "metrics.json").exists()
    pd.DataFrame({"slide_id": ["a"], "label": [0]}).to_csv(tmp_path / "nosplit.csv", index=False)
    code = main(["train-mil", "--features", str(cohort.features_dir), "--labels", str(tmp_path / "nosplit.csv"),
                 "--protocol", "grading", "--out", str(tmp_path / "run")])
    assert code == 1 and "lacks column(s) split" in capsys.readouterr().err
