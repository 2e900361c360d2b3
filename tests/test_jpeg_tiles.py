"""Batch JPEG decode of native tiles through torchvision (tested with its CPU decoder,
through the same stream splicing a GPU uses), and the cut and resize on the device."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
tifffile = pytest.importorskip("tifffile")

from pathtwt.wsi import jpeg_tiles  # noqa: E402
from pathtwt.wsi.jpeg_tiles import (  # noqa: E402
    DeviceLevel,
    TorchJpegDecoder,
    area_resize,
    decode_streams,
    splice,
    tile_streams,
)
from pathtwt.wsi.native_tiles import decode_native_tiles  # noqa: E402
from conftest import SHARED_SLIDES  # noqa: E402

CMU = SHARED_SLIDES / "CMU-1-Small-Region.svs"
BACH = sorted((SHARED_SLIDES.parent / "bach" / "images").glob("*.jpeg"))[:2]
needs_cmu = pytest.mark.skipif(not CMU.is_file(), reason="../shared/data/slides/CMU-1-Small-Region.svs is absent")
needs_bach = pytest.mark.skipif(len(BACH) < 2, reason="../shared/data/bach/images/*.jpeg are absent")


def _max_diff(a, b) -> int:
    a = a.cpu().numpy() if hasattr(a, "cpu") else np.asarray(a)
    return int(np.abs(a.astype(np.int16) - np.asarray(b).astype(np.int16)).max())


@pytest.fixture(scope="module")
def cmu_page():
    with tifffile.TiffFile(CMU) as tif:
        yield tif.pages[0]


@pytest.fixture(scope="module")
def bach_tiff(tmp_path_factory) -> Path:
    """A two-level JPEG-tiled TIFF of two BACH images side by side, cut to a size that is
    no multiple of the 256 px tiles (edge tiles), levels as separate pages as OpenSlide's
    generic TIFF reader expects."""
    import cv2
    import imagecodecs

    image = np.concatenate([imagecodecs.imread(p)[:1300, :1400] for p in BACH], axis=1)  # 1300 x 2800
    half = cv2.resize(image, (image.shape[1] // 2, image.shape[0] // 2), interpolation=cv2.INTER_AREA)
    path = tmp_path_factory.mktemp("jpeg") / "bach.tif"
    with tifffile.TiffWriter(path) as tw:
        for level, subfiletype in ((image, 0), (half, 1)):  # 1: a reduced-resolution level
            tw.write(level, tile=(256, 256), compression="jpeg", photometric="rgb", subfiletype=subfiletype)
    return path


@needs_cmu
def test_spliced_rgb_tiles_equal_tifffile_and_openslide(cmu_page):
    import openslide

    page = cmu_page
    assert int(page.photometric) == jpeg_tiles.PHOTOMETRIC_RGB and page.jpegtables  # Aperio's RGB JPEG, tables apart
    indices = list(range(len(page.dataoffsets)))
    ours = TorchJpegDecoder("cpu")(page, indices)
    reference = decode_native_tiles(page, indices)
    assert max(_max_diff(a, b) for a, b in zip(ours, reference)) <= jpeg_tiles.TOLERANCE
    # the same native tiles through OpenSlide (the last tile of the first row is an edge tile)
    across = -(-page.imagewidth // page.tilewidth)
    with openslide.OpenSlide(str(CMU)) as slide:
        for index in (0, across - 1, across + 3):
            x, y = (index % across) * page.tilewidth, (index // across) * page.tilelength
            w, h = min(page.tilewidth, page.imagewidth - x), min(page.tilelength, page.imagelength - y)
            seen = np.asarray(slide.read_region((x, y), 0, (w, h)))[..., :3]
            assert _max_diff(ours[index][:h, :w], seen) <= jpeg_tiles.TOLERANCE


@needs_cmu
def test_rgb_jpeg_without_adobe_marker_decodes_to_wrong_colours(cmu_page):
    # why the marker is spliced in: a decoder takes three-component JPEGs for YCbCr
    data = tile_streams(cmu_page, [0])[0]
    assert jpeg_tiles.ADOBE_RGB in data
    raw = data.replace(jpeg_tiles.ADOBE_RGB, b"", 1)
    wrong = decode_streams([raw])[0].permute(1, 2, 0)
    assert _max_diff(wrong, decode_native_tiles(cmu_page, [0])[0]) > 50


def test_splice_joins_tables_and_stream():
    tables = b"\xff\xd8" + b"\xff\xdb\x00\x03\x07" + b"\xff\xd9"
    stream = b"\xff\xd8" + b"\xff\xda\x00\x02" + b"\x12\x34" + b"\xff\xd9"
    assert splice(tables, stream) == b"\xff\xd8\xff\xdb\x00\x03\x07\xff\xda\x00\x02\x12\x34\xff\xd9"
    assert splice(None, stream) == stream
    assert splice(None, stream, rgb=True) == b"\xff\xd8" + jpeg_tiles.ADOBE_RGB + stream[2:]
    assert splice(None, splice(None, stream, rgb=True), rgb=True).count(b"Adobe") == 1
    with pytest.raises(ValueError, match="SOI"):
        splice(tables, b"\x00\x00" + stream)


@needs_bach
def test_bach_jpeg_tiff_regions_equal_tifffile_and_openslide(bach_tiff):
    import openslide

    with tifffile.TiffFile(bach_tiff) as tif, openslide.OpenSlide(str(bach_tiff)) as slide:
        decoder = TorchJpegDecoder("cpu")
        for level in (0, 1):
            page = tif.pages[level]
            assert jpeg_tiles.is_jpeg_tiled(page)
            full = page.asarray()
            device_level = DeviceLevel(page, decoder)
            w, h = int(page.imagewidth), int(page.imagelength)
            # inside, across four native tiles, and over the bottom-right edge (filled white)
            boxes = [(100, 200, 300, 250), (w - 150, h - 120, 200, 200)]
            inside, edge = device_level.regions(boxes)
            assert _max_diff(inside, full[200:450, 100:400]) <= jpeg_tiles.TOLERANCE
            assert _max_diff(edge[:120, :150], full[h - 120:, w - 150:]) <= jpeg_tiles.TOLERANCE
            assert bool((edge[120:] == 255).all()) and bool((edge[:, 150:] == 255).all())
            ds = slide.level_downsamples[level]
            seen = np.asarray(slide.read_region((int(100 * ds), int(200 * ds)), level, (300, 250)))[..., :3]
            assert _max_diff(inside, seen) <= jpeg_tiles.TOLERANCE


@needs_cmu
def test_device_tiles_equal_slide_read_tile(cmu_page):
    from pathtwt.wsi.slides import open_slide

    level = DeviceLevel(cmu_page, TorchJpegDecoder("cpu"))
    origins = [(0, 0), (448, 224), (1500, 2500)]
    with open_slide(CMU) as slide:
        for side, size in ((448, 224), (256, 224), (224, 224), (200, 224)):
            tiles = level.tiles(origins, side, size)
            assert tiles.shape == (len(origins), size, size, 3) and tiles.dtype == torch.uint8
            for tile, (x, y) in zip(tiles, origins):
                assert _max_diff(tile, slide.read_tile(x, y, side, 0, size)) <= jpeg_tiles.TOLERANCE


def test_area_resize_matches_cv2():
    import cv2

    rng = np.random.default_rng(0)
    for side, tolerance in ((448, 0), (256, 0), (300, 0), (200, 1)):
        batch = rng.integers(0, 256, (2, side, side, 3), dtype=np.uint8)
        ours = area_resize(torch.from_numpy(batch), 224).numpy()
        interp = cv2.INTER_AREA if side > 224 else cv2.INTER_LINEAR
        theirs = np.stack([cv2.resize(t, (224, 224), interpolation=interp) for t in batch])
        assert _max_diff(ours, theirs) <= tolerance, side


def _copy_with_damaged_tile(source: Path, dest: Path, index: int, how: str) -> None:
    shutil.copy(source, dest)
    if how == "truncated":
        # the tile's stream cut in half (no end-of-image marker): torchvision refuses it,
        # libjpeg through tifffile decodes what is there with a warning
        with tifffile.TiffFile(dest, mode="r+b") as tif:
            tag = tif.pages[0].tags["TileByteCounts"]
            counts = list(tag.value)
            counts[index] //= 2
            tag.overwrite(counts)
        return
    with tifffile.TiffFile(dest) as tif:
        offset, count = int(tif.pages[0].dataoffsets[index]), int(tif.pages[0].databytecounts[index])
    with open(dest, "r+b") as fh:
        fh.seek(offset + count // 2)
        fh.write(bytes(range(256)) * 2)  # undecodable by either decoder


@needs_bach
def test_refused_stream_is_decoded_on_cpu_with_one_log_line(bach_tiff, tmp_path, caplog):
    damaged = tmp_path / "truncated.tif"
    _copy_with_damaged_tile(bach_tiff, damaged, 2, "truncated")
    with tifffile.TiffFile(damaged) as tif:
        page = tif.pages[0]
        decoder = TorchJpegDecoder("cpu")
        with caplog.at_level(logging.WARNING, logger="pathtwt.wsi.jpeg_tiles"):
            tiles = decoder(page, [1, 2, 3])
        reference = decode_native_tiles(page, [1, 2, 3])
    assert decoder.fallbacks == 1
    assert [_max_diff(a, b) for a, b in zip(tiles, reference)] == [0, 0, 0]
    lines = [r.getMessage() for r in caplog.records if "decoded on the CPU" in r.getMessage()]
    assert len(lines) == 1 and "truncated.tif" in lines[0] and "\n" not in lines[0]


@needs_bach
def test_undecodable_stream_raises(bach_tiff, tmp_path):
    damaged = tmp_path / "garbage.tif"
    _copy_with_damaged_tile(bach_tiff, damaged, 2, "garbage")
    with tifffile.TiffFile(damaged) as tif:
        with pytest.raises(Exception):
            TorchJpegDecoder("cpu")(tif.pages[0], [2])


@needs_cmu
def test_pixels_off_tifffiles_send_the_page_to_cpu(cmu_page, monkeypatch, caplog):
    # a decoder that ignores the colour-space marker (as a GPU decoder might) is caught
    monkeypatch.setattr(jpeg_tiles, "ADOBE_RGB", b"")
    decoder = TorchJpegDecoder("cpu")
    with caplog.at_level(logging.WARNING, logger="pathtwt.wsi.jpeg_tiles"):
        first = decoder(cmu_page, [0, 1])
        later = decoder(cmu_page, [5])
    reference = decode_native_tiles(cmu_page, [0, 1, 5])
    assert [_max_diff(a, b) for a, b in zip(first + later, reference)] == [0, 0, 0]
    lines = [r.getMessage() for r in caplog.records if "differ from tifffile" in r.getMessage()]
    assert len(lines) == 1


def test_other_compressions_are_decoded_on_cpu_with_one_log_line(tmp_path, caplog):
    image = np.random.default_rng(1).integers(0, 256, (512, 512, 3), dtype=np.uint8)
    path = tmp_path / "lzw.tif"
    tifffile.imwrite(path, image, tile=(256, 256), compression="lzw", photometric="rgb")
    with tifffile.TiffFile(path) as tif, caplog.at_level(logging.WARNING, logger="pathtwt.wsi.jpeg_tiles"):
        decoder = TorchJpegDecoder("cpu")
        first, second = decoder(tif.pages[0], [0, 1]), decoder.tensors(tif.pages[0], [3])
    assert np.array_equal(first[0], image[:256, :256]) and np.array_equal(second[0].numpy(), image[256:, 256:])
    assert len([r for r in caplog.records if "lzw.tif" in r.getMessage()]) == 1


@needs_cmu
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a process where CUDA cannot start")
def test_cuda_decoder_where_cuda_cannot_start_reads_on_cpu_said_once(cmu_page, caplog):
    decoder = TorchJpegDecoder("cuda")
    with caplog.at_level(logging.WARNING, logger="pathtwt.wsi.jpeg_tiles"):
        tiles = decoder(cmu_page, [0, 1]) + decoder(cmu_page, [2])
    assert [_max_diff(a, b) for a, b in zip(tiles, decode_native_tiles(cmu_page, [0, 1, 2]))] == [0, 0, 0]
    assert len([r for r in caplog.records if "cannot start CUDA" in r.getMessage()]) == 1


@needs_cmu
def test_read_tiles_on_device_equal_the_slides_read_tiles():
    from pathtwt.wsi.jpeg_tiles import read_tiles_on_device
    from pathtwt.wsi.slides import open_slide

    decoder = TorchJpegDecoder("cpu")
    xy = np.array([(0, 0), (224, 0), (1000, 1333), (2000, 2800)])  # the last one runs off the slide
    with open_slide(CMU) as slide:
        for side, size in ((224, 224), (448, 224)):
            batch = read_tiles_on_device(slide, xy, side, 0, size, decoder)
            expected = slide.read_tiles(xy, side, 0, size)
            assert batch.shape == (len(xy), size, size, 3)
            assert max(_max_diff(a, b) for a, b in zip(batch, expected)) <= jpeg_tiles.TOLERANCE
    with open_slide(SHARED_SLIDES / "boxes.tiff", mpp_fallback=0.5) as other:  # not JPEG: the CPU reads it
        assert read_tiles_on_device(other, xy[:1], 64, 0, 64, decoder) is None


@needs_cmu
def test_gpu_decode_cuts_and_shrinks_on_the_device(monkeypatch):
    """With the GPU decoder, a JPEG-tiled level's tiles are decoded, cut and shrunk to the
    model's input on the device (here torchvision's CPU decoder stands in for CUDA): the
    same tiles as the CPU path within the decoders' tolerance; a model input larger than
    the tile is enlarged on the CPU, as today."""
    from dataclasses import replace

    from pathtwt.wsi.coords_tiles import TileGeometry

    monkeypatch.setattr(jpeg_tiles, "_GPU_DECODER", TorchJpegDecoder("cpu"))
    on_device = []
    real = jpeg_tiles.read_tiles_on_device
    monkeypatch.setattr(jpeg_tiles, "read_tiles_on_device", lambda *a: on_device.append(1) or real(*a))
    gpu = TileGeometry(slide_path=CMU, patch_size_level0=448, read_level=0, patch_size=448, decode="gpu")
    cpu = replace(gpu, decode="cpu")
    xy = np.array([(0, 0), (448, 0), (1000, 1333), (1900, 2700)])  # the last one runs off the slide
    with gpu.open() as a, cpu.open() as b:
        ours, theirs = gpu.read_many(a, xy, 224), cpu.read_many(b, xy, 224)
        assert on_device and [t.shape for t in ours] == [(224, 224, 3)] * len(xy)
        assert max(_max_diff(s, t) for s, t in zip(ours, theirs)) <= jpeg_tiles.TOLERANCE
        on_device.clear()
        assert [t.shape for t in gpu.read_many(a, xy[:1], 512)] == [(512, 512, 3)] and not on_device


def test_a_gpu_reading_process_decodes_on_the_jobs_gpu(monkeypatch):
    import types

    from pathtwt.wsi import coords_tiles

    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: chosen.append(str(device)))
    dataset = types.SimpleNamespace(decode_device="cuda:1")
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: types.SimpleNamespace(dataset=dataset))
    coords_tiles.reader_worker_init(0)
    assert chosen == ["cuda:1"]
    dataset.decode_device = None  # a CPU-decoding job's readers never touch CUDA
    coords_tiles.reader_worker_init(0)
    assert chosen == ["cuda:1"]
