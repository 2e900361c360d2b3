"""Odd slides: one tile, a level 0 over 100,000 pixels a side (tiled in bounded memory),
and a valid JPEG pyramid with one corrupt tile in the middle of the tissue. (Slides with
no tissue and single-level slides are covered in test_tissue_tiling.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tifffile
from wsi_writers import corrupt_tile, he_image, pyramid, write_generic_tiff, write_sparse_giant

from pathtwt.cli import main
from pathtwt.errors import SlideError
from pathtwt.io.h5 import read_coords
from pathtwt.wsi.slides import open_slide

PINK = (200, 110, 170)


def test_single_tile_slide(tmp_path):
    # 300 x 300 px at 0.5 um/px, tissue throughout: exactly one whole 256-px tile fits
    rng = np.random.default_rng(0)
    image = (np.array(PINK, np.int16) + rng.integers(-20, 20, (300, 300, 1))).astype(np.uint8)
    path = write_generic_tiff(tmp_path / "one.tiff", [image], 0.5, compression=None)
    out = tmp_path / "one.h5"
    assert main(["tile", str(path), "--out", str(out)]) == 0
    coords, fraction, attrs = read_coords(out)
    assert coords.tolist() == [[0, 0]] and fraction[0] == pytest.approx(1.0) and attrs["status"] == "ok"
    with open_slide(path) as slide:
        np.testing.assert_array_equal(slide.read_tile(0, 0, 256, 0, 256), image[:256, :256])


GIANT_SIDE = 102_400  # level 0: 102,400 x 102,400 px = 10.5 Gpx (31 GB as RGB)
TISSUE_TILES = [(40, 50), (41, 50), (60, 70)]  # (col, row) of 1024-px level-0 tiles


@pytest.fixture(scope="module")
def giant(tmp_path_factory):
    tissue = {key: np.full((1024, 1024, 3), PINK, np.uint8) for key in TISSUE_TILES}
    return write_sparse_giant(tmp_path_factory.mktemp("giant") / "giant.tiff", side=GIANT_SIDE, mpp=0.5, tissue=tissue)


def test_giant_slide_tiles_in_bounded_memory(giant, tmp_path):
    """`pathtwt tile` on the 102,400-px slide, in its own process so its peak RSS is its
    own: the tiles are exactly the tissue squares, and the peak stays under 1 GB."""
    out = tmp_path / "giant.h5"
    # VmHWM, not ru_maxrss: Linux carries the forking parent's (this test process's)
    # high-water mark into ru_maxrss across exec, VmHWM belongs to the new process alone
    code = (
        "import json, re\n"
        "from pathtwt.cli import main\n"
        f"rc = main(['tile', {str(giant)!r}, '--out', {str(out)!r}, '--tile-size', '256'])\n"
        "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read())\n"
        "print(json.dumps({'rc': rc, 'peak_mb': int(hwm.group(1)) / 1024}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["rc"] == 0
    assert report["peak_mb"] < 1024, report  # measured ~650 MB (torch is not imported by `pathtwt tile`)
    coords, _, attrs = read_coords(out)
    assert attrs["level0_width"] == GIANT_SIDE and attrs["read_level"] == 0
    expected = {(c * 1024 + dx, r * 1024 + dy) for c, r in TISSUE_TILES for dx in range(0, 1024, 256)
                for dy in range(0, 1024, 256)}
    assert {tuple(xy) for xy in coords.tolist()} == expected  # 48 tiles out of 160,000
    with open_slide(giant) as slide:
        x, y = coords[len(coords) // 2]
        tile = slide.read_tile(int(x), int(y), 256, 0, 256)
        assert np.abs(tile.astype(int) - PINK).mean() < 3


@pytest.fixture(scope="module")
def corrupt(tmp_path_factory):
    """A 2048 x 2048 JPEG pyramid full of tissue whose level-0 tile (col 2, row 5) (of 8 x
    8 tiles of 256 px) is noise: near the middle of the tissue, away from the regions
    `open_slide` probes."""
    folder = tmp_path_factory.mktemp("corrupt")
    image = he_image(2048, 2048, seed=5)
    image[256:1792, 256:1792] = np.clip(image[256:1792, 256:1792].astype(int) * 0 + PINK, 0, 255)
    path = write_generic_tiff(folder / "corrupt slide.tiff", pyramid(image), 0.5)
    corrupt_tile(path, page=0, index=5 * 8 + 2)
    with tifffile.TiffFile(path) as tif:
        assert tif.pages[0].tilewidth == 256 and tif.pages[0].imagewidth == 2048
    return path


def test_corrupt_tile_slide_tiles_but_the_tile_fails_by_name(corrupt, tmp_path):
    out = tmp_path / "corrupt.h5"
    # tiling reads only the (intact) mask level: it succeeds and keeps the damaged tile's area
    assert main(["tile", str(corrupt), "--out", str(out), "--tile-size", "256"]) == 0
    coords, _, _ = read_coords(out)
    assert [512, 1280] in coords.tolist() and len(coords) >= 30
    with open_slide(corrupt) as slide:
        slide.read_tile(768, 1280, 256, 0, 256)  # the neighbour decodes
        with pytest.raises(SlideError) as info:
            slide.read_tile(512, 1280, 256, 0, 256)
    message = str(info.value)
    assert "corrupt slide.tiff" in message and "x=512 y=1280" in message and "\n" not in message


def test_corrupt_tile_stops_extraction_naming_slide_and_tile(corrupt, tmp_path):
    from pathtwt.models.registry import create_backbone
    from pathtwt.features.extract import extract_slide

    coords = tmp_path / "coords.h5"
    assert main(["tile", str(corrupt), "--out", str(coords), "--tile-size", "56", "--mpp", "1.0"]) == 0
    xy, _, attrs = read_coords(coords)
    assert attrs["patch_size_level0"] == 112 and attrs["read_level"] == 0 and [560, 1344] in xy.tolist()  # a tile inside the damaged 256-px square
    backbone = create_backbone("vit-s14-tiny", pretrained=False)
    out = tmp_path / "features" / "corrupt.h5"
    with pytest.raises(SlideError) as info:
        extract_slide(corrupt, coords, out, backbone, batch_size=64, workers=0, progress=False)
    message = str(info.value)
    assert "corrupt slide.tiff" in message and "cannot read tile" in message and "\n" not in message
    assert not out.exists() and [p.name for p in out.parent.iterdir()] == []  # no partial file, no temp file
