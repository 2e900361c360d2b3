"""Vendor layouts through ``open_slide`` with both readers: generic tiled TIFF, Aperio
SVS (JPEG and JPEG 2000), an NDPI-like pyramid, OME-TIFF (generated here with tifffile, see wsi_writers.py),
DICOM (the real files in ../shared), awkward file names, and non-RGB slides.

The NDPI-like file is the closest real thing tifffile can write: each level one JPEG
strip tagged with the Hamamatsu NDPI format flag and source lens, in a classic TIFF.
OpenSlide opens it with its Hamamatsu driver and, as with real NDPI files, offers extra
levels it decodes by JPEG scaling (8 levels); tiffslide sees the 3 stored levels. In the
OME-TIFF the reduced levels live in SubIFDs, which OpenSlide ignores (1 level) and
tiffslide reads (3 levels). Those are the pyramid disagreements the tile comparison
covers."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tifffile
from wsi_writers import he_image, pyramid, write_generic_tiff, write_ndpi_like, write_ome_tiff, write_svs

from pathtwt.cli import main
from pathtwt.errors import SlideError
from pathtwt.io.h5 import read_coords
from pathtwt.wsi.slides import mpp_from_properties, open_options_from_attrs, open_slide
from pathtwt.wsi.tiling import tile_slide

MPP = 0.5
WRITERS = {
    "generic.tiff": write_generic_tiff,
    "aperio.svs": write_svs,
    "aperio-j2k.svs": lambda path, levels, mpp: write_svs(path, levels, mpp, jpeg2000=True),
    "ndpi-like.tiff": write_ndpi_like,
    "pyramid.ome.tiff": write_ome_tiff,
}
# (reader, name) -> (levels seen, OpenSlide vendor)
EXPECTED_LEVELS = {
    ("openslide", "generic.tiff"): 3,
    ("openslide", "aperio.svs"): 3,
    ("openslide", "aperio-j2k.svs"): 3,
    ("openslide", "ndpi-like.tiff"): 8,
    ("openslide", "pyramid.ome.tiff"): 1,
    ("tiffslide", "generic.tiff"): 3,
    ("tiffslide", "aperio.svs"): 3,
    ("tiffslide", "aperio-j2k.svs"): 3,
    ("tiffslide", "ndpi-like.tiff"): 3,
    ("tiffslide", "pyramid.ome.tiff"): 3,
}
VENDORS = {"generic.tiff": "generic-tiff", "aperio.svs": "aperio", "aperio-j2k.svs": "aperio", "ndpi-like.tiff": "hamamatsu",
           "pyramid.ome.tiff": "generic-tiff"}


@pytest.fixture(scope="module")
def slides(tmp_path_factory):
    folder = tmp_path_factory.mktemp("formats")
    levels = pyramid(he_image(2048, 1536, seed=1))
    paths = {name: writer(folder / name, levels, MPP) for name, writer in WRITERS.items()}
    # lossless OME: the stored reduced level is exactly the area average of level 0
    paths["lossless.ome.tiff"] = folder / "lossless.ome.tiff"
    with tifffile.TiffWriter(paths["lossless.ome.tiff"], ome=True) as tif:
        tif.write(levels[0], subifds=2, tile=(256, 256), compression="zlib", photometric="rgb",
                  metadata={"axes": "YXS", "PhysicalSizeX": MPP, "PhysicalSizeY": MPP})
        for level in levels[1:]:
            tif.write(level, subfiletype=1, tile=(256, 256), compression="zlib", photometric="rgb")
    return paths


@pytest.mark.parametrize("name", list(WRITERS))
@pytest.mark.parametrize("reader", ["openslide", "tiffslide"])
def test_formats_open_with_each_reader(slides, name, reader):
    with open_slide(slides[name], reader=reader) as slide:
        assert slide.reader == reader
        assert slide.dimensions == (2048, 1536) and slide.mpp == pytest.approx(MPP)
        assert slide.level_count == EXPECTED_LEVELS[(reader, name)]
        if reader == "openslide":
            assert slide.properties["openslide.vendor"] == VENDORS[name]
        region = slide.read_region(900, 700, 0, 64, 64)
        assert region.shape == (64, 64, 3) and region.std() > 3  # tissue texture decoded
    with open_slide(slides[name]) as slide:
        assert slide.reader == "openslide"  # every one of these layouts is OpenSlide's first


@pytest.mark.parametrize("name", ["ndpi-like.tiff", "pyramid.ome.tiff", "lossless.ome.tiff", "aperio.svs", "aperio-j2k.svs"])
@pytest.mark.parametrize("target_mpp", [1.0, 2.0])
def test_same_tiles_whichever_reader(slides, name, target_mpp):
    """The same coords read through both readers, each at the level its own pyramid
    gives for the target mpp. Where the levels are the same stored pixels the tiles are
    identical; where the readers chose different levels (NDPI: a JPEG-scaled level
    against level 0; OME: level 0 against a stored reduced level) the tiles agree
    exactly for lossless data and within JPEG noise otherwise."""
    tilings, slides_open = {}, {}
    for reader in ("openslide", "tiffslide"):
        slides_open[reader] = open_slide(slides[name], reader=reader)
        tilings[reader] = tile_slide(slides_open[reader], target_mpp=target_mpp, tile_size=128)
    try:
        a, b = ({tuple(c) for c in tilings[r].coords} for r in ("openslide", "tiffslide"))
        assert a and len(a ^ b) <= max(1, 0.05 * len(a))  # masks from different levels: the same tiles, bar an edge one
        coords = tilings["openslide"].coords[:8]
        diffs = []
        for x, y in coords:
            tiles = [slides_open[r].read_tile(int(x), int(y), tilings[r].attrs["patch_size_level0"],
                                              tilings[r].attrs["read_level"], 128).astype(int)
                     for r in ("openslide", "tiffslide")]
            diffs.append(np.abs(tiles[0] - tiles[1]))
        levels = {r: tilings[r].attrs["read_level"] for r in tilings}
        same_level = slides_open["openslide"].level_dimensions[levels["openslide"]] == \
            slides_open["tiffslide"].level_dimensions[levels["tiffslide"]]
        worst_mean = max(d.mean() for d in diffs)
        if same_level or name.startswith("lossless"):
            assert worst_mean == 0, (levels, worst_mean)
        else:
            assert worst_mean < 4.0 and max(np.percentile(d, 99) for d in diffs) < 16, (levels, worst_mean)
    finally:
        for slide in slides_open.values():
            slide.close()


def test_readers_disagree_on_levels_as_documented(slides):
    # the premise of the comparison above: these files really do give different pyramids
    with open_slide(slides["ndpi-like.tiff"], reader="openslide") as os_slide, \
            open_slide(slides["ndpi-like.tiff"], reader="tiffslide") as ts_slide:
        assert os_slide.level_for_mpp(1.0) == 1 and os_slide.level_dimensions[1] == (1024, 768)
        assert ts_slide.level_for_mpp(1.0) == 0


def test_awkward_file_names(slides, tmp_path):
    odd = tmp_path / "cohort [A] (2)" / "slide 01 [HE] – Müller_東京 #1.tiff"
    odd.parent.mkdir()
    shutil.copyfile(slides["generic.tiff"], odd)
    for reader in ("openslide", "tiffslide"):
        with open_slide(odd, reader=reader) as slide:
            assert slide.read_region(0, 0, 1, 16, 16).shape == (16, 16, 3)
    out = tmp_path / "tiles [A]" / "slide 01 [HE] – Müller_東京 #1.h5"
    assert main(["tile", str(odd), "--out", str(out), "--tile-size", "128"]) == 0
    coords, _, attrs = read_coords(out)
    assert len(coords) > 10 and attrs["slide_path"] == str(odd) and attrs["reader"] == "openslide"
    with pytest.raises(SlideError) as info:
        open_slide(odd.with_name("absent – ü [x].tiff"))
    assert "absent – ü [x].tiff" in str(info.value)


def test_dicom_through_forced_readers(shared_slides):
    with open_slide(shared_slides / "boxes_0.dcm", reader="openslide") as slide:
        assert slide.level_dimensions == [(16, 16)] and slide.mpp == pytest.approx(0.499)
    with pytest.raises(SlideError) as info:
        open_slide(shared_slides / "boxes_0.dcm", reader="tiffslide")
    assert "boxes_0.dcm: not a readable whole-slide image" in str(info.value) and "\n" not in str(info.value)


def test_forced_reader_errors(slides, shared_slides):
    with pytest.raises(SlideError, match="unopenable.tiff: OpenSlide cannot open it.*use reader tiffslide"):
        open_slide(shared_slides / "unopenable.tiff", reader="openslide")
    with pytest.raises(SlideError, match="reader 'bioformats' is unknown"):
        open_slide(slides["generic.tiff"], reader="bioformats")


@pytest.fixture(scope="module")
def fluorescence(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fluo")
    rng = np.random.default_rng(3)
    five = rng.integers(0, 256, (512, 640, 5), dtype=np.uint8)
    res = {"resolution": (2e4, 2e4), "resolutionunit": "CENTIMETER"}
    paths = {"five": folder / "five.tiff", "one": folder / "one.tiff", "planar": folder / "planar.tiff",
             "wide": folder / "wide16.tiff"}
    tifffile.imwrite(paths["five"], five, tile=(256, 256), photometric="minisblack", planarconfig="contig", **res)
    tifffile.imwrite(paths["one"], five[..., 2], tile=(256, 256), **res)
    tifffile.imwrite(paths["planar"], np.moveaxis(five, -1, 0), tile=(256, 256), photometric="minisblack",
                     planarconfig="separate", **res)
    wide = five[..., :4].astype(np.uint16) * 257
    tifffile.imwrite(paths["wide"], wide, tile=(256, 256), photometric="minisblack", planarconfig="contig", **res)
    return paths, five


def test_non_rgb_is_refused_without_a_channel_map(fluorescence):
    paths, _ = fluorescence
    for key in ("five", "one", "wide"):
        with pytest.raises(SlideError) as info:
            open_slide(paths[key])
        message = str(info.value)
        assert paths[key].name in message and "not 8-bit RGB" in message and "`channels`" in message
        assert "\n" not in message


def test_channel_map_selects_three_channels(fluorescence, tmp_path):
    paths, five = fluorescence
    with open_slide(paths["five"], channel_map=[3, 1, 0]) as slide:
        assert slide.reader == "tiffslide" and slide.channel_map == (3, 1, 0)
        np.testing.assert_array_equal(slide.read_region(100, 50, 0, 40, 30), five[50:80, 100:140][..., [3, 1, 0]])
        # out-of-slide pixels are the fluorescence background, black (white glass for brightfield)
        edge = slide.read_region(620, 0, 0, 40, 8)
        assert (edge[:, 20:] == 0).all() and (edge[:, :20] == five[:8, 620:][..., [3, 1, 0]]).all()
    with open_slide(paths["one"], channel_map="0,0,0") as slide:
        grey = slide.read_region(0, 0, 0, 16, 16)
        assert (grey == five[:16, :16, 2:3]).all()
    with open_slide(paths["wide"], channel_map=[0, 1, 3]) as slide:  # 16-bit: scaled to 8 bits
        np.testing.assert_array_equal(slide.read_region(0, 0, 0, 16, 16), five[:16, :16][..., [0, 1, 3]])
    with pytest.raises(SlideError, match=r"five.tiff: channel map \[0, 1, 7\] does not fit its 5 channel"):
        open_slide(paths["five"], channel_map=[0, 1, 7])
    with pytest.raises(SlideError, match="must be three channel indices"):
        open_slide(paths["five"], channel_map=[0, 1])
    with pytest.raises(SlideError, match="planar.tiff"):
        open_slide(paths["planar"], channel_map=[0, 1, 2])  # channels in separate planes: a clear refusal


def test_tile_cli_records_channels_and_reader_for_reopening(fluorescence, tmp_path):
    paths, five = fluorescence
    out = tmp_path / "five.h5"
    code = main(["tile", str(paths["five"]), "--out", str(out), "--channels", "4,2,0", "--tile-size", "64",
                 "--tissue", "otsu"])
    assert code == 0
    _, _, attrs = read_coords(out)
    assert attrs["channel_map"] == [4, 2, 0] and attrs["reader"] == "tiffslide"
    options = open_options_from_attrs(attrs)
    assert options == {"mpp_fallback": pytest.approx(0.5), "reader": "tiffslide", "channel_map": [4, 2, 0]}
    with open_slide(paths["five"], **options) as slide:
        np.testing.assert_array_equal(slide.read_region(0, 0, 0, 8, 8), five[:8, :8][..., [4, 2, 0]])


def test_ome_physical_size_gives_the_mpp(slides):
    # the lossless OME-TIFF has no TIFF resolution tags: the OME-XML pixel size is the mpp
    for reader in ("openslide", "tiffslide"):
        with open_slide(slides["lossless.ome.tiff"], reader=reader) as slide:
            assert slide.mpp == pytest.approx(MPP) and slide.mpp_source == "ome.PhysicalSizeX"
    assert mpp_from_properties({"tiff.ImageDescription": '<OME><Image><Pixels PhysicalSizeX="250" '
                                'PhysicalSizeXUnit="nm" SizeX="9"/></Image></OME>'}) == (0.25, "ome.PhysicalSizeX")


def test_channel_map_needs_the_raw_channels(fluorescence):
    paths, _ = fluorescence
    # OpenSlide opens some multi-channel TIFFs but renders them to RGB itself
    with pytest.raises(SlideError, match="five.tiff: OpenSlide turns its 5 channel.*reader tiffslide"):
        open_slide(paths["five"], reader="openslide", channel_map=[0, 1, 2])
