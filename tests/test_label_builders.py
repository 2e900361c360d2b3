"""`pathtwt labels`: small hand-made tables in the formats the cohorts are published in."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pathtwt.cli import main
from pathtwt.errors import ConfigError
from pathtwt.mil import label_builders as lb
from pathtwt.mil.labels import read_label_table

PANDA_TRAIN = """image_id,data_provider,isup_grade,gleason_score
0005f7aaab2800f6170c399693a96917,karolinska,0,0+0
000920ad0b612851f8e01bcc880d9b3d,karolinska,0,0+0
0018ae58b01bdadc8e347995b69f99aa,radboud,4,4+4
001c62abd11fa4b57bf7a6c603a11bb9,karolinska,4,4+4
001d865e65ef5d2579c190a0e0350d8f,karolinska,2,3+4
002a4db09dad406c85505a00fb6f6144,radboud,5,negative
"""


def test_panda_from_train_csv_and_patho_bench_style_split(tmp_path, capsys):
    (tmp_path / "train.csv").write_text(PANDA_TRAIN)
    (tmp_path / "k=all.tsv").write_text(
        "case_id\tslide_id\tisup_grade\tfold_0\n"
        "a\t0005f7aaab2800f6170c399693a96917\t0\ttrain\n"
        "b\t0018ae58b01bdadc8e347995b69f99aa\t4\tval\n"
        "c\t001c62abd11fa4b57bf7a6c603a11bb9\t4\ttest\n"
        "d\t001d865e65ef5d2579c190a0e0350d8f\t2\ttrain\n"
    )
    out = tmp_path / "panda.csv"
    assert main(["labels", "panda", str(tmp_path / "train.csv"), "--splits", str(tmp_path / "k=all.tsv"),
                 "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["slides"] == 4 and report["per_split_label"]["train"] == {"0": 1, "2": 1}
    table = read_label_table(out)  # pathtwt's own reader accepts it
    assert table["slide_id"].tolist() == sorted(table["slide_id"])
    row = table.set_index("slide_id").loc["001d865e65ef5d2579c190a0e0350d8f"]
    assert (row["label"], row["split"], row["isup_grade"], row["gleason_score"]) == (2, "train", 2, "3+4")
    # slides the split leaves out are left out
    assert "000920ad0b612851f8e01bcc880d9b3d" not in set(table["slide_id"])


def test_panda_bad_rows_are_named_with_line_and_value(tmp_path, capsys):
    (tmp_path / "train.csv").write_text(PANDA_TRAIN.replace("radboud,4,4+4", "radboud,seven,4+4")
                                        .replace("karolinska,2,3+4", "karolinska,6,3+4"))
    (tmp_path / "split.csv").write_text(
        "image_id,split\n0018ae58b01bdadc8e347995b69f99aa,train\n001d865e65ef5d2579c190a0e0350d8f,test\n"
    )
    assert main(["labels", "panda", str(tmp_path / "train.csv"), "--splits", str(tmp_path / "split.csv"),
                 "--out", str(tmp_path / "o.csv")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.csv" in err
    assert "line 4 (0018ae58b01bdadc8e347995b69f99aa: isup_grade='seven')" in err
    assert "line 6 (001d865e65ef5d2579c190a0e0350d8f: isup_grade='6')" in err
    assert not (tmp_path / "o.csv").exists()
    (tmp_path / "split.csv").write_text("image_id,split\n0018ae58b01bdadc8e347995b69f99aa,holdout\n")
    with pytest.raises(ConfigError, match=r"line 2 \(split='holdout'\)"):
        lb.build_panda(tmp_path / "train.csv", tmp_path / "split.csv")
    (tmp_path / "split.csv").write_text("image_id,split\nnot-a-panda-slide,train\n")
    with pytest.raises(ConfigError, match="not-a-panda-slide"):
        lb.build_panda(tmp_path / "train.csv", tmp_path / "split.csv")


# the BCR clinical patient table: a header, the header again, a CDE_ID line, then patients
BCR = (
    "bcr_patient_uuid\tbcr_patient_barcode\tgleason_pattern_primary\tgleason_pattern_secondary\tgleason_score\n"
    "bcr_patient_uuid\tbcr_patient_barcode\tgleason_pattern_primary\tgleason_pattern_secondary\tgleason_score\n"
    "CDE_ID:\tCDE_ID:2003301\tCDE_ID:3203106\tCDE_ID:3203104\tCDE_ID:3203100\n"
    "u1\tTCGA-2A-A8VL\t3\t4\t7\n"
    "u2\tTCGA-2A-A8VO\t4\t3\t7\n"
    "u3\tTCGA-EJ-5495\t5\t4\t9\n"
    "u4\tTCGA-HC-7740\t3\t3\t6\n"
    "u5\tTCGA-XJ-A83H\t[Not Available]\t4\t\n"
)


def test_tcga_prad_gleason_to_isup_per_slide(tmp_path):
    (tmp_path / "clinical_patient_prad.txt").write_text(BCR)
    slides = tmp_path / "slides"
    slides.mkdir()
    names = ["TCGA-2A-A8VL-01Z-00-DX1.6B3A3A56-0B43-4A4B-8D6F-1D0B2E3C4A51.svs",
             "TCGA-2A-A8VO-01Z-00-DX1.7A3B4C5D-1E2F-3A4B-5C6D-7E8F9A0B1C2D.svs",
             "TCGA-EJ-5495-01Z-00-DX1.0F1E2D3C-4B5A-6978-8A9B-0C1D2E3F4A5B.svs",
             "TCGA-HC-7740-01Z-00-DX1.1A2B3C4D-5E6F-7A8B-9C0D-1E2F3A4B5C6D.svs",
             "TCGA-HC-7740-01Z-00-DX2.2B3C4D5E-6F7A-8B9C-0D1E-2F3A4B5C6D7E.svs"]
    for n in names:
        (slides / n).write_bytes(b"")
    out = tmp_path / "tcga.csv"
    assert main(["labels", "tcga-prad", str(tmp_path / "clinical_patient_prad.txt"), "--slides", str(slides),
                 "--out", str(out)]) == 0
    table = pd.read_csv(out)
    by_patient = dict(zip(table["patient"], table["label"]))
    assert by_patient == {"TCGA-2A-A8VL": 2, "TCGA-2A-A8VO": 3, "TCGA-EJ-5495": 5, "TCGA-HC-7740": 1}
    assert len(table) == 5 and set(table["split"]) == {"test"} and (table["isup_grade"] == table["label"]).all()
    assert table["slide_id"].iloc[0] == names[0][:-4]


def test_tcga_prad_gdc_clinical_tsv_and_bad_rows(tmp_path):
    gdc = (
        "cases.submitter_id\tdiagnoses.primary_gleason_grade\tdiagnoses.secondary_gleason_grade\n"
        "TCGA-2A-A8VL\tPattern 4\tPattern 4\n"
        "TCGA-2A-A8VL\tPattern 4\tPattern 4\n"  # one row per treatment: duplicates agree
        "TCGA-XJ-A83H\t'--\tPattern 4\n"
        "TCGA-EJ-5495\tPattern 7\tPattern 3\n"
    )
    (tmp_path / "clinical.tsv").write_text(gdc)
    (tmp_path / "gdc_manifest.txt").write_text(
        "id\tfilename\tmd5\tsize\tstate\n"
        "x\tTCGA-2A-A8VL-01Z-00-DX1.AAA.svs\t0\t1\treleased\n"
    )
    table = lb.build_tcga_prad(tmp_path / "clinical.tsv", tmp_path / "gdc_manifest.txt")
    assert table[["slide_id", "label", "gleason"]].values.tolist() == [["TCGA-2A-A8VL-01Z-00-DX1.AAA", 4, "4+4"]]
    (tmp_path / "list.txt").write_text("TCGA-XJ-A83H-01Z-00-DX1.B.svs\nTCGA-EJ-5495-01Z-00-DX1.C.svs\n")
    with pytest.raises(ConfigError) as exc:
        lb.build_tcga_prad(tmp_path / "clinical.tsv", tmp_path / "list.txt")
    message = str(exc.value)
    assert "line 4 (TCGA-XJ-A83H: diagnoses.primary_gleason_grade=\"'--\"" in message
    assert "line 5 (TCGA-EJ-5495: diagnoses.primary_gleason_grade='Pattern 7'" in message
    (tmp_path / "list.txt").write_text("TCGA-ZZ-0000-01Z-00-DX1.D.svs\n")
    with pytest.raises(ConfigError, match="patient is not in the clinical table: TCGA-ZZ-0000"):
        lb.build_tcga_prad(tmp_path / "clinical.tsv", tmp_path / "list.txt")


def c17_stage_labels(n_patients: int = 10) -> str:
    lines = ["patient,stage"]
    stages = ["negative", "itc", "micro", "macro"]
    for p in range(n_patients):
        node_stages = ["negative"] * 5 if p % 2 == 0 else ["negative", stages[1 + p % 3], "negative", "macro", "negative"]
        lines.append(f"patient_{p:03d}.zip,{'pN0' if p % 2 == 0 else 'pN1'}")
        lines += [f"patient_{p:03d}_node_{n}.tif,{s}" for n, s in enumerate(node_stages)]
    return "\n".join(lines) + "\n"


def test_camelyon17_slides_patient_split_and_corrected_labels(tmp_path):
    (tmp_path / "stage_labels.csv").write_text(c17_stage_labels())
    (tmp_path / "corrected.csv").write_text("patient,stage\npatient_000_node_2.tif,micro\n")
    out = tmp_path / "c17.csv"
    assert main(["labels", "camelyon17", str(tmp_path / "stage_labels.csv"), "--corrected",
                 str(tmp_path / "corrected.csv"), "--out", str(out), "--seed", "3"]) == 0
    table = pd.read_csv(out)
    assert len(table) == 50  # the patient rows (.zip) are not slides
    row = table.set_index("slide_id").loc["patient_000_node_2"]
    assert (row["label"], row["stage"], row["label_source"]) == (1, "micro", "corrected")
    assert table.set_index("slide_id").loc["patient_001_node_1", "label"] == 1  # itc counts as metastasis
    assert table.set_index("slide_id").loc["patient_001_node_0", "label"] == 0
    # all five nodes of a patient share one split, and every split has both classes
    assert (table.groupby("patient")["split"].nunique() == 1).all()
    assert table.groupby("split")["label"].nunique().to_dict() == {"test": 2, "train": 2, "val": 2}
    again = lb.build_camelyon17(tmp_path / "stage_labels.csv", tmp_path / "corrected.csv", seed=3)
    assert again["split"].tolist() == table["split"].tolist()  # the seed fixes the draw
    (tmp_path / "bad.csv").write_text("patient,stage\npatient_000_node_0.tif,isolated\npatient_000.zip,pN0\n")
    with pytest.raises(ConfigError, match=r"line 2 \(patient_000_node_0\.tif: stage='isolated'\)"):
        lb.build_camelyon17(tmp_path / "bad.csv")
    (tmp_path / "corrected.csv").write_text("patient,stage\npatient_999_node_0.tif,macro\n")
    with pytest.raises(ConfigError, match="patient_999_node_0"):
        lb.build_camelyon17(tmp_path / "stage_labels.csv", tmp_path / "corrected.csv")


def test_camelyon16_reference_and_training_names(tmp_path):
    (tmp_path / "reference.csv").write_text(
        "test_001,Tumor,Macro,Yes\ntest_002,Normal,None,No\ntest_003,Tumor,Micro,No\n"
    )
    train = tmp_path / "training"
    train.mkdir()
    for n in ("normal_001.tif", "tumor_001.tif", "tumor_002.tif"):
        (train / n).write_bytes(b"")
    out = tmp_path / "c16.csv"
    assert main(["labels", "camelyon16", str(tmp_path / "reference.csv"), "--training-slides", str(train),
                 "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert dict(zip(table["slide_id"], table["label"])) == {
        "normal_001": 0, "test_001": 1, "test_002": 0, "test_003": 1, "tumor_001": 1, "tumor_002": 1}
    assert set(table["split"]) == {"test"}
    (tmp_path / "reference.csv").write_text("test_001,Tumor,Macro,Yes\ntest_002,Benign,None,No\n")
    with pytest.raises(ConfigError, match=r"line 2 \(test_002: class='Benign'\)"):
        lb.build_camelyon16(tmp_path / "reference.csv")
