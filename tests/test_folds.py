"""k-fold cross-validation folds (`pathtwt labels split --folds K`): every slide tested once,
groups kept whole, classes stratified, the compression hold-out outside every fold, the
roles of each fold, CLAM's split files, and every bad input refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from conftest import SHARED, _need
from pathtwt.cli import main
from pathtwt.errors import ConfigError
from pathtwt.mil import folds as cv
from pathtwt.mil import label_builders as lb

BACH_LABELS = SHARED / "data" / "bach" / "labels.csv"


def write_table(path, labels, groups=None):
    rows = {"slide_id": [f"s{i:03d}" for i in range(len(labels))], "label": labels}
    if groups is not None:
        rows["patient"] = groups
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def split(tmp_path, table, *args):
    out = tmp_path / "out.csv"
    code = main(["labels", "split", str(table), *args, "--out", str(out)])
    return code, out


def test_real_bach_rows_with_patients_keep_every_patient_in_one_fold_and_test_every_image_once(tmp_path, capsys):
    bach = pd.read_csv(_need(BACH_LABELS), dtype={"slide_id": str})
    # a made-up patient column: 1 to 4 images per patient, patients within one class
    rng = np.random.default_rng(3)
    patients, n = [], 0
    for _, rows in bach.groupby("label"):
        left = len(rows)
        while left:
            take = min(left, int(rng.integers(1, 5)))
            patients += [f"P{n}"] * take
            n, left = n + 1, left - take
    table = bach.sort_values(["label", "slide_id"]).assign(patient=patients)
    table.to_csv(tmp_path / "bach.csv", index=False)
    code, out = split(tmp_path, tmp_path / "bach.csv", "--folds", "5", "--group-column", "patient", "--seed", "0")
    assert code == 0
    written = pd.read_csv(out, dtype={"slide_id": str, "group": str})
    assert list(written.columns[:5]) == ["slide_id", "label", "split", "fold", "group"]
    assert set(written.slide_id) == set(bach.slide_id) and set(written.fold) == set(range(5))
    assert (written.groupby("patient").fold.nunique() == 1).all()  # every patient in one fold
    assert (written.group == written.patient).all()
    # every image tested exactly once across the 5 folds, validated exactly once, and never both
    roles = np.stack([cv.fold_roles(written.fold.to_numpy(), f, 5) for f in range(5)])
    assert ((roles == "test").sum(0) == 1).all() and ((roles == "val").sum(0) == 1).all()
    for f in range(5):  # a patient's images share their role in every fold
        assert (written.assign(role=roles[f]).groupby("patient").role.nunique() == 1).all()
    report = json.loads(capsys.readouterr().out)
    assert report["folds"] == 5 and report["groups"] == n and report["mixed_label_groups"] == []
    assert sum(sum(v.values()) for v in report["per_fold_label"].values()) == 200


def test_without_groups_folds_are_exactly_stratified_seeded_and_order_free(tmp_path):
    bach = pd.read_csv(_need(BACH_LABELS), dtype={"slide_id": str})
    ids, labels = list(bach.slide_id), bach.label.to_numpy()
    folds = cv.assign_folds(ids, labels, 5, seed=0, holdout=0.2)
    counts = pd.crosstab(folds, labels)
    assert (counts.loc[cv.HOLDOUT] == 10).all() and (counts.drop(index=cv.HOLDOUT) == 8).all().all()
    assert cv.stratification_gaps(labels, folds, 0.2, 5) == []
    order = np.random.default_rng(1).permutation(len(ids))  # the row order does not matter
    again = cv.assign_folds([ids[i] for i in order], labels[order], 5, seed=0, holdout=0.2)
    assert dict(zip(np.array(ids)[order], again)) == dict(zip(ids, folds))
    other = cv.assign_folds(ids, labels, 5, seed=1, holdout=0.2)
    assert (other != folds).any()  # the seed moves images


def test_groups_that_cannot_be_split_evenly_are_named(tmp_path, capsys):
    labels = [0] * 12 + [1] * 12
    # class 0 in 3 patients of 5, 4 and 3 slides: 3 folds cannot each get 4
    groups = ["a0"] * 5 + ["a1"] * 4 + ["a2"] * 3 + [f"b{i // 2}" for i in range(12)]
    code, out = split(tmp_path, write_table(tmp_path / "t.csv", labels, groups), "--folds", "3", "--group-column", "patient")
    assert code == 0
    captured = capsys.readouterr()
    gaps = json.loads(captured.out)["not_exactly_stratified"]
    assert any("class 0" in g for g in gaps) and "miss their target" in captured.err
    assert len(captured.err.strip().splitlines()) == 1  # one line, however many gaps


def test_a_group_with_different_labels_is_kept_whole_and_stated(tmp_path, capsys):
    labels = [0, 1] * 6
    groups = [f"p{i // 2}" for i in range(12)]  # every patient has one slide of each class
    code, out = split(tmp_path, write_table(tmp_path / "t.csv", labels, groups), "--folds", "3", "--group-column", "patient")
    assert code == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["mixed_label_groups"] == [f"p{i}" for i in range(6)]
    assert "different labels (kept whole, allowed): p0, p1" in captured.err
    written = pd.read_csv(out)
    assert (written.groupby("patient").fold.nunique() == 1).all()


def test_the_holdout_is_stratified_by_group_and_in_no_fold(tmp_path):
    labels = [0] * 20 + [1] * 20
    groups = [f"p{i // 2}" for i in range(40)]
    code, out = split(tmp_path, write_table(tmp_path / "t.csv", labels, groups), "--folds", "4", "--group-column",
                      "patient", "--holdout", "0.2")
    assert code == 0
    written = pd.read_csv(out)
    held = written[written.fold == cv.HOLDOUT]
    assert set(held.split) == {"compress"} and set(written[written.fold >= 0].split) == {"cv"}
    assert held.label.value_counts().to_dict() == {0: 4, 1: 4}
    assert not set(held.patient) & set(written[written.fold >= 0].patient)
    for f in range(4):
        assert "" in set(cv.fold_roles(written.fold.to_numpy(), f, 4)[written.fold.to_numpy() == cv.HOLDOUT])


def test_clam_split_files_have_the_same_roles(tmp_path):
    table = lb.build_fold_split(write_table(tmp_path / "t.csv", [0, 1] * 10), 5, seed=0, holdout=0.2)
    paths = lb.write_clam_splits(table, 5, tmp_path / "clam")
    assert [p.name for p in paths] == [f"splits_{k}.csv" for k in range(5)]
    for k, path in enumerate(paths):
        clam = pd.read_csv(path, index_col=0)
        assert list(clam.columns) == ["train", "val", "test"]
        roles = cv.fold_roles(table.fold.to_numpy(), k, 5)
        for role in ("train", "val", "test"):
            assert set(clam[role].dropna()) == set(table.slide_id[roles == role])
    tested = pd.concat([pd.read_csv(p, index_col=0)["test"].dropna() for p in paths])
    assert sorted(tested) == sorted(table.slide_id[table.fold >= 0])  # each once; the hold-out in none


def test_stamp_splits_list_each_fold_s_patients(tmp_path, capsys):
    labels, groups = [0, 1] * 10, [f"p{i // 2}" for i in range(20)]
    code, out = split(tmp_path, write_table(tmp_path / "t.csv", labels, groups), "--folds", "4", "--group-column",
                      "patient", "--holdout", "0.2", "--stamp-splits", str(tmp_path / "splits.json"))
    assert code == 0 and str(tmp_path / "splits.json") in json.loads(capsys.readouterr().out)["split_files"]
    table = pd.read_csv(out)
    splits = json.loads((tmp_path / "splits.json").read_text())["splits"]
    assert len(splits) == 4
    for f, entry in enumerate(splits):
        assert set(entry["test_patients"]) == set(table.patient[table.fold == f])
        assert set(entry["train_patients"]) == set(table.patient[(table.fold >= 0) & (table.fold != f)])
    held = set(table.patient[table.fold == cv.HOLDOUT])
    assert held and not held & {p for e in splits for p in e["train_patients"] + e["test_patients"]}


def test_more_folds_than_the_smallest_class_is_refused(tmp_path, capsys):
    code, _ = split(tmp_path, write_table(tmp_path / "t.csv", [0] * 10 + [1] * 3), "--folds", "4")
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert "t.csv: folds 4 is larger than the smallest class (class 1: 3 slides" in err


def test_more_folds_than_groups_is_refused(tmp_path, capsys):
    labels, groups = [0, 1] * 6, ["a", "b", "c"] * 4
    code, _ = split(tmp_path, write_table(tmp_path / "t.csv", labels, groups), "--folds", "4", "--group-column", "patient")
    assert code == 1 and "folds 4 is larger than the number of groups (3)" in capsys.readouterr().err


def test_a_missing_group_column_is_named(tmp_path, capsys):
    code, out = split(tmp_path, write_table(tmp_path / "t.csv", [0, 1] * 5), "--folds", "3", "--group-column", "case_id")
    err = capsys.readouterr().err
    assert code == 1 and "t.csv: group column 'case_id' not in the label table (it has slide_id, label)" in err
    assert not out.exists()  # nothing written


def test_a_fold_without_a_class_is_named(tmp_path):
    # class 1 lives in one patient only: whichever fold holds it, another fold has none
    labels = [0] * 8 + [1] * 4
    groups = [f"p{i}" for i in range(8)] + ["q"] * 4
    with pytest.raises(ConfigError, match=r"fold \d has no slide of class 1; use fewer folds or other groups"):
        lb.build_fold_split(write_table(tmp_path / "t.csv", labels, groups), 3, group_column="patient")


@pytest.mark.parametrize("k", [2, 1, 0])
def test_fewer_than_three_folds_leave_no_training_slide_and_are_refused(tmp_path, capsys, k):
    """For test fold f the heads select on fold f+1 and train on the other K-2: two folds
    trained on nothing (train-mil then stopped: no 'train' slides with features)."""
    code, out = split(tmp_path, write_table(tmp_path / "t.csv", [0, 1] * 5), "--folds", str(k))
    err = capsys.readouterr().err
    assert code == 1 and f"folds {k} leaves no training slide" in err and "give at least 3 folds" in err
    assert not out.exists()


def test_folds_and_fractions_together_are_refused(tmp_path, capsys):
    code, out = split(tmp_path, write_table(tmp_path / "t.csv", [0, 1] * 5), "--folds", "2", "--fractions", "0.6", "0.2", "0.2")
    assert code == 1 and "--folds and --fractions exclude each other" in capsys.readouterr().err
    assert not out.exists()
    code, _ = split(tmp_path, write_table(tmp_path / "t.csv", [0, 1] * 5), "--holdout", "0.2")
    assert code == 1 and "--holdout needs --folds K" in capsys.readouterr().err


def test_a_fold_column_that_does_not_cover_every_fold_is_refused():
    with pytest.raises(ConfigError, match=r"t.csv: fold column lacks fold\(s\) \[2\]; redraw it"):
        cv.check_fold_column([0, 1, 1, 3, -1], 4, "t.csv")
    with pytest.raises(ConfigError, match=r"has fold\(s\) \[5\] outside 0..3"):
        cv.check_fold_column([0, 1, 2, 3, 5], 4, "t.csv")
    cv.check_fold_column([0, 1, 2, 3, -1], 4, "t.csv")  # the hold-out (-1) is allowed
