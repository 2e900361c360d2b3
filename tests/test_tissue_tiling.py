"""Tissue detection, tiling and `pathtwt tile`: on synthetic pyramidal TIFFs written here
(known pixels, known tissue mask) and on the real CMU-1-Small-Region.svs."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import tifffile

from pathtwt.wsi import tissue as tissue_module
from pathtwt.cli import main
from pathtwt.io.h5 import read_coords
from pathtwt.wsi.slides import Slide, open_slide
from pathtwt.wsi.tiling import grid_tissue_fraction, tile_slide
from pathtwt.wsi.tissue import detect_tissue, read_low_resolution

MPP = 0.5
SIZE = (4096, 3072)  # level-0 (w, h): 2 x 1.5 mm
DOWNSAMPLES = (1, 4, 16)


def _synthetic_slide(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(RGB level 0, true tissue mask): H&E-like islands on glass, one faint island,
    a large hole (a real lumen) and a speck of debris that is not tissue."""
    w, h = SIZE
    mask = np.zeros((h, w), np.uint8)
    for centre, axes in (((1100, 1200), (800, 650)), ((2900, 1000), (600, 450)), ((2700, 2300), (700, 400))):
        cv2.ellipse(mask, centre, axes, 0, 0, 360, 1, -1)
    faint = np.zeros((h, w), np.uint8)
    cv2.ellipse(faint, (600, 2600), (350, 250), 0, 0, 360, 1, -1)
    mask |= faint
    cv2.circle(mask, (1100, 1200), 260, 0, -1)  # a 130 um lumen stays background
    mask, faint = mask.astype(bool), (faint & mask).astype(bool)
    rgb = np.full((h, w, 3), 243, np.uint8)
    rgb -= rng.integers(0, 8, (h, w, 1), dtype=np.uint8)  # grey glass noise
    eosin = np.array([232, 150, 192], np.uint8) - rng.integers(0, 50, (h, w, 1), dtype=np.uint8)
    eosin[rng.random((h, w), np.float32) < 0.08] = (110, 70, 160)  # nuclei
    rgb[mask] = eosin[mask]
    rgb[faint] = ((rgb[faint].astype(np.uint16) + 243) // 2).astype(np.uint8)  # pale staining: half the colour
    cv2.circle(rgb, (3800, 250), 12, (60, 60, 60), -1)  # debris
    return rgb, mask


def _pyramid(level0: np.ndarray, downsamples=DOWNSAMPLES) -> list[np.ndarray]:
    h, w = level0.shape[:2]
    return [level0 if d == 1 else cv2.resize(level0, (w // d, h // d), interpolation=cv2.INTER_AREA) for d in downsamples]


def _write_tiff(path: Path, levels: list[np.ndarray], mpp: float | None) -> None:
    # uncompressed tiles (fast to write, lossless), so pixels read back must equal the generator's exactly
    with tifffile.TiffWriter(path) as tif:
        for i, level in enumerate(levels):
            ds = levels[0].shape[1] / level.shape[1]
            res = {} if mpp is None else {"resolution": (1e4 / (mpp * ds),) * 2, "resolutionunit": "CENTIMETER"}
            tif.write(level, tile=(256, 256), compression=None, photometric="rgb", subfiletype=int(i > 0), **res)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    rng = np.random.default_rng(7)
    level0, mask = _synthetic_slide(rng)
    levels = _pyramid(level0)
    folder = tmp_path_factory.mktemp("synthetic")
    pyramid = folder / "pyramid.tiff"
    _write_tiff(pyramid, levels, MPP)
    single = folder / "single.tiff"
    _write_tiff(single, levels[:1], MPP)
    blank = folder / "blank.tiff"
    glass = (243 + rng.integers(-4, 5, (1024, 1024, 1))).astype(np.uint8).repeat(3, axis=2)
    _write_tiff(blank, _pyramid(glass, (1, 4)), MPP)
    return {"pyramid": pyramid, "single": single, "blank": blank, "levels": levels, "mask": mask}


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max(1, (a | b).sum()))


def _record_reads(monkeypatch) -> list[tuple[int, int]]:
    """Record (level, height) of every Slide.read_region call from now on."""
    reads: list[tuple[int, int]] = []
    original = Slide.read_region

    def spy(self, x, y, level, w, h):
        reads.append((level, h))
        return original(self, x, y, level, w, h)

    monkeypatch.setattr(Slide, "read_region", spy)
    return reads


def _true_mask_at(mask: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    small = cv2.resize(mask.astype(np.float32), (shape[1], shape[0]), interpolation=cv2.INTER_AREA)
    return small >= 0.5


def test_tissue_mask_matches_truth_without_reading_level0(synthetic, monkeypatch):
    with open_slide(synthetic["pyramid"]) as slide:
        assert slide.level_count == 3 and slide.mpp == pytest.approx(MPP)
        reads = _record_reads(monkeypatch)
        tiling = tile_slide(slide, target_mpp=0.5, tile_size=256)
    assert reads and 0 not in {level for level, _ in reads}
    detected = tiling.tissue
    assert detected.level == 2 and detected.mpp == pytest.approx(8.0)
    iou = _iou(detected.mask, _true_mask_at(synthetic["mask"], detected.mask.shape))
    assert iou >= 0.9, iou
    # the lumen (>= max_hole_um2) stays a hole; the debris speck is not tissue
    assert not detected.mask[1200 // 16, 1100 // 16]
    assert not detected.mask[250 // 16, 3800 // 16]
    # the faint island is found
    assert detected.mask[2600 // 16, 600 // 16]


def test_single_level_slide_is_read_in_strips(synthetic, monkeypatch):
    monkeypatch.setattr(tissue_module, "_STRIP_PIXELS", 4096 * 64)
    with open_slide(synthetic["single"]) as slide:
        reads = _record_reads(monkeypatch)
        detected = detect_tissue(slide)
        strips = read_low_resolution(slide, 0, 16)
    heights = [h for _, h in reads]
    assert max(heights) <= 64 and len(heights) > 10
    assert detected.downsample == (16.0, 16.0)
    expected = cv2.resize(synthetic["levels"][0], (256, 192), interpolation=cv2.INTER_AREA)
    assert np.abs(strips.astype(int) - expected).max() <= 1
    assert _iou(detected.mask, _true_mask_at(synthetic["mask"], detected.mask.shape)) >= 0.9


def test_tiles_land_on_generator_pixels(synthetic):
    level0, level1 = synthetic["levels"][:2]
    true_mask = synthetic["mask"]
    with open_slide(synthetic["pyramid"]) as slide:
        fine = tile_slide(slide, target_mpp=0.5, tile_size=128, min_tissue=0.6)
        assert fine.attrs["read_level"] == 0 and fine.attrs["patch_size_level0"] == 128
        for x, y in fine.coords[:: max(1, len(fine.coords) // 8)]:
            np.testing.assert_array_equal(slide.read_tile(x, y, 128, 0, 128), level0[y : y + 128, x : x + 128])
        coarse = tile_slide(slide, target_mpp=2.0, tile_size=64, min_tissue=0.6)
        assert coarse.attrs["read_level"] == 1 and coarse.attrs["patch_size_level0"] == 256
        assert coarse.attrs["target_magnification"] == 5
        for x, y in coarse.coords[:: max(1, len(coarse.coords) // 8)]:
            tile = slide.read_tile(x, y, 256, 1, 64)
            np.testing.assert_array_equal(tile, level1[y // 4 : y // 4 + 64, x // 4 : x // 4 + 64])
    # kept tiles are tissue by the true mask, and nearly all full-tissue tiles are kept
    true_fraction = np.array([true_mask[y : y + 128, x : x + 128].mean() for x, y in fine.coords])
    assert true_fraction.min() >= 0.4 and np.mean(np.abs(true_fraction - fine.tissue_fraction)) < 0.1
    grid, _ = grid_tissue_fraction(np.ones((1, 1), bool), (1.0, 1.0), 128, SIZE)
    full = {(x, y) for x, y in grid if true_mask[y : y + 128, x : x + 128].mean() >= 0.95}
    kept = {(x, y) for x, y in fine.coords}
    assert len(full & kept) >= 0.95 * len(full)


def test_otsu_filter_keeps_a_superset(synthetic):
    with open_slide(synthetic["pyramid"]) as slide:
        strict = tile_slide(slide, tissue="fraction", min_tissue=0.6)
        touching = tile_slide(slide, tissue="otsu")
    strict_set = {tuple(c) for c in strict.coords}
    touching_set = {tuple(c) for c in touching.coords}
    assert strict_set < touching_set
    assert touching.tissue_fraction.min() > 0 and touching.tissue_fraction.min() < 0.6
    assert strict.tissue_fraction.min() >= 0.6


def test_grid_fraction_is_exact_on_aligned_masks():
    mask = np.zeros((8, 12), bool)
    mask[0:4, 0:4] = True  # tile (0, 0) full
    mask[4:6, 4:8] = True  # tile (32, 32) half
    coords, fraction = grid_tissue_fraction(mask, (8.0, 8.0), 32, (96, 70))
    assert coords.shape == (3 * 2, 2)  # 96 // 32 columns, 70 // 32 rows: whole tiles only
    table = {tuple(c): f for c, f in zip(coords.tolist(), fraction)}
    assert table[(0, 0)] == 1.0 and table[(32, 32)] == 0.5 and table[(64, 0)] == 0.0


def test_cmu_tiles_only_on_tissue(shared_slides):
    with open_slide(shared_slides / "CMU-1-Small-Region.svs") as slide:
        tiling = tile_slide(slide, target_mpp=0.5, tile_size=256, min_tissue=0.6)
        image = slide.read_region(0, 0, 0, *slide.dimensions)
    assert tiling.attrs["status"] == "ok" and len(tiling.coords) >= 15
    # independent full-resolution mask: stained pixels are darker and more coloured than glass
    independent = (image.min(axis=2) < 200) & (image.max(axis=2).astype(int) - image.min(axis=2) > 25)
    side = tiling.attrs["patch_size_level0"]
    kept = np.array([independent[y : y + side, x : x + side].mean() for x, y in tiling.coords])
    assert kept.min() >= 0.45, kept.min()
    grid, _ = grid_tissue_fraction(np.ones((1, 1), bool), (1.0, 1.0), side, slide.dimensions)
    background = [(x, y) for x, y in grid if independent[y : y + side, x : x + side].mean() < 0.05]
    assert background and not {(x, y) for x, y in tiling.coords} & set(background)


def test_cli_writes_coords_and_thumbnail(synthetic, tmp_path):
    out, thumb = tmp_path / "tiles" / "slide.h5", tmp_path / "thumbs" / "slide.png"
    code = main(["tile", str(synthetic["pyramid"]), "--out", str(out), "--tile-size", "224", "--thumbnail", str(thumb)])
    assert code == 0
    coords, fraction, attrs = read_coords(out)
    assert len(coords) > 20 and fraction.min() >= 0.6
    assert attrs["status"] == "ok" and attrs["patch_size"] == 224 and attrs["patch_size_level0"] == 224
    assert attrs["target_mpp"] == 0.5 and attrs["target_magnification"] == 20 and attrs["level0_mpp"] == pytest.approx(MPP)
    assert (attrs["level0_width"], attrs["level0_height"]) == SIZE and attrs["slide_path"] == str(synthetic["pyramid"])
    assert (coords % 224 == 0).all()
    png = cv2.imread(str(thumb))
    assert png is not None and png.shape[:2] == (192 * 4, 256 * 4)  # mask image enlarged by a whole factor
    # the kept tiles are drawn in the tile colour
    assert (np.all(png == (255, 60, 0), axis=2)).sum() > 100
    # the tissue outline is a line several pixels wide (BGR of TISSUE_COLOUR), not a 1-px hairline
    from pathtwt.wsi.thumbnail import outline_width

    assert outline_width(png.shape) >= 3
    assert (np.all(png == (60, 255, 0), axis=2)).sum() > 3 * 2 * (png.shape[0] + png.shape[1]) / 4


def test_otsu_keeps_tiles_above_its_stated_minimum_tissue(synthetic, tmp_path):
    from pathtwt.wsi.tiling import DEFAULT_MIN_TISSUE

    out, loose = tmp_path / "otsu.h5", tmp_path / "touching.h5"
    assert main(["tile", str(synthetic["pyramid"]), "--out", str(out), "--tissue", "otsu", "--tile-size", "224"]) == 0
    coords, fraction, attrs = read_coords(out)
    assert DEFAULT_MIN_TISSUE["otsu"] == 0.25
    assert attrs["tissue_filter"] == "otsu" and attrs["min_tissue"] == 0.25  # the value used, not 0.0
    assert len(coords) and fraction.min() >= 0.25
    # configurable: 0 keeps every tile that touches tissue, recorded as such
    assert main(["tile", str(synthetic["pyramid"]), "--out", str(loose), "--tissue", "otsu", "--tile-size", "224",
                 "--min-tissue", "0"]) == 0
    coords0, fraction0, attrs0 = read_coords(loose)
    assert attrs0["min_tissue"] == 0.0 and fraction0.min() > 0 and len(coords0) > len(coords)
    assert (fraction0 < 0.25).sum() == len(coords0) - len(coords)


def test_cli_blank_slide_gives_no_tissue_file(synthetic, tmp_path):
    out = tmp_path / "blank.h5"
    assert main(["tile", str(synthetic["blank"]), "--out", str(out), "--tissue", "otsu"]) == 0
    coords, fraction, attrs = read_coords(out)
    assert coords.shape == (0, 2) and fraction.shape == (0,) and attrs["status"] == "no_tissue"


@pytest.mark.parametrize(
    ("name", "extra", "expected"),
    [
        ("unreadable.svs", [], "corrupt"),
        ("unopenable.tiff", [], "not a supported slide"),
        ("boxes.tiff", [], "--slide-mpp"),
    ],
)
def test_cli_bad_slides_exit_1_and_leave_nothing(shared_slides, tmp_path, capsys, name, extra, expected):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code = main(["tile", str(shared_slides / name), "--out", str(out_dir / "x.h5"), "--thumbnail", str(out_dir / "x.png"), *extra])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert name in err and expected in err and len(err.splitlines()) == 1
    assert list(out_dir.iterdir()) == []


def test_cli_slide_mpp_rescues_boxes(shared_slides, tmp_path):
    out = tmp_path / "boxes.h5"
    assert main(["tile", str(shared_slides / "boxes.tiff"), "--out", str(out), "--slide-mpp", "0.25",
                 "--tile-size", "32", "--tissue", "otsu"]) == 0
    _, _, attrs = read_coords(out)
    assert attrs["level0_mpp"] == 0.25 and attrs["mpp_source"] == "fallback" and attrs["read_level"] == 1


@pytest.mark.parametrize("key", [0, 3])
def test_demo_generator_slides(tmp_path, key):
    """The demo cohorts' generator: tissue IoU >= 0.9 against its true mask, and tiles
    read back at their coordinates match its rendered pixels (JPEG, so within a few
    levels), far better than the same tile shifted by 4 level-0 pixels."""
    synthetic = pytest.importorskip("pathtwt.demo.synthetic", reason="the demo slide generator is not installed")
    from pathtwt.demo.make import write_slide

    recipe = synthetic.SlideRecipe(key=key, width=2560, height=2048, mpp=0.25, faint_share=0.15)
    truth = synthetic.SyntheticSlide(recipe)
    write_slide(recipe, tmp_path, "slide", mask_downsample=8)
    with open_slide(tmp_path / "slides" / "slide.tiff") as slide:
        tiling = tile_slide(slide, target_mpp=0.5, tile_size=224, min_tissue=0.6)
        detected = tiling.tissue
        assert detected.level > 0
        true_mask = truth.tissue_mask(detected.downsample[0])[: detected.mask.shape[0], : detected.mask.shape[1]]
        assert _iou(detected.mask, true_mask) >= 0.9
        assert len(tiling.coords) >= 3 and tiling.attrs["read_level"] == 1  # 0.25 um/px slide, 0.5 um/px tiles
        for x, y in tiling.coords[:3]:
            tile = slide.read_tile(x, y, 448, 0, 448).astype(int)
            error = np.abs(tile - truth.render(x, y, 448, 448, 1.0)).mean()
            shifted = np.abs(tile - truth.render(x + 4, y, 448, 448, 1.0)).mean()
            assert error < 2.5 and error < shifted / 2, (error, shifted)
            half = slide.read_tile(x, y, 448, 1, 224).astype(int)
            assert np.abs(half - truth.render(x, y, 224, 224, 2.0)).mean() < 2.5


def test_cli_corrupt_tile_found_while_tiling(tmp_path, capsys):
    """A slide that opens (its probe regions decode) but has a corrupt JPEG tile in the
    level the mask is read from: one-line error naming the file, exit 1, no output."""
    image = np.full((2048, 2048, 3), 240, np.uint8)
    image[500:1500, 500:1500] = (200, 100, 160)
    path = tmp_path / "corrupt.tiff"
    with tifffile.TiffWriter(path) as tif:
        for i, level in enumerate(_pyramid(image, (1, 4, 16))):
            ds = 2048 / level.shape[1]
            tif.write(level, tile=(128, 128), compression="jpeg", photometric="rgb", subfiletype=int(i > 0),
                      resolution=(1e4 / (0.5 * ds),) * 2, resolutionunit="CENTIMETER")
    with tifffile.TiffFile(path) as tif:
        offset, count = tif.pages[1].dataoffsets[0], tif.pages[1].databytecounts[0]  # top-left tile of level 1
    data = bytearray(path.read_bytes())
    tail = count - count // 3
    data[offset + count // 3 : offset + count] = (b"\xff\xd9" * tail)[:tail]  # the entropy-coded data destroyed
    path.write_bytes(bytes(data))
    out_dir = tmp_path / "out"
    # --mask-mpp 2 selects level 1 (2 um/px) for the mask
    code = main(["tile", str(path), "--out", str(out_dir / "x.h5"), "--mask-mpp", "2", "--thumbnail", str(out_dir / "x.png")])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert "corrupt.tiff" in err and "level=1" in err and len(err.splitlines()) == 1
    assert not out_dir.exists() or list(out_dir.iterdir()) == []
