"""The readers' table (pathtwt.wsi.readers.READERS) says what each reader does, and the
slide layer does what the rows say: every row's claims are checked against the reader
itself (where it places a region of a reduced level, whether it pads outside the level,
its handle's API, its pixel-size key), and a reader added as a handle plus one row opens,
tiles and reopens a slide like the others."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pathtwt.wsi import readers
from wsi_writers import write_ome_zarr  # noqa: E402 - tests/wsi_writers.py
from pathtwt.wsi.readers import Placement, SlideHandle, SlideReader
from pathtwt.wsi.slides import open_options_from_attrs, open_slide
from wsi_writers import he_image, pyramid, write_generic_tiff

MPP = 0.5


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A slide of each reader's own kind, by reader name: every level of each a whole
    number of level-0 pixels apart, a reduced level where the format has levels."""
    folder = tmp_path_factory.mktemp("readers")
    he = he_image(1024, 768, seed=5)
    tiff = write_generic_tiff(folder / "slide.tiff", pyramid(he, (1, 4)), MPP)
    png = folder / "image.png"
    Image.fromarray(he[:200, :300]).save(png, dpi=(25400 / MPP, 25400 / MPP))
    zarr = write_ome_zarr(folder / "slide.ome.zarr", pyramid(he, (1, 2)), MPP)
    return {"openslide": tiff, "tiffslide": tiff, "image": png, "ome-zarr": zarr}


def test_every_reader_opens_its_own_kind_through_a_slide_handle(files):
    assert set(files) == set(readers.names()), "a reader of the table without a file of its kind here"
    for row in readers.READERS:
        handle = row.opener(files[row.name])
        try:
            assert isinstance(handle, SlideHandle), row.name
            assert row.mpp_key in handle.properties, f"{row.name}: its pixel-size key is not among its properties"
        finally:
            handle.close()
        with open_slide(files[row.name], reader=row.name) as slide:
            assert slide.reader_spec is row and slide.mpp == pytest.approx(MPP)


def _pads_transparent(handle: SlideHandle) -> bool:
    """Whether a read across the right edge of level 0 comes back whole, the part outside
    the level transparent (as OpenSlide pads). Asked as Slide asks a reader that pads: no
    options."""
    w, _ = handle.level_dimensions[0]
    region = np.asarray(handle.read_region((w - 4, 0), 0, (8, 8)))
    return region.shape[:2] == (8, 8) and region.shape[2] == 4 and not region[:, 4:, 3].any()


def _places_by_truncation(handle: SlideHandle) -> bool:
    """Whether a region of level 1 asked for at a level-0 x between two level pixels starts
    at the pixel before (the quotient truncated) rather than between them."""
    ds = int(handle.level_downsamples[1])

    def read(x: int) -> np.ndarray:
        return np.asarray(handle.read_region((x, 40 * ds), 1, (24, 12)))[..., :3]

    return np.array_equal(read(ds * 10 + ds // 2), read(ds * 10))


def test_each_row_says_how_its_reader_pads_and_places(files):
    for row in readers.READERS:
        handle = row.opener(files[row.name])
        try:
            assert row.pads == _pads_transparent(handle), f"{row.name}: the row says pads={row.pads}"
            if handle.level_count > 1:
                truncates = _places_by_truncation(handle)
                assert (row.placement is Placement.TRUNCATED) == truncates, f"{row.name}: {row.placement}"
        finally:
            handle.close()


# ---------------------------------------------------------------- a reader added as one row

NPY_MPP_KEY = "npy.mpp-x"


class NpyHandle:
    """A slide stored as one .npy array (the handle module of a new reader)."""

    def __init__(self, path: Path):
        self._pixels = np.load(path)
        h, w = self._pixels.shape[:2]
        self.level_count, self.level_dimensions, self.level_downsamples = 1, [(w, h)], [1.0]
        self.properties = {NPY_MPP_KEY: MPP}

    def read_region(self, location, level, size, as_array: bool = True) -> np.ndarray:
        (x, y), (w, h) = location, size
        return self._pixels[y:y + h, x:x + w]

    def close(self) -> None:
        self._pixels = None


def _is_npy(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(6) == b"\x93NUMPY"
    except OSError:
        return False


NPY = SlideReader("npy", "the NumPy reader", NpyHandle, Placement.TRUNCATED, pads=False, mpp_key=NPY_MPP_KEY,
                  claims=_is_npy)


def test_a_new_reader_is_its_handle_plus_one_row(tmp_path, monkeypatch):
    from pathtwt.cli import tile
    from pathtwt.errors import SlideError
    from pathtwt.wsi.tiling import tile_slide

    pixels = he_image(640, 480, seed=9)
    path = tmp_path / "slide.npy"
    np.save(path, pixels)
    with pytest.raises(SlideError, match="slide.npy: not a readable whole-slide image"):
        open_slide(path)  # no reader reads it yet

    monkeypatch.setattr(readers, "READERS", (*readers.READERS, NPY))
    with open_slide(path) as slide:  # picked by its bytes, its pixel size read from its key
        assert slide.reader == "npy" and slide.mpp == MPP and slide.mpp_source == NPY_MPP_KEY
        assert np.array_equal(slide.read_region(100, 50, 0, 32, 16), pixels[50:66, 100:132])
        edge = slide.read_region(630, 470, 0, 20, 20)  # clipped to the level, the rest the slide's fill
        assert np.array_equal(edge[:10, :10], pixels[470:, 630:]) and (edge[10:] == 255).all()
        tiling = tile_slide(slide, target_mpp=1.0, tile_size=64)
        assert tiling.attrs["reader"] == "npy" and len(tiling.coords) > 0
        xy = tiling.coords[:8]
        batch = slide.read_tiles(xy, tiling.attrs["patch_size_level0"], 0, 64)
        one = [slide.read_tile(int(x), int(y), tiling.attrs["patch_size_level0"], 0, 64) for x, y in xy]
        assert np.array_equal(np.stack(batch), np.stack(one))
    with open_slide(path, **open_options_from_attrs(tiling.attrs)) as again:
        assert again.reader == "npy"
    parser = argparse.ArgumentParser()
    tile.add_arguments(parser)
    assert "npy" in next(a for a in parser._actions if a.dest == "reader").choices
