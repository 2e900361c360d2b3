"""`pathtwt analyze`: norm growth on the real ViT-S, eps sensitivity, and intrinsic
dimension / augmentation stability of a teacher against a student folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.torch import save_file

from pathtwt.analysis.stability import augment_tile
from pathtwt.models.registry import create_backbone, variant_metadata
from pathtwt.cli import main
from pathtwt.io.atomic import write_json_atomic

PLAN = [[1, 3], [4, 6], [7, 9], [10, 12]]


def layer_subset_student(folder, name="vit-s14-tiny", blocks=PLAN):
    """A plain-timm student keeping the teacher's layer at each block end (the random
    teacher of --random-init, init_seed 0), written as a backbone variant folder."""
    teacher = create_backbone(name, pretrained=False)
    ends = [e - 1 for _, e in blocks]
    state = {}
    for key, value in teacher.model.state_dict().items():
        if key.startswith("blocks."):
            _, i, rest = key.split(".", 2)
            if int(i) not in ends:
                continue
            key = f"blocks.{ends.index(int(i))}.{rest}"
        state[key] = value.contiguous()
    folder.mkdir(parents=True)
    save_file(state, folder / "model.safetensors")
    meta = variant_metadata(teacher.spec, len(blocks), name=f"{name}/subset-{len(blocks)}", method="subset",
                            plan={"blocks": blocks})
    write_json_atomic(folder / "model.json", meta)
    return folder


def captioned(path):
    assert path.stat().st_size > 1000
    return json.loads(path.with_suffix(".json").read_text())["caption"]


def test_norm_growth_of_the_real_vit_s(tmp_path, vit_s_weights, shared_tiles):
    out = tmp_path / "norms"
    assert main(["analyze", "norms", "--backbone", "vit-s14-imgfocus", "--weights", str(vit_s_weights),
                 "--calibration", str(shared_tiles / "nct-crc-he"), "--n-tiles", "4", "--batch-size", "4",
                 "--device", "cpu", "--out", str(out)]) == 0
    summary = json.loads((out / "norms_summary.json").read_text())
    rows = summary["rows"]
    assert [r["layer"] for r in rows] == list(range(1, 13))
    # the late growth known for this backbone: about 30x from block 1 to block 12
    assert rows[-1]["patch_norm"] / rows[0]["patch_norm"] > 10
    assert summary["patch_norm_growth"] == pytest.approx(rows[-1]["patch_norm_vs_layer1"])
    assert rows[-1]["patch_norm"] > max(r["patch_norm"] for r in rows[:-1])
    assert all(r["patch_residual_ratio"] > 0 and r["cls_norm"] > 0 for r in rows)
    assert (out / "norms.csv").read_text().startswith("layer,patch_norm,cls_norm")
    assert "norm" in captioned(out / "norms.png")


def test_eps_sensitivity_over_discover_folders(tmp_path):
    rng = np.random.default_rng(0)
    for name, scale in (("a", 1.0), ("b", 0.5)):
        x = np.cumsum(rng.uniform(0, 1, 12)) * scale / 12
        (tmp_path / name).mkdir()
        np.save(tmp_path / name / "similarity.npy", np.abs(x[:, None] - x[None, :]))
        write_json_atomic(tmp_path / name / "plan.json", {"backbone": f"net-{name}", "blocks": [[1, 12]]})
    out = tmp_path / "eps"
    assert main(["analyze", "eps", "--discovery", str(tmp_path / "a"), f"half={tmp_path / 'b'}", "--n-eps", "30",
                 "--out", str(out)]) == 0
    counts = json.loads((out / "eps_sensitivity_summary.json").read_text())["n_blocks"]
    assert set(counts) == {"net-a", "half"}
    for c in counts.values():
        assert c[0] == 12 and c[-1] == 1 and all(p >= q for p, q in zip(c, c[1:]))
    # the half-scale matrix merges sooner at every eps
    assert all(h <= a for h, a in zip(counts["half"], counts["net-a"]))
    assert captioned(out / "eps_sensitivity.png")


def test_augmentation_is_seeded_and_changes_the_tile():
    tile = np.random.default_rng(0).integers(0, 255, (56, 56, 3), np.uint8)
    a = augment_tile(tile, np.random.default_rng(5))
    assert a.shape == tile.shape and a.dtype == np.uint8 and not np.array_equal(a, tile)
    np.testing.assert_array_equal(a, augment_tile(tile, np.random.default_rng(5)))


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    return layer_subset_student(tmp_path_factory.mktemp("student") / "subset-4")


def teacher_args(shared_tiles, out):
    return ["--backbone", "vit-s14-tiny", "--random-init", "--calibration", str(shared_tiles / "kather2016"),
            "--n-tiles", "24", "--part", "all", "--batch-size", "12", "--device", "cpu", "--out", str(out)]


def test_intrinsic_dim_teacher_and_student(tmp_path, shared_tiles, student):
    out = tmp_path / "id"
    assert main(["analyze", "intrinsic-dim", *teacher_args(shared_tiles, out), "--student", str(student)]) == 0
    res = json.loads((out / "intrinsic_dim.json").read_text())
    assert res["teacher_layers"] == [3, 6, 9, 12] and res["n_tiles"] == 24
    for model in ("teacher", "student"):
        for kind in ("cls", "patch-mean", "patch-seq"):
            ids = res["ids"][model][kind]
            assert len(ids) == 4 and all(0 < v < 1024 for v in ids)
    # the student's layer j is the teacher's layer e_j fed by fewer layers: different inputs
    assert res["ids"]["student"]["cls"] != res["ids"]["teacher"]["cls"]
    header = (out / "intrinsic_dim.csv").read_text().splitlines()[0]
    assert header.startswith("boundary,teacher_layer,student_layer,teacher_cls")
    assert "intrinsic dimension" in captioned(out / "intrinsic_dim_patch-seq.png")


def test_stability_table(tmp_path, shared_tiles, student):
    out = tmp_path / "stab"
    assert main(["analyze", "stability", *teacher_args(shared_tiles, out), "--student", str(student),
                 "--n-draws", "3", "--representations", "cls", "patch-seq"]) == 0
    res = json.loads((out / "stability.json").read_text())
    rows = res["tables"]["cls"]
    assert [r["teacher_layer"] for r in rows] == [3, 6, 9, 12] and [r["student_layer"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["teacher_id_sd"] > 0 and r["student_id_sd"] > 0  # augmentations move the estimates
        assert r["sd_reduction_pct"] == pytest.approx(100 * (1 - r["student_id_sd"] / r["teacher_id_sd"]))
        assert 0 < r["teacher_rep_sd"] < 1 and 0 < r["student_rep_sd"] < 1
    assert "teacher_rep_sd" not in res["tables"]["patch-seq"][0]  # spread kept only for vector views
    md = (out / "stability.md").read_text()
    assert "| boundary | teacher layer | teacher ID (cls) mean (sd)" in md and md.count("\n| 4 | 12 |") == 2
    assert captioned(out / "stability_cls.png")


def test_student_without_plan_is_refused(tmp_path, shared_tiles, student):
    meta = json.loads((student / "model.json").read_text())
    broken = tmp_path / "noplan"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes((student / "model.safetensors").read_bytes())
    write_json_atomic(broken / "model.json", {k: v for k, v in meta.items() if k != "plan"})
    args = teacher_args(shared_tiles, tmp_path / "o")
    assert main(["analyze", "intrinsic-dim", *args, "--student", str(broken)]) == 1


def test_analyze_says_when_sources_cannot_give_the_part(tmp_path, shared_tiles, capsys):
    from argparse import Namespace

    from pathtwt.cli.analyze import _tiles

    images = shared_tiles / "kather2016"
    calib = tmp_path / "calib.h5"
    assert main(["calibrate", "--images", str(images), "--out", str(calib), "--n-tiles", "12", "--holdout", "0.5",
                 "--no-progress"]) == 0
    capsys.readouterr()
    args = lambda source: Namespace(calibration=[str(source)], part="report", n_tiles=6, seed=0)  # noqa: E731
    assert len(_tiles(args(calib))) == 3  # the report part of 12 tiles held out by half
    assert "note:" not in capsys.readouterr().err
    assert len(_tiles(args(images))) == 6  # images carry no split: a fresh draw, said so
    assert "--part report needs a calib.h5" in capsys.readouterr().err
