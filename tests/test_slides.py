"""pathtwt.wsi.slides on the real test slides in ../shared/data/slides and on small TIFFs
written here (grey, transparent)."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

from pathtwt.errors import SlideError
from pathtwt.wsi.slides import mpp_from_properties, open_slide


def test_cmu_small_region_geometry_and_pixels(shared_slides):
    with open_slide(shared_slides / "CMU-1-Small-Region.svs") as slide:
        assert slide.reader == "openslide"
        assert slide.level_count == 1
        assert slide.dimensions == (2220, 2967)
        assert slide.mpp == pytest.approx(0.499)
        assert slide.mpp_source == "openslide.mpp-x"
        region = slide.read_region(1000, 1000, 0, 64, 48)
        assert region.shape == (48, 64, 3) and region.dtype == np.uint8
        assert region.std() > 5  # real tissue texture, not a blank fill
        # out-of-slide pixels are white, not black or transparent
        corner = slide.read_region(2200, 2950, 0, 40, 40)
        assert (corner[20:, 20:] == 255).all()
        assert slide.level_for_mpp(0.5) == 0  # 0.499 <= 0.5 * 1.01
        assert slide.level_for_mpp(0.25) == 0  # coarser scan: level 0, never a finer level that is not there


def test_read_tile_matches_resized_region(shared_slides):
    import cv2

    with open_slide(shared_slides / "CMU-1-Small-Region.svs") as slide:
        tile = slide.read_tile(800, 900, 512, 0, 256)
        region = slide.read_region(800, 900, 0, 512, 512)
        assert tile.shape == (256, 256, 3)
        np.testing.assert_array_equal(tile, cv2.resize(region, (256, 256), interpolation=cv2.INTER_AREA))
        same = slide.read_tile(800, 900, 256, 0, 256)
        np.testing.assert_array_equal(same, region[:256, :256])


def test_boxes_tiff_levels_and_implausible_resolution(shared_slides):
    path = shared_slides / "boxes.tiff"
    # its TIFF resolution says 28.35 px/cm (72 dpi): 352.8 um/px is a placeholder, not a scan
    with pytest.raises(SlideError, match="boxes.tiff.*mpp_fallback"):
        open_slide(path)
    with open_slide(path, mpp_fallback=0.25) as slide:
        assert slide.level_dimensions == [(300, 250), (150, 125), (75, 62), (37, 31)]
        assert slide.level_downsamples[:2] == [1.0, 2.0]
        assert slide.mpp == 0.25 and slide.mpp_source == "fallback"
        assert slide.level_for_mpp(0.5) == 1
        assert slide.level_for_mpp(2.0) == 2  # level 3 is 8.09x = 2.02 um/px: would need upsampling
        assert slide.level_for_mpp(0.1) == 0
        tile = slide.read_tile(100, 60, 64, 1, 32)
        assert tile.shape == (32, 32, 3)
        np.testing.assert_array_equal(tile, slide.read_region(100, 60, 1, 32, 32))


def test_dicom_pair_opens_from_either_file(shared_slides):
    for name in ("boxes_0.dcm", "boxes_1.dcm"):
        with open_slide(shared_slides / name) as slide:
            assert slide.reader == "openslide"
            assert slide.level_dimensions == [(16, 16)]
            assert slide.mpp == pytest.approx(0.499)
            assert slide.read_region(0, 0, 0, 16, 16).shape == (16, 16, 3)


def test_small_svs(shared_slides):
    with open_slide(shared_slides / "small.svs") as slide:
        assert slide.dimensions == (16, 16)
        assert slide.mpp == pytest.approx(0.499)


def test_unopenable_and_unreadable_fail_at_open(shared_slides):
    # tiffslide "opens" unopenable.tiff as a 1x1 image; OpenSlide opens unreadable.svs
    # but its JPEG tiles are corrupt. Both must fail when opened, in one line.
    with pytest.raises(SlideError) as info:
        open_slide(shared_slides / "unopenable.tiff")
    message = str(info.value)
    assert "unopenable.tiff" in message and "\n" not in message
    assert "Unsupported TIFF compression" in message
    with pytest.raises(SlideError) as info:
        open_slide(shared_slides / "unreadable.svs")
    message = str(info.value)
    assert "unreadable.svs" in message and "corrupt" in message and "\n" not in message


def test_missing_and_non_slide_files(tmp_path):
    with pytest.raises(SlideError, match="not found"):
        open_slide(tmp_path / "absent.svs")
    junk = tmp_path / "notes.svs"
    junk.write_text("not an image")
    with pytest.raises(SlideError, match="notes.svs: not a readable whole-slide image"):
        open_slide(junk)


def test_mpp_metadata_order():
    assert mpp_from_properties({"openslide.mpp-x": "0.25", "aperio.MPP": "0.5"}) == (0.25, "openslide.mpp-x")
    assert mpp_from_properties({"aperio.MPP": "0.5"}) == (0.5, "aperio.MPP")
    # 40000 px/cm = 0.25 um/px; 50800 px/inch = 0.5 um/px
    assert mpp_from_properties({"tiff.XResolution": "40000", "tiff.ResolutionUnit": "centimeter"}) == (
        pytest.approx(0.25),
        "tiff.XResolution",
    )
    assert mpp_from_properties({"tiff.XResolution": 50800.0, "tiff.ResolutionUnit": "INCH"})[0] == pytest.approx(0.5)
    assert mpp_from_properties({"tiff.XResolution": "5", "tiff.ResolutionUnit": "none"}) == (None, None)
    assert mpp_from_properties({"tiffslide.mpp-x": 0.46}) == (0.46, "tiffslide.mpp-x")
    key = "dicom.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0].PixelSpacing[1]"
    assert mpp_from_properties({key: ".000499"}) == (pytest.approx(0.499), "dicom.PixelSpacing")
    # implausible values are skipped in favour of the next key, or reported absent
    assert mpp_from_properties({"openslide.mpp-x": "352.8", "aperio.MPP": "0.5"}) == (0.5, "aperio.MPP")
    assert mpp_from_properties({"openslide.mpp-x": "0", "aperio.MPP": "nan"}) == (None, None)


def test_bad_fallback_is_rejected(shared_slides):
    with pytest.raises(SlideError, match="mpp_fallback"):
        open_slide(shared_slides / "boxes.tiff", mpp_fallback=500.0)


def test_grey_tiff_is_refused(tmp_path):
    # OpenSlide refuses single-channel TIFFs; tiffslide opens them: refuse with a clear message.
    path = tmp_path / "grey.tiff"
    tifffile.imwrite(path, np.full((64, 64), 128, np.uint8), tile=(32, 32), resolution=(20000, 20000),
                     resolutionunit="CENTIMETER")
    with pytest.raises(SlideError, match="grey.tiff.*MINISBLACK.*not 8-bit RGB"):
        open_slide(path)


def test_transparent_pixels_become_white(tmp_path):
    rgba = np.zeros((64, 64, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[:32, :, 3] = 255  # top half opaque red-ish, bottom half fully transparent
    path = tmp_path / "alpha.tiff"
    tifffile.imwrite(path, rgba, tile=(32, 32), photometric="rgb", extrasamples=["unassalpha"],
                     resolution=(20000, 20000), resolutionunit="CENTIMETER")
    with open_slide(path) as slide:
        pixels = slide.read_region(0, 0, 0, 64, 64)
    assert (pixels[:32, :, 0] == 200).all() and (pixels[:32, :, 1] == 0).all()
    assert (pixels[32:] == 255).all()
