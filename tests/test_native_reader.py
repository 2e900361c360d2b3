"""The batch reader (Slide.read_tiles: native tiles decoded once, supertiles cut with
numpy) gives the pixels of today's one-read_region-per-tile reader, on real slides and on
the layouts the demo and the vendors write; it decodes each native tile once; a tile that
fails to decode mid-region is one line naming the slide and the region."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pathtwt.errors import ConfigError, SlideError
from pathtwt.wsi.slides import open_slide
from conftest import SHARED
from wsi_writers import (
    corrupt_tile, fluorescence_channels, he_image, pyramid, write_channel_pages, write_generic_tiff,
    write_ndpi_like, write_ome_tiff, write_svs,
)

CMU = "CMU-1-Small-Region.svs"
BACH = SHARED / "data" / "bach" / "images"


def _grid(slide, p0: int, limit: int = 60) -> np.ndarray:
    w, h = slide.dimensions
    xy = [(x, y) for y in range(0, h - p0 + 1, p0) for x in range(0, w - p0 + 1, p0)]
    return np.asarray(xy[:limit], dtype=np.int64).reshape(-1, 2)


def _assert_same_as_one_read_per_tile(path: Path, geometries, *, reader=None, channel_map=None, mpp=None):
    with open_slide(path, reader=reader, channel_map=channel_map, mpp_fallback=mpp) as slide:
        for p0, level, size in geometries:
            if level >= slide.level_count:  # OpenSlide sees an OME-TIFF's SubIFD levels not at all
                continue
            xy = _grid(slide, p0)
            assert len(xy), (path, p0)
            batch = slide.read_tiles(xy, p0, level, size)
            single = [slide.read_tile(int(x), int(y), p0, level, size) for x, y in xy]
            for (x, y), a, b in zip(xy, batch, single):
                assert a.shape == b.shape == (size, size, 3) and a.dtype == np.uint8
                assert np.array_equal(a, b), (path.name, slide.reader, p0, level, size, int(x), int(y))


@pytest.mark.parametrize("reader", [None, "tiffslide"])
def test_real_slides_read_as_today(shared_slides, reader):
    # the SVS at level 0 (224 px native, 256 px tiles shrunk, 100 px grown), boxes.tiff at
    # every level, including level 2 whose downsample (4.016) puts OpenSlide tiles at
    # fractional pixels
    _assert_same_as_one_read_per_tile(shared_slides / CMU, [(224, 0, 224), (256, 0, 224), (100, 0, 128)],
                                      reader=reader)
    _assert_same_as_one_read_per_tile(shared_slides / "boxes.tiff",
                                      [(64, 0, 64), (60, 1, 32), (96, 2, 24), (128, 3, 16)],
                                      reader=reader, mpp=0.5)


def test_the_svs_is_read_through_its_native_tiles_as_openslide_decodes_them(shared_slides):
    import openslide

    with open_slide(shared_slides / CMU) as slide, openslide.OpenSlide(str(shared_slides / CMU)) as raw:
        assert slide.native_level(0) is not None
        xy = _grid(slide, 224, limit=20)
        tiles = slide.read_tiles(xy, 224, 0, 224)
        for (x, y), tile in zip(xy, tiles):
            ref = np.asarray(raw.read_region((int(x), int(y)), 0, (224, 224)))[..., :3]
            assert np.array_equal(tile, ref)


def test_demo_and_vendor_layouts_read_as_today(tmp_path):
    from pathtwt.demo.tiff_writer import write_pyramidal_tiff

    image = he_image(1100, 900, seed=3)
    demo = tmp_path / "demo.tiff"
    write_pyramidal_tiff(demo, 1100, 900, lambda x, y, w, h: image[y:y + h, x:x + w], mpp=0.25)
    levels = pyramid(image, (1, 2, 4))
    both = (None, "tiffslide")
    files = {
        demo: both,
        write_generic_tiff(tmp_path / "generic.tiff", levels, 0.25): both,
        write_svs(tmp_path / "aperio.svs", levels, 0.25): both,
        write_ome_tiff(tmp_path / "pyramid.ome.tiff", levels, 0.25): both,
        write_generic_tiff(tmp_path / "lzw.tiff", levels, 0.25, compression="lzw"): both,
        # one JPEG strip a level (OpenSlide's Hamamatsu driver; tiffslide takes the .ndpi for
        # a real NDPI's 64-bit offsets): no native tiles, rows of tiles read as regions
        write_ndpi_like(tmp_path / "strips.ndpi", levels, 0.25): (None,),
    }
    for path, readers in files.items():
        for reader in readers:
            _assert_same_as_one_read_per_tile(path, [(224, 0, 224), (448, 0, 224), (448, 1, 224), (896, 2, 224)],
                                              reader=reader)
    with open_slide(demo) as slide:
        assert all(slide.native_level(level) is not None for level in range(slide.level_count))
    with open_slide(tmp_path / "pyramid.ome.tiff", reader="tiffslide") as slide:
        assert all(slide.native_level(level) is not None for level in range(slide.level_count))  # SubIFD levels
    with open_slide(tmp_path / "strips.ndpi") as slide:
        assert slide.native_level(0) is None


def test_dicom_rows_read_as_regions_as_today(shared_slides):
    _assert_same_as_one_read_per_tile(shared_slides / "boxes_0.dcm", [(4, 0, 4), (8, 0, 6)], mpp=0.5)


def test_jpeg2000_svs_reads_within_two_grey_levels(tmp_path):
    pytest.importorskip("imagecodecs")
    levels = pyramid(he_image(600, 500, seed=4), (1, 4))
    path = write_svs(tmp_path / "j2k.svs", levels, 0.5, jpeg2000=True)
    with open_slide(path) as slide:
        xy = _grid(slide, 128)
        batch = slide.read_tiles(xy, 128, 0, 128)
        single = [slide.read_tile(int(x), int(y), 128, 0, 128) for x, y in xy]
        worst = max(int(np.abs(a.astype(int) - b.astype(int)).max()) for a, b in zip(batch, single))
        assert worst <= 2


def test_fluorescence_channel_maps_read_as_today(tmp_path):
    channels, _ = fluorescence_channels(640, 512, seed=1)
    path = write_channel_pages(tmp_path / "fluo.ome.tiff", channels, 0.5)
    _assert_same_as_one_read_per_tile(path, [(128, 0, 64)], channel_map=(2, 0, 1))
    with open_slide(path, channel_map=(2, 0, 1)) as slide:
        assert slide.native_level(0) is None  # raw channels: the reader's own path


def _bach_mosaic(path: Path, n: int, tile: int = 256) -> Path:
    """A pyramidal JPEG TIFF of n x n real BACH images (1536 px each, 0.42 um/px)."""
    import cv2

    from pathtwt.demo.tiff_writer import write_pyramidal_tiff

    files = sorted(BACH.glob("*.jpeg"))[: n * n]
    if len(files) < n * n:
        pytest.skip(f"{BACH}: fewer than {n * n} BACH images")
    rows = [np.concatenate([cv2.imread(str(f))[..., ::-1] for f in files[r * n:(r + 1) * n]], axis=1) for r in range(n)]
    mosaic = np.ascontiguousarray(np.concatenate(rows, axis=0))
    side = mosaic.shape[0]
    write_pyramidal_tiff(path, side, side, lambda x, y, w, h: mosaic[y:y + h, x:x + w], mpp=0.42, tile=tile)
    return path


def test_bach_mosaic_reads_as_openslide_and_decodes_each_native_tile_once(tmp_path):
    if not BACH.is_dir():
        pytest.skip(f"{BACH}: the shared BACH images are absent")
    path = _bach_mosaic(tmp_path / "bach.tiff", 2)
    # 0.5 um/px tiles of 224 px from 0.42 um/px: 267 level-0 px, shrunk
    _assert_same_as_one_read_per_tile(path, [(267, 0, 224)])
    with open_slide(path) as slide:
        xy = _grid(slide, 267, limit=10_000)
        slide.read_tiles(xy, 267, 0, 224)
        level = slide.native_level(0)
        under = {i for x, y in xy for i in level.tiles_under(int(x), int(y), 267, 267)}
        assert level.decoded == len(under)  # each native tile once, though most tiles overlap four


def test_a_tile_that_fails_to_decode_names_the_slide_and_the_region(tmp_path):
    levels = pyramid(he_image(768, 512, seed=5), (1, 4))
    path = write_generic_tiff(tmp_path / "damaged.tiff", levels, 0.5)
    with open_slide(path) as slide:  # the probes at open time read the centre, not tile 0
        corrupt_tile(path, page=0, index=0)
        with pytest.raises(SlideError) as err:
            slide.read_tiles([(0, 0), (224, 0)], 224, 0, 224)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "region x=0 y=0 level=0 size=448x224" in message


def test_decode_is_resolved_once_into_where_and_which_decoder(monkeypatch):
    """--decode is resolved in the model's process, before the readers start: where the
    native tiles are decoded and, for the GPU, with which decoder."""
    from pathtwt.features import decoding, gpu_decoders

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ConfigError, match="CUDA is not available") as err:
        decoding.resolve_decode("gpu", "cuda")
    assert "\n" not in str(err.value)
    assert decoding.resolve_decode("auto", "cuda").where == "cpu" == decoding.resolve_decode(None, "cuda").where
    with pytest.raises(ConfigError, match="unknown; use one of auto, cpu, gpu"):
        decoding.resolve_decode("nvjpeg")
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.version.hip", None)
    installed = {"nvimgcodec": False, "torchvision": True}
    # each GPU decoder checks itself when it is made, on the GPU: here the host decoder stands in
    host = gpu_decoders.GPU_DECODERS["host"].make
    monkeypatch.setattr(gpu_decoders, "GPU_DECODERS", {
        name: ((lambda n=name: installed.get(n, True)), host, gpu) for name, (_i, _make, gpu) in gpu_decoders.GPU_DECODERS.items()})
    monkeypatch.setattr(gpu_decoders, "_USABLE", {})
    assert decoding.resolve_decode("auto", "cuda:0") == decoding.Decoding("gpu", "torchvision")
    installed["nvimgcodec"] = True  # the maintained decoder with the hardware engines comes first
    assert decoding.resolve_decode("gpu", "cuda") == decoding.Decoding("gpu", "nvimgcodec")
    assert decoding.resolve_decode("auto", "cpu").where == "cpu"  # the model on the CPU: no GPU decode
    with pytest.raises(ConfigError, match="--device cuda"):
        decoding.resolve_decode("gpu", "cpu")
    installed.update(nvimgcodec=False, torchvision=False)
    assert decoding.resolve_decode("auto", "cuda").where == "cpu"
    with pytest.raises(ConfigError, match="nvimgcodec"):
        decoding.resolve_decode("gpu", "cuda")
    monkeypatch.setattr("torch.version.hip", "6.2")  # an AMD GPU: no GPU JPEG decoder runs there
    installed.update(nvimgcodec=True, torchvision=True)
    assert decoding.resolve_decode("auto", "cuda").where == "cpu"
