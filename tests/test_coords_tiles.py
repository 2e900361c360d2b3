"""One reader of the tiles a coords file names (pathtwt.wsi.coords_tiles): a fluorescence
cohort tiled with ``--channels`` is calibrated, streamed for training and extracted with
the same pixels, its channel map and reader honoured by all three."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import tifffile
import torch

from pathtwt.cli import main
from pathtwt.compress.training_tiles import SlideTiles
from pathtwt.errors import PathtwtError, SlideError
from pathtwt.features.reading import Band, BatchReader, SlideRead
from pathtwt.features.ring import Ring, RingSize
from pathtwt.io.h5 import read_coords, write_coords
from pathtwt.wsi.coords_tiles import CoordsTileReader, TileGeometry, resolve_slide_path

CHANNELS = [4, 2, 0]


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """A five-channel 8-bit TIFF (not RGB: unreadable without a channel map), tiled at its
    own resolution with ``--channels 4,2,0``."""
    folder = tmp_path_factory.mktemp("fluo")
    five = np.random.default_rng(5).integers(0, 256, (384, 448, 5), dtype=np.uint8)
    slide = folder / "five.tiff"
    tifffile.imwrite(slide, five, tile=(256, 256), photometric="minisblack", planarconfig="contig",
                     resolution=(2e4, 2e4), resolutionunit="CENTIMETER")
    coords = folder / "coords" / "five.h5"
    coords.parent.mkdir()
    assert main(["tile", str(slide), "--out", str(coords), "--channels", ",".join(map(str, CHANNELS)), "--tile-size", "64",
                 "--mpp", "0.5", "--tissue", "otsu"]) == 0
    return slide, coords, five


def _truth(five, x, y, side=64):
    return five[y : y + side, x : x + side][..., CHANNELS]


def test_calibration_streaming_and_extraction_read_the_same_pixels(cohort, tmp_path):
    slide, coords, five = cohort
    xy, _, attrs = read_coords(coords)
    assert attrs["channel_map"] == CHANNELS and int(attrs["patch_size_level0"]) == 64 and len(xy) >= 4
    # calibration, through the CLI: every tile, none held out
    out = tmp_path / "calib.h5"
    assert main(["calibrate", "--coords", str(coords.parent), "--out", str(out), "--n-tiles", str(len(xy)),
                 "--holdout", "0", "--patch-size", "64"]) == 0
    with h5py.File(out, "r") as h5:
        calibrated, origins = h5["tiles"][()], h5["origins"][()]
    # streamed training and extraction
    streamed = SlideTiles([coords])
    # extraction's reading path: a reading process's batch, finished tiles in a ring slot
    ring = Ring(RingSize.for_job(0, len(xy), 64 * 64 * 3))
    reader = BatchReader(ring, 64, lambda tile: tile, ship_bytes=False)
    read = SlideRead(0, TileGeometry.from_attrs(coords, attrs, slide_path=slide), xy)
    (msg,) = reader.band(read, Band(0, 0, ((0, len(xy)),)), iter([1]))
    assert msg.kind == "tiles" and msg.error == "" and (msg.start, msg.end) == (0, len(xy))
    extracted = ring.tiles(1, len(xy), 64)
    by_origin = {tuple(map(int, o)): t for o, t in zip(origins, calibrated)}
    assert len(by_origin) == len(xy) == len(streamed) == len(extracted)
    for i, (x, y) in enumerate(xy):
        truth = _truth(five, int(x), int(y))
        np.testing.assert_array_equal(extracted[i], truth)
        np.testing.assert_array_equal(streamed.read(i), truth)
        np.testing.assert_array_equal(by_origin[(int(x), int(y))], truth)


def test_the_channel_map_is_what_makes_the_slide_readable(cohort):
    # the check can fail: without the coords file's open options the slide is refused
    slide, coords, _ = cohort
    _, _, attrs = read_coords(coords)
    plain = TileGeometry.from_attrs(coords, {**attrs, "channel_map": None})
    with pytest.raises(SlideError, match="not 8-bit RGB"):
        plain.open()


def test_resampling_to_another_input_size(cohort):
    slide, coords, five = cohort
    xy, _, attrs = read_coords(coords)
    import cv2

    with CoordsTileReader(TileGeometry.from_attrs(coords, attrs), xy, size=32) as reader:
        tile = reader.read(0)
    x, y = map(int, xy[0])
    np.testing.assert_array_equal(tile, cv2.resize(_truth(five, x, y), (32, 32), interpolation=cv2.INTER_AREA))


def test_bad_coords_files_say_what_to_do(cohort, tmp_path):
    slide, coords, _ = cohort
    xy, tissue, attrs = read_coords(coords)
    with pytest.raises(PathtwtError, match=r"lacks attrs \['read_level'\]; re-run `pathtwt tile`"):
        TileGeometry.from_attrs(coords, {k: v for k, v in attrs.items() if k != "read_level"})
    moved = tmp_path / "moved.h5"
    write_coords(moved, xy, tissue, {**attrs, "slide_path": "nowhere/five.tiff"})
    with pytest.raises(SlideError, match="moved.h5: slide_path 'nowhere/five.tiff' not found"):
        SlideTiles([moved])
    # a path relative to the coords file's folder is found
    write_coords(slide.parent / "rel.h5", xy, tissue, {**attrs, "slide_path": slide.name})
    assert resolve_slide_path(slide.parent / "rel.h5", {"slide_path": slide.name}) == slide.parent / slide.name
