"""Plain images (JPEG, PNG, single-level TIFF) read as slides, on the real BACH images:
tiling, calibration, streamed training tiles and extraction read them through
open_slide; a missing pixel size and a truncated or corrupt file are refused by name
and leave nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from conftest import SHARED, _need
from pathtwt.cli import main
from pathtwt.errors import SlideError
from pathtwt.wsi.slides import open_slide

BACH = SHARED / "data" / "bach"
BACH_MPP = 0.42


@pytest.fixture(scope="module")
def bach_image() -> Path:
    return _need(BACH / "images" / "b005.jpeg")


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def test_bach_jpeg_opens_as_a_one_level_slide(bach_image):
    with open_slide(bach_image, mpp_fallback=BACH_MPP) as slide:
        assert slide.reader == "image"
        assert slide.dimensions == (1536, 1536) and slide.level_count == 1
        assert slide.mpp == pytest.approx(BACH_MPP) and slide.mpp_source == "fallback"
        region = slide.read_region(100, 200, 0, 64, 48)
        # beyond the right edge: white, as for every reader
        edge = slide.read_region(1530, 0, 0, 10, 4)
    assert np.array_equal(region, _pixels(bach_image)[200:248, 100:164])
    assert (edge[:, 6:] == 255).all() and np.array_equal(edge[:, :6], _pixels(bach_image)[0:4, 1530:1536])


@pytest.mark.parametrize("fmt", ["png", "tif"])
def test_png_and_single_level_tiff_read_the_same_pixels(bach_image, tmp_path, fmt):
    import tifffile

    rgb = _pixels(bach_image)
    path = tmp_path / f"copy.{fmt}"
    if fmt == "png":
        Image.fromarray(rgb).save(path)
    else:
        tifffile.imwrite(path, rgb)  # stripped, one page, no resolution: not a pyramid
    with open_slide(path, mpp_fallback=BACH_MPP) as slide:
        assert slide.level_count == 1 and slide.dimensions == (1536, 1536)
        assert slide.reader == ("image" if fmt == "png" else "tiffslide")
        tile = slide.read_tile(300, 400, 267, 0, 224)
    with open_slide(bach_image, mpp_fallback=BACH_MPP) as jpeg:
        assert np.array_equal(tile, jpeg.read_tile(300, 400, 267, 0, 224))


def test_an_image_without_a_pixel_size_is_refused_naming_the_key(bach_image, tmp_path):
    with pytest.raises(SlideError) as err:
        open_slide(bach_image)
    message = str(err.value)
    assert str(bach_image) in message and "mpp_fallback" in message and "--slide-mpp" in message
    assert "\n" not in message
    out = tmp_path / "b005.h5"
    assert main(["tile", str(bach_image), "--out", str(out), "--thumbnail", str(tmp_path / "b005.png")]) != 0
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_a_stated_pixel_size_is_used(bach_image, tmp_path):
    path = tmp_path / "stated.png"
    Image.fromarray(_pixels(bach_image)).save(path, dpi=(25400 / 0.25, 25400 / 0.25))
    with open_slide(path) as slide:
        assert slide.mpp == pytest.approx(0.25, rel=1e-3) and slide.mpp_source == "image.dpi"


@pytest.mark.parametrize("damage", ["truncated", "not-a-jpeg", "garbled"])
def test_a_truncated_or_corrupt_jpeg_is_refused_by_name(bach_image, tmp_path, damage):
    data = bach_image.read_bytes()
    path = tmp_path / f"{damage}.jpeg"
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 3])
    elif damage == "not-a-jpeg":
        path.write_bytes(b"\xff\xd8\xff" + b"\x00" * 5000 + b"\xff\xd9")
    else:  # the scan header is kept, the entropy-coded data replaced by noise
        noise = np.random.default_rng(0).integers(0, 256, len(data) - 2000, dtype=np.uint8).tobytes()
        path.write_bytes(data[:1000] + noise + data[-1000:])
    out = tmp_path / "out"
    out.mkdir()
    try:
        with open_slide(path, mpp_fallback=BACH_MPP):
            opened = True
    except SlideError as exc:
        opened = False
        assert str(path) in str(exc) and "\n" not in str(exc)
    if damage == "garbled" and opened:
        pytest.skip("this libjpeg decodes the noise without an error (libjpeg only warns on corrupt entropy data)")
    assert not opened
    assert main(["tile", str(path), "--out", str(out / "t.h5"), "--slide-mpp", "0.42", "--thumbnail",
                 str(out / "t.png")]) != 0
    assert list(out.iterdir()) == []


def test_tile_calibrate_stream_and_extract_read_the_jpeg(bach_image, tmp_path):
    from pathtwt.compress.training_tiles import SlideTiles
    from pathtwt.features.throughput import extraction_throughput
    from pathtwt.io.h5 import read_coords, read_features

    coords = tmp_path / "tiles" / "b005.h5"
    coords.parent.mkdir()
    assert main(["tile", str(bach_image), "--out", str(coords), "--mpp", "0.5", "--tile-size", "224",
                 "--slide-mpp", str(BACH_MPP), "--min-tissue", "0.3"]) == 0
    xy, _tissue, attrs = read_coords(coords)
    assert attrs["reader"] == "image" and attrs["level0_mpp"] == pytest.approx(BACH_MPP)
    assert attrs["patch_size_level0"] == round(224 * 0.5 / BACH_MPP)
    assert 15 <= len(xy) <= 36  # a 1536 px image at 0.42 um/px holds 5 x 5 tiles of 267 level-0 px

    # streamed training tiles (compression) read the same pixels as the image itself
    stream = SlideTiles([coords])
    x, y = (int(v) for v in xy[0])
    side = int(attrs["patch_size_level0"])
    import cv2

    expected = cv2.resize(_pixels(bach_image)[y : y + side, x : x + side], (224, 224), interpolation=cv2.INTER_AREA)
    assert np.array_equal(stream.read(0), expected)

    # calibration draws from the image's coords
    calib = tmp_path / "calib.h5"
    assert main(["calibrate", "--coords", str(coords), "--out", str(calib), "--n-tiles", "8", "--holdout", "0.25"]) == 0
    with h5py.File(calib, "r") as f:
        assert f["tiles"].shape[0] == 8

    # extraction with a small random network, timed per file
    features = tmp_path / "features" / "b005.h5"
    assert main(["extract", str(bach_image), "--coords", str(coords), "--out", str(features),
                 "--backbone", "vit-s14-tiny", "--random-init", "--device", "cpu", "--workers", "0",
                 "--no-progress"]) == 0
    feats, fcoords, fattrs = read_features(features)
    assert feats.shape[0] == len(xy) and np.isfinite(feats).all() and np.array_equal(fcoords, xy)
    assert fattrs["extract_seconds"] > 0 and 0 < fattrs["embed_seconds"] <= fattrs["extract_seconds"]
    speed = extraction_throughput([features.parent])
    assert speed["tiles"] == len(xy) and speed["slides"] == 1
    assert speed["tiles_per_s"] == pytest.approx(len(xy) / fattrs["extract_seconds"])
    json.dumps(speed)  # the report can write it as it is
