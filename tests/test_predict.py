"""`pathtwt predict`, `pathtwt heatmap` and `pathtwt tile --roi` on real slides (the CMU
SVS and a BACH JPEG) with the tiny random-weight ViT-S double and briefly trained ABMIL and
TransMIL heads: predicting from the slide equals predicting from its extracted features,
the heatmap shows the attention over the tissue, the QuPath GeoJSON holds the tiles inside
the slide with their attention, a ROI keeps only the tiles inside it, and every bad input
is refused in one line with nothing written."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from conftest import SHARED, _need
from pathtwt.cli import main

BACKBONE = ["--backbone", "vit-s14-tiny", "--random-init"]
TILING = ["--mpp", "1.0", "--tile-size", "128"]
FAST = ["--device", "cpu", "--no-progress", "--workers", "0"]
BACH_MPP = "0.42"


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def study(tmp_path_factory, shared_slides):
    """The CMU slide tiled and embedded, and ABMIL and TransMIL heads trained for one
    epoch on noisy copies of its features (a cohort of 8 bags, 2 classes)."""
    root = tmp_path_factory.mktemp("study")
    slide = shared_slides / "CMU-1-Small-Region.svs"
    assert main(["tile", str(slide), "--out", str(root / "coords" / "cmu.h5"), *TILING]) == 0
    assert main(["extract", str(slide), "--coords", str(root / "coords" / "cmu.h5"), "--out",
                 str(root / "features" / "cmu.h5"), *BACKBONE, *FAST]) == 0
    rng = np.random.default_rng(0)
    (root / "cohort").mkdir()
    rows = []
    for i in range(8):
        copy = root / "cohort" / f"s{i}.h5"
        shutil.copy(root / "features" / "cmu.h5", copy)
        with h5py.File(copy, "r+") as h5:
            h5["features"][...] = h5["features"][()] + rng.normal(0, 0.5, h5["features"].shape) + (i % 2) * 0.5
        rows.append({"slide_id": f"s{i}", "label": i % 2, "split": "train" if i < 6 else "val"})
    pd.DataFrame(rows).to_csv(root / "labels.csv", index=False)
    runs = {}
    for head in ("abmil", "transmil"):
        runs[head] = root / "runs" / head
        assert main(["train-mil", "--features", str(root / "cohort"), "--labels", str(root / "labels.csv"),
                     "--protocol", "grading", "--aggregator", head, "--out", str(runs[head]), "--epochs", "1",
                     "--hidden-dim", "16", "--heads", "2", "--landmarks", "4", "--device", "cpu", "--no-progress"]) == 0
    return {"root": root, "slide": slide, "coords": root / "coords" / "cmu.h5",
            "features": root / "features" / "cmu.h5", "runs": runs}


@pytest.fixture(scope="module")
def bach_image():
    return _need(SHARED / "data" / "bach" / "images" / "b005.jpeg")


def _predict(capsys, slide, runs, out, *extra):
    argv = ["predict", str(slide), *BACKBONE, *[a for r in runs for a in ("--run", str(r))], "--out", str(out), *FAST, *extra]
    code, stdout, err = _run(capsys, argv)
    assert code == 0, err
    return pd.read_csv(out)


def test_predict_from_the_slide_equals_predict_from_its_features(study, tmp_path, capsys):
    runs = [study["runs"]["abmil"], study["runs"]["transmil"]]
    # end to end: tiled and embedded here (the runs' tiling, read from their training features)
    fresh = _predict(capsys, study["slide"], runs, tmp_path / "a.csv", "--features", str(tmp_path / "new"))
    written = tmp_path / "new" / "CMU-1-Small-Region.h5"
    with h5py.File(written, "r") as a, h5py.File(study["features"], "r") as b:
        assert a.attrs["target_mpp"] == 1.0 and a.attrs["patch_size"] == 128
        np.testing.assert_allclose(a["features"][()], b["features"][()], rtol=1e-5, atol=1e-5)
    # from the features extracted before (reused, no backbone needed)
    reuse = tmp_path / "old"
    reuse.mkdir()
    shutil.copy(study["features"], reuse / "CMU-1-Small-Region.h5")
    again = _predict(capsys, study["slide"], runs, tmp_path / "b.csv", "--features", str(reuse))
    assert list(fresh.columns[:4]) == ["slide_id", "p0", "p1", "predicted"]
    assert fresh["slide_id"].tolist() == ["CMU-1-Small-Region"]
    np.testing.assert_allclose(fresh[["p0", "p1"]].to_numpy(), again[["p0", "p1"]].to_numpy(), atol=1e-5)
    # the mean over runs, and the prediction its argmax
    runs_p0 = fresh[["run1_p0", "run2_p0"]].to_numpy().mean(axis=1)
    np.testing.assert_allclose(fresh["p0"], runs_p0, atol=1e-5)
    assert fresh["predicted"].iloc[0] == int(fresh[["p0", "p1"]].to_numpy().argmax())
    assert fresh["run1_p0"].iloc[0] != pytest.approx(fresh["run2_p0"].iloc[0], abs=1e-9)  # two distinct heads


def test_predict_a_bach_jpeg_needs_its_pixel_size(study, bach_image, tmp_path, capsys):
    runs = [study["runs"]["abmil"]]
    argv = ["predict", str(bach_image), *BACKBONE, "--run", str(runs[0]), "--out", str(tmp_path / "x.csv"), *FAST]
    code, _, err = _run(capsys, argv)
    assert code == 1 and "--slide-mpp" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.csv").exists()
    fresh = _predict(capsys, bach_image, runs, tmp_path / "a.csv", "--slide-mpp", BACH_MPP)
    # the same slide tiled and embedded by the stage commands, then predicted from its features
    coords, feats = tmp_path / "c" / "b005.h5", tmp_path / "f" / "b005.h5"
    assert main(["tile", str(bach_image), "--out", str(coords), *TILING, "--slide-mpp", BACH_MPP]) == 0
    assert main(["extract", str(bach_image), "--coords", str(coords), "--out", str(feats), *BACKBONE, *FAST]) == 0
    capsys.readouterr()
    again = _predict(capsys, bach_image, runs, tmp_path / "b.csv", "--features", str(tmp_path / "f"))
    assert fresh["n_tiles"].iloc[0] == again["n_tiles"].iloc[0] > 10
    np.testing.assert_allclose(fresh[["p0", "p1"]].to_numpy(), again[["p0", "p1"]].to_numpy(), atol=1e-5)


def _attention(run, features):
    from pathtwt.explain.runs import load_head
    from pathtwt.explain.scores import score_bag

    with h5py.File(features, "r") as h5:
        return score_bag(load_head(run), h5["features"][()]).attention


def test_heatmap_and_qupath_geojson_of_the_cmu_slide(study, tmp_path, capsys):
    out = tmp_path / "hm"
    code, stdout, err = _run(capsys, ["heatmap", str(study["slide"]), "--coords", str(study["coords"]), "--features",
                                      str(study["features"]), "--run", str(study["runs"]["abmil"]), "--out", str(out),
                                      "--mpp", "2", "--top-k", "4", "--tiff"])
    assert code == 0, err
    for name in ("cmu.heatmap.png", "cmu.top_tiles.png", "cmu.geojson", "cmu.heatmap.tif"):
        assert (out / name).is_file(), name
    # the PNG: the slide at 2 um/px (2220 x 2967 at 0.499 um/px -> 554 x 741) beside a legend
    png = np.asarray(Image.open(out / "cmu.heatmap.png").convert("RGB"))
    assert png.shape[0] >= 740 and png.shape[1] > 554 + 200
    coords = h5py.File(study["coords"], "r")["coords"][()]
    side = int(h5py.File(study["coords"], "r").attrs["patch_size_level0"])
    scale = 0.499 / 2
    from pathtwt.wsi.slides import open_slide
    from pathtwt.explain.heatmap import canvas_for, read_background

    with open_slide(study["slide"]) as slide:
        plain = read_background(slide, canvas_for(slide.dimensions, slide.mpp, 2.0))
    drawn = png[: plain.shape[0], : plain.shape[1]].astype(int)
    covered = np.zeros(plain.shape[:2], bool)
    for x, y in coords:
        covered[int(y * scale) + 2 : int((y + side) * scale) - 2, int(x * scale) + 2 : int((x + side) * scale) - 2] = True
    changed = np.abs(drawn - plain.astype(int)).sum(axis=2) > 12
    assert changed[covered].mean() > 0.95  # the attention is drawn over every tile (the tissue)
    assert changed[~np.pad(covered, 0)].mean() < 0.05  # and nowhere else
    # the GeoJSON: QuPath's FeatureCollection in level-0 pixels, inside the slide
    data = json.loads((out / "cmu.geojson").read_text())
    assert data["type"] == "FeatureCollection"
    kinds = [f["properties"]["objectType"] for f in data["features"]]
    assert kinds.count("tile") == len(coords) and "annotation" in kinds
    points = np.array([p for f in data["features"] for ring in f["geometry"]["coordinates"] for p in ring])
    assert points.min() >= 0 and points[:, 0].max() <= 2220 and points[:, 1].max() <= 2967
    tiles = [f for f in data["features"] if f["properties"]["objectType"] == "tile"]
    corners = np.array([f["geometry"]["coordinates"][0][0] for f in tiles])
    np.testing.assert_array_equal(corners, coords)
    measured = np.array([f["properties"]["measurements"]["attention"] for f in tiles])
    attention = _attention(study["runs"]["abmil"], study["features"])
    hi, lo = int(np.argmax(attention)), int(np.argmin(attention))
    assert measured[hi] > measured[lo]
    np.testing.assert_allclose(measured, attention, rtol=1e-5)
    assert {f["properties"]["classification"]["name"] for f in tiles} == {f"class {int(json.loads(stdout)['predicted'])}"}
    # QuPath out, then in: the GeoJSON as a ROI keeps the tiles inside its tissue outline
    assert main(["tile", str(study["slide"]), "--out", str(tmp_path / "again.h5"), *TILING,
                 "--roi", str(out / "cmu.geojson")]) == 0
    kept = h5py.File(tmp_path / "again.h5", "r")["coords"][()]
    assert 0.8 * len(coords) <= len(kept) <= len(coords)
    tiffslide = pytest.importorskip("tiffslide")
    with tiffslide.TiffSlide(out / "cmu.heatmap.tif") as tif:
        assert tif.level_dimensions[0] == (plain.shape[1], plain.shape[0])
        assert float(tif.properties["tiffslide.mpp-x"]) == pytest.approx(2.0, rel=1e-3)


def test_transmil_heatmap_of_a_bach_jpeg(study, bach_image, tmp_path, capsys):
    coords, feats = tmp_path / "b005.coords.h5", tmp_path / "b005.h5"
    assert main(["tile", str(bach_image), "--out", str(coords), *TILING, "--slide-mpp", BACH_MPP]) == 0
    assert main(["extract", str(bach_image), "--coords", str(coords), "--out", str(feats), *BACKBONE, *FAST]) == 0
    code, _, err = _run(capsys, ["heatmap", str(bach_image), "--coords", str(coords), "--features", str(feats),
                                 "--run", str(study["runs"]["transmil"]), "--out", str(tmp_path / "hm"), "--smooth", "50"])
    assert code == 0, err
    assert (tmp_path / "hm" / "b005.heatmap.png").is_file() and (tmp_path / "hm" / "b005.top_tiles.png").is_file()
    data = json.loads((tmp_path / "hm" / "b005.geojson").read_text())
    tiles = [f for f in data["features"] if f["properties"]["objectType"] == "tile"]
    assert len(tiles) == len(h5py.File(feats, "r")["features"])
    values = [f["properties"]["measurements"]["attention"] for f in tiles]
    ranks = [f["properties"]["measurements"]["attention_rank"] for f in tiles]
    assert np.argmax(values) == np.argmax(ranks) and max(ranks) == 1.0


def _cmu_roi(path, features):
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    return path


def _polygon(x0, y0, x1, y1, name=None):
    props = {"objectType": "annotation"}
    if name:
        props["classification"] = {"name": name, "color": [200, 0, 0]}
    return {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [
        [[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]]}, "properties": props}


def test_tile_with_a_roi_keeps_only_the_tiles_inside_it(study, tmp_path):
    from pathtwt.io.h5 import read_coords
    from pathtwt.wsi.roi import recorded_roi

    whole, _, _ = read_coords(study["coords"])
    roi = _cmu_roi(tmp_path / "roi.geojson", [_polygon(700, 900, 1700, 2400, "Tumor"),
                                              _polygon(1000, 1500, 1400, 1900, "Ignore*")])
    out = tmp_path / "roi.h5"
    assert main(["tile", str(study["slide"]), "--out", str(out), *TILING, "--roi", str(roi),
                 "--thumbnail", str(tmp_path / "roi.png")]) == 0
    thumb = np.asarray(Image.open(tmp_path / "roi.png").convert("RGB")).reshape(-1, 3)
    from pathtwt.wsi.thumbnail import EXCLUDED_COLOUR, ROI_COLOUR

    for colour in (ROI_COLOUR, EXCLUDED_COLOUR):  # both regions outlined on the thumbnail
        assert (thumb == colour).all(axis=1).sum() > 100
    kept, _, attrs = read_coords(out)
    side = attrs["patch_size_level0"]
    centres = kept + side / 2
    assert 0 < len(kept) < len(whole)
    assert ((centres[:, 0] >= 700) & (centres[:, 0] <= 1700) & (centres[:, 1] >= 900) & (centres[:, 1] <= 2400)).all()
    in_hole = (centres[:, 0] > 1000) & (centres[:, 0] < 1400) & (centres[:, 1] > 1500) & (centres[:, 1] < 1900)
    assert not in_hole.any()
    # every tissue tile whose centre is in the region and not in the excluded one is kept
    wc = whole + side / 2
    expected = ((wc[:, 0] >= 700) & (wc[:, 0] <= 1700) & (wc[:, 1] >= 900) & (wc[:, 1] <= 2400)
                & ~((wc[:, 0] > 1000) & (wc[:, 0] < 1400) & (wc[:, 1] > 1500) & (wc[:, 1] < 1900)))
    assert sorted(map(tuple, kept)) == sorted(map(tuple, whole[expected]))
    assert attrs["roi_path"] == str(roi) and attrs["roi_include_regions"] == 1 and attrs["roi_exclude_regions"] == 1
    assert attrs["roi_tiles_before"] == len(whole) and len(attrs["roi_sha256"]) == 64
    assert [r.classification for r in recorded_roi(out).regions] == ["Tumor", "Ignore*"]


def test_runs_without_recorded_provenance_and_folders_of_runs(study, tmp_path):
    """A checkpoint written before heads recorded their features' provenance falls back on
    the features folder its metrics.json names; a folder holding runs only below it is
    refused naming them."""
    import torch

    from pathtwt.errors import PathtwtError
    from pathtwt.explain.runs import load_head

    old = tmp_path / "old" / "seed0"
    shutil.copytree(study["runs"]["abmil"], old)
    state = torch.load(old / "checkpoint.pt", weights_only=True)
    assert state["features"]["backbone"] == "vit-s14-tiny" and state["features"]["target_mpp"] == 1.0
    del state["features"]
    torch.save(state, old / "checkpoint.pt")
    assert load_head(old).provenance["embedding_recipe"] == "cls+mean"  # from metrics.json's features folder
    metrics = json.loads((old / "metrics.json").read_text())
    metrics["sources"]["features"] = str(tmp_path / "gone")
    (old / "metrics.json").write_text(json.dumps(metrics))
    assert load_head(old).provenance == {}
    with pytest.raises(PathtwtError, match=r"no checkpoint.pt; it holds runs in seed0"):
        load_head(tmp_path / "old")


def _fake_head_run(folder, aggregator="meanpool"):
    import torch

    folder.mkdir(parents=True)
    torch.save({"model": {}, "aggregator": aggregator, "in_dim": 128, "n_classes": 2, "config": {}}, folder / "checkpoint.pt")
    return folder


BAD = {
    "roi in another slide's frame": ("tile", "roi_far", "lie outside slide"),
    "invalid geojson": ("tile", "roi_invalid", "invalid JSON"),
    "empty geojson": ("tile", "roi_empty", "no polygon"),
    "roi that leaves no tile": ("tile", "roi_background", "keeps none of the"),
    "run without checkpoint": ("predict", "no_checkpoint", "no checkpoint.pt"),
    "head of another embedding": ("predict", "other_embedding", "64-d"),
    "head of another backbone": ("predict", "other_backbone", "h0-mini-tiny"),
    "head without attention": ("heatmap", "meanpool", "no per-tile attention"),
    "heatmap of another slide than its coords": ("heatmap", "other_slide", "does not match the coords file"),
    "slide without a pixel size": ("tile", "bach_no_mpp", "--slide-mpp"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_is_one_line_and_writes_nothing(study, bach_image, tmp_path, capsys, case):
    command, kind, message = BAD[case]
    out = tmp_path / "out.h5" if command == "tile" else tmp_path / "out.csv" if command == "predict" else tmp_path / "hm"
    slide = study["slide"]
    roi = tmp_path / "roi.geojson"
    if kind == "roi_far":
        _cmu_roi(roi, [_polygon(50_000, 50_000, 60_000, 60_000)])
    elif kind == "roi_invalid":
        roi.write_text('{"type": "FeatureCollection", "features": [')
    elif kind == "roi_empty":
        _cmu_roi(roi, [])
    elif kind == "roi_background":
        _cmu_roi(roi, [_polygon(0, 0, 150, 150)])  # glass in the top-left corner
    if command == "tile":
        argv = ["tile", str(bach_image if kind == "bach_no_mpp" else slide), "--out", str(out), *TILING]
        argv += [] if kind == "bach_no_mpp" else ["--roi", str(roi)]
    elif command == "predict":
        run = study["runs"]["abmil"]
        extra = []
        if kind == "no_checkpoint":
            run = tmp_path / "empty_run"
            run.mkdir()
        elif kind == "other_embedding":
            extra = ["--embedding", "cls"]
        argv = ["predict", str(slide), "--run", str(run), "--out", str(out), *FAST, *extra, "--random-init",
                "--backbone", "h0-mini-tiny" if kind == "other_backbone" else "vit-s14-tiny"]
    else:
        run = _fake_head_run(tmp_path / "meanpool") if kind == "meanpool" else study["runs"]["abmil"]
        argv = ["heatmap", str(slide.with_name("small.svs") if kind == "other_slide" else slide), "--coords", str(study["coords"]),
                "--features", str(study["features"]), "--run", str(run), "--out", str(out)]
    code, _, err = _run(capsys, argv)
    assert code == 1, err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".") and p.is_file()]  # no temporary left
