"""pathtwt's files as TRIDENT, CLAM and STAMP read them, and theirs as pathtwt reads them.

The readers are reproduced here statement for statement (dataset names, attribute names,
dtypes, the calls they make), not imported: the tools are not dependencies of pathtwt."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pandas as pd
import pytest
import torch

from pathtwt.cli import main
from pathtwt.io import h5 as h5io

CMU = "CMU-1-Small-Region.svs"


@pytest.fixture(scope="module")
def real_files(tmp_path_factory, shared_slides):
    """A coords and a features file made by `pathtwt tile` and `pathtwt extract` on a real
    slide, tiled at the slide's own resolution (0.499 um/px), so tiles are read at level 0."""
    root = tmp_path_factory.mktemp("real")
    slide = shared_slides / CMU
    coords, feats = root / "tiles" / "CMU-1.h5", root / "features" / "CMU-1.h5"
    assert main(["tile", str(slide), "--out", str(coords), "--mpp", "0.499", "--tile-size", "224"]) == 0
    assert main(["extract", str(slide), "--coords", str(coords), "--out", str(feats), "--backbone",
                 "vit-s14-tiny", "--random-init", "--workers", "0", "--no-progress", "--device", "cpu"]) == 0
    return slide, coords, feats


def test_trident_reads_coords_and_features_files(real_files):
    _slide, coords_path, feats_path = real_files
    # TRIDENT's read_coords
    with h5py.File(coords_path, "r") as f:
        attrs = dict(f["coords"].attrs)
        coords = f["coords"][:]
    assert coords.dtype == np.int64 and coords.ndim == 2 and coords.shape[1] == 2 and len(coords) > 5
    assert attrs["patch_size"] == 224 and attrs["patch_size_level0"] == 224
    assert attrs["level0_width"] == 2220 and attrs["level0_height"] == 2967
    assert attrs["target_magnification"] == 20 and attrs["level0_magnification"] == 20
    # TRIDENT's read_coords_legacy (CLAM-style coords)
    with h5py.File(coords_path, "r") as f:
        patch_size = f["coords"].attrs["patch_size"]
        patch_level = f["coords"].attrs["patch_level"]
        custom_downsample = f["coords"].attrs.get("custom_downsample", 1)
    assert (patch_size, patch_level, custom_downsample) == (224, 0, 1)
    # TRIDENT's slide-feature extraction and heatmaps on a patch-features file
    with h5py.File(feats_path, "r") as f:
        coords_f = f["coords"][:]
        patch_features = f["features"][:]
        coords_attrs = dict(f["coords"].attrs)
    patch_features = torch.from_numpy(patch_features).float().unsqueeze(0)
    batch = {"features": patch_features, "coords": torch.from_numpy(coords_f).unsqueeze(0), "attributes": coords_attrs}
    assert batch["features"].shape == (1, len(coords), 64 * 2)
    assert np.array_equal(coords_f, coords)
    assert batch["attributes"]["patch_size_level0"] == 224  # what its slide encoders read
    assert int(batch["attributes"]["patch_level"]) == 0
    # the root copy pathtwt itself reads is still there and says what made the features
    _f, _c, root = h5io.read_features(feats_path)
    assert root["patch_size_level0"] == 224 and root["encoder"] == "vit-s14-tiny"
    assert root["embedding_recipe"] == "cls+mean" and root["embedding_dim"] == 128
    assert root["transform_input_size"] == 56  # the tiny test architecture
    assert np.allclose(root["transform_mean"], [0.485, 0.456, 0.406]) and "INTER_AREA" in root["transform_resize"]


def test_clam_reads_the_same_pixels_and_features(real_files):
    slide_path, coords_path, feats_path = real_files
    import openslide

    from pathtwt.wsi.slides import open_slide

    # CLAM's Whole_Slide_Bag_FP
    hdf5_file = h5py.File(coords_path, "r")
    dset = hdf5_file["coords"]
    patch_level = hdf5_file["coords"].attrs["patch_level"]
    patch_size = hdf5_file["coords"].attrs["patch_size"]
    length = len(dset)
    coord = hdf5_file["coords"][length // 2]
    wsi = openslide.open_slide(str(slide_path))
    img = wsi.read_region(coord, patch_level, (patch_size, patch_size)).convert("RGB")
    hdf5_file.close()
    with open_slide(slide_path) as s:
        ours = s.read_tile(int(coord[0]), int(coord[1]), 224, 0, 224)
    assert np.array_equal(np.asarray(img), ours)
    # CLAM's Generic_MIL_Dataset with use_h5 (h5_files/{slide_id}.h5)
    with h5py.File(feats_path, "r") as hdf5_file:
        features = hdf5_file["features"][:]
        coords = hdf5_file["coords"][:]
    features = torch.from_numpy(features)
    assert features.dtype == torch.float32 and features.shape == (length, 128) and coords.shape == (length, 2)


def test_export_clam_pt_round_trips(real_files, tmp_path):
    _slide, _coords, feats_path = real_files
    failed = feats_path.parent.parent / "failed"
    failed.mkdir(exist_ok=True)
    os.link(feats_path, failed / "CMU-1.h5")
    h5io.write_features(failed / "broken.h5", np.zeros((0, 128), np.float32), np.zeros((0, 2), np.int64),
                        {"status": "failed", "failure_reason": "corrupt tile"})
    out = tmp_path / "clam"
    assert main(["export-features", "--format", "clam-pt", str(failed), str(out)]) == 0
    # CLAM's Generic_MIL_Dataset without use_h5
    data_dir, slide_id = str(out), "CMU-1"
    full_path = os.path.join(data_dir, "pt_files", "{}.pt".format(slide_id))
    features = torch.load(full_path, weights_only=True)
    ours, coords, _ = h5io.read_features(feats_path)
    assert features.dtype == torch.float32 and torch.equal(features, torch.from_numpy(ours))
    with h5py.File(os.path.join(data_dir, "h5_files", "{}.h5".format(slide_id)), "r") as hdf5_file:
        assert np.array_equal(hdf5_file["features"][:], ours) and np.array_equal(hdf5_file["coords"][:], coords)
    # the failed slide is left out, and nothing half-written is left
    assert sorted(p.name for p in (out / "pt_files").iterdir()) == ["CMU-1.pt"]


def test_export_stamp_round_trips(real_files, tmp_path, capsys):
    _slide, _coords, feats_path = real_files
    out = tmp_path / "stamp"
    assert main(["export-features", "--format", "stamp", str(feats_path.parent), str(out)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["written"] == 1
    ours, coords, attrs = h5io.read_features(feats_path)
    # STAMP's get_coords ("newer STAMP format") and its bag reader
    with h5py.File(out / "CMU-1.h5", "r") as feature_h5:
        coords_um = feature_h5["coords"][:]
        tile_size_um = feature_h5.attrs.get("tile_size_um", None)
        tile_size_px = feature_h5.attrs.get("tile_size_px", None)
        unit = feature_h5.attrs.get("unit", None)
        feats = torch.from_numpy(feature_h5["feats"][:]).float()
        extractor = feature_h5.attrs["extractor"]
    assert unit == "um" and extractor == "vit-s14-tiny" and tile_size_px == 224
    assert tile_size_um == pytest.approx(224 * 0.499)
    assert tile_size_um / tile_size_px == pytest.approx(attrs["level0_mpp"])  # STAMP's CoordsInfo.mpp
    assert torch.equal(feats, torch.from_numpy(ours))
    assert np.array_equal(np.rint(coords_um / attrs["level0_mpp"]).astype(np.int64), coords)


def test_export_refuses_files_without_geometry(tmp_path, capsys):
    folder = tmp_path / "f"
    h5io.write_features(folder / "s.h5", np.ones((2, 4), np.float32), np.zeros((2, 2), np.int64), {"status": "ok"})
    assert main(["export-features", "--format", "stamp", str(folder), str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "s.h5" in err and "level0_mpp" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "s.h5").exists()


def write_trident_features(path, feats, coords):
    """A patch-features file as TRIDENT's save_h5 writes it: datasets chunked by row and
    resizable, every attribute on the datasets, none on the root."""
    assets = {"features": feats, "coords": coords}
    attributes = {
        "features": {"name": path.stem, "savetodir": str(path.parent)},
        "coords": {"patch_size": 256, "patch_size_level0": 512, "level0_magnification": 40,
                   "target_magnification": 20, "overlap": 0, "name": path.stem, "savetodir": "None",
                   "level0_width": 40000, "level0_height": 30000},
    }
    with h5py.File(path, "w") as file:
        for key, val in assets.items():
            dset = file.create_dataset(key, shape=val.shape, maxshape=(None,) + val.shape[1:],
                                       chunks=(1,) + val.shape[1:], dtype=val.dtype)
            dset[:] = val
            for attr_key, attr_val in attributes[key].items():
                dset.attrs[attr_key] = attr_val


def test_train_mil_reads_trident_written_files(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "trident" / "features_uni_v1"
    folder.mkdir(parents=True)
    rows = []
    for i in range(12):
        label = i % 2
        n = int(rng.integers(6, 15))
        feats = rng.normal(size=(n, 8)).astype(np.float32)
        feats[:, 0] += 3.0 * label  # separable, so the head learns something
        coords = (rng.integers(0, 70, size=(n, 2)) * 512).astype(np.int64)
        write_trident_features(folder / f"slide{i:02d}.h5", feats, coords)
        rows.append({"slide_id": f"slide{i:02d}", "label": label, "split": ["train", "train", "val", "test"][i % 4]})
    labels = tmp_path / "labels.csv"
    pd.DataFrame(rows).to_csv(labels, index=False)
    out = tmp_path / "run"
    assert main(["train-mil", "--features", str(folder), "--labels", str(labels), "--protocol", "metastasis",
                 "--out", str(out), "--epochs", "2", "--hidden-dim", "8", "--no-progress", "--device", "cpu"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics  # a finished run, with the TRIDENT slides in its predictions
    predictions = pd.read_csv(out / "predictions.csv")
    assert set(predictions["slide_id"]) >= {r["slide_id"] for r in rows if r["split"] != "train"}
