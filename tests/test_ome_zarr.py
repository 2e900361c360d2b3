"""OME-Zarr (NGFF multiscale) slides open, tile and read like the SVS they were written from."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

from pathtwt.cli import main  # noqa: E402
from pathtwt.errors import SlideError  # noqa: E402
from pathtwt.io.h5 import read_coords  # noqa: E402
from pathtwt.wsi.fingerprint import slide_fingerprint  # noqa: E402
from pathtwt.wsi.ome_zarr import MPP_KEY  # noqa: E402
from pathtwt.wsi.slides import open_slide  # noqa: E402
from conftest import SHARED_SLIDES  # noqa: E402
from wsi_writers import write_ome_zarr  # noqa: E402

CMU = SHARED_SLIDES / "CMU-1-Small-Region.svs"
pytestmark = pytest.mark.skipif(not CMU.is_file(), reason="../shared/data/slides/CMU-1-Small-Region.svs is absent")


@pytest.fixture(scope="module")
def cmu_zarr(tmp_path_factory) -> Path:
    """The CMU SVS's level 0 as the slide reads it, plus a 2x level, as NGFF 0.4."""
    import cv2

    with open_slide(CMU) as slide:
        w, h = slide.dimensions
        level0 = slide.read_region(0, 0, 0, w, h)
    level1 = cv2.resize(level0, (w // 2, h // 2), interpolation=cv2.INTER_AREA)
    return write_ome_zarr(tmp_path_factory.mktemp("zarr") / "CMU-1.ome.zarr", [level0, level1], 0.499)


def test_opens_with_levels_and_pixel_size(cmu_zarr):
    with open_slide(cmu_zarr) as slide:
        assert slide.reader == "ome-zarr" and slide.mpp_source == MPP_KEY and slide.mpp == pytest.approx(0.499)
        assert slide.level_dimensions == [(2220, 2967), (1110, 1483)] and slide.level_downsamples == [1.0, 2.0]
        assert slide.level_for_mpp(1.0) == 1
        # out-of-slide pixels are white, as for every reader
        corner = slide.read_region(2200, 2950, 0, 40, 40)
        assert (corner[20:, :] == 255).all() and (corner[:, 20:] == 255).all()


def test_tile_gives_the_svs_coords_and_pixels(cmu_zarr, tmp_path):
    outs = {}
    for name, slide_path in (("svs", CMU), ("zarr", cmu_zarr)):
        outs[name] = tmp_path / f"{name}.h5"
        assert main(["tile", str(slide_path), "--out", str(outs[name]), "--tile-size", "224"]) == 0
    coords_svs, _, attrs_svs = read_coords(outs["svs"])
    coords_zarr, _, attrs_zarr = read_coords(outs["zarr"])
    assert len(coords_svs) > 20 and np.array_equal(coords_svs, coords_zarr)
    assert attrs_zarr["reader"] == "ome-zarr" and attrs_zarr["read_level"] == attrs_svs["read_level"] == 0
    side = int(attrs_svs["patch_size_level0"])
    picked = coords_svs[:: max(1, len(coords_svs) // 8)]
    with open_slide(CMU) as svs, open_slide(cmu_zarr) as omezarr:
        for x, y in picked:
            assert np.array_equal(svs.read_tile(int(x), int(y), side, 0, 224), omezarr.read_tile(int(x), int(y), side, 0, 224))
        if hasattr(omezarr, "read_tiles"):  # the batch reader reads the same pixels
            batch = omezarr.read_tiles(picked, side, 0, 224)
            assert all(np.array_equal(a, svs.read_tile(int(x), int(y), side, 0, 224)) for a, (x, y) in zip(batch, picked))


def test_ngff_05_in_zarr_v3(tmp_path):
    image = np.random.default_rng(2).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    path = write_ome_zarr(tmp_path / "v3.ome.zarr", [image, image[::2, ::2]], 0.25, version="0.5", chunk=128)
    assert (path / "zarr.json").is_file()
    with open_slide(path) as slide:
        assert slide.properties["ome-zarr.version"] == "0.5" and slide.mpp == pytest.approx(0.25)
        assert slide.level_dimensions == [(400, 300), (200, 150)] and slide.level_downsamples == [1.0, 2.0]
        assert np.array_equal(slide.read_region(40, 20, 0, 200, 150), image[20:170, 40:240])
        assert np.array_equal(slide.read_region(40, 20, 1, 50, 60), image[::2, ::2][10:70, 20:70])


def test_fingerprint_follows_the_folder(cmu_zarr, tmp_path):
    copy = tmp_path / "copy.ome.zarr"
    shutil.copytree(cmu_zarr, copy)
    with open_slide(cmu_zarr) as a, open_slide(copy) as b:
        assert slide_fingerprint(a)["slide_head_tail_sha256"] == slide_fingerprint(b)["slide_head_tail_sha256"]
    other = write_ome_zarr(tmp_path / "other.ome.zarr", [np.zeros((300, 300, 3), np.uint8)], 0.499)
    with open_slide(other) as c, open_slide(cmu_zarr) as a:
        assert slide_fingerprint(c)["slide_head_tail_sha256"] != slide_fingerprint(a)["slide_head_tail_sha256"]


def _one_line_error(path: Path, **kwargs) -> str:
    with pytest.raises(SlideError) as info:
        open_slide(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_bad_input_is_one_line(tmp_path):
    image = np.full((256, 256, 3), 200, np.uint8)
    plain = tmp_path / "plain.zarr"
    group = zarr.open_group(str(plain), mode="w", zarr_format=2)
    group.create_array("0", shape=(3, 256, 256), dtype="uint8")[...] = 200
    assert "multiscales" in _one_line_error(plain) and "--slide-mpp" in _one_line_error(plain)

    no_size = write_ome_zarr(tmp_path / "nosize.ome.zarr", [image], None)
    assert "--slide-mpp" in _one_line_error(no_size)
    with open_slide(no_size, mpp_fallback=0.5) as slide:
        assert slide.mpp == 0.5 and slide.mpp_source == "fallback"

    grey = tmp_path / "grey.ome.zarr"
    write_ome_zarr(grey, [image], 0.5)
    root = zarr.open_group(str(grey), mode="r+")
    meta = root.attrs["multiscales"]
    root.create_array("1", shape=(1, 256, 256), dtype="uint8")
    meta[0]["datasets"][0]["path"] = "1"
    root.attrs["multiscales"] = meta
    assert "not 8-bit RGB" in _one_line_error(grey)


def test_extract_gives_the_svs_features(cmu_zarr, tmp_path):
    from pathtwt.io.h5 import read_features

    features = {}
    for name, slide_path in (("svs", CMU), ("zarr", cmu_zarr)):
        coords = tmp_path / f"{name}.h5"
        assert main(["tile", str(slide_path), "--out", str(coords), "--tile-size", "224"]) == 0
        out = tmp_path / f"{name}-features.h5"
        assert main(["extract", str(slide_path), "--coords", str(coords), "--out", str(out), "--backbone",
                     "vit-s14-tiny", "--random-init", "--device", "cpu", "--workers", "0", "--no-progress"]) == 0
        features[name] = read_features(out)
    (f_svs, c_svs, _), (f_zarr, c_zarr, attrs) = features["svs"], features["zarr"]
    assert np.array_equal(c_svs, c_zarr) and f_svs.shape == f_zarr.shape and len(f_svs) > 5
    # the same pixels through the same model: the same features
    assert np.allclose(f_svs, f_zarr, atol=1e-5) and attrs["slide_path"] == str(cmu_zarr)


def test_predict_takes_the_store_as_one_slide(cmu_zarr):
    from pathtwt.cli.predict import slide_list

    assert list(slide_list([str(cmu_zarr)]).values()) == [cmu_zarr]
    assert cmu_zarr in slide_list([str(cmu_zarr.parent)]).values()  # a folder holding the store
