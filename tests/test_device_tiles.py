"""The GPU path of extraction, driven on a CPU: a reading process ships the complete JPEG
streams of the native tiles under a batch and a cut plan; the embedding process decodes
them (the host decoder standing in for nvImageCodec), cuts every tile with one gather and
shrinks it. The tiles equal the CPU path's, and every fault is one log line or one slide's
failure, never a crash.

Every test runs as the device path runs in a job on an H100 or H200: under inference mode
and the job's own precision context, bf16 autocast (``AutoPrecision.job_context``), which
CPU autocast applies to the same operations (matmul among them) as CUDA's."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch

from pathtwt.features import device_tiles
from pathtwt.features.device_tiles import DeviceTiles, UndecodableTile, area_resize, cut
from pathtwt.features.jpeg_reference import fancy
from pathtwt.features.gpu_decoders import BatchDecoder, make_decoder
from pathtwt.features.reading import Band, BatchReader, SlideRead, plan_bands
from pathtwt.features.ring import Ring, RingSize
from pathtwt.wsi import jpeg_streams
from pathtwt.wsi.coords_tiles import TileGeometry
from pathtwt.wsi.cut_plan import CutPlan, LevelGrid, gather_plan, natives_under
from pathtwt.wsi.jpeg_streams import ADOBE_RGB, StreamHeader, pack_streams, splice, tile_streams
from pathtwt.wsi.native_tiles import decode_native_tiles

CMU = "CMU-1-Small-Region.svs"


@pytest.fixture(autouse=True)
def job_precision():
    """The context EmbedJob runs a bf16 job's batches in (loop.py), with a stand-in model."""
    from pathtwt.models.bf16_guard import AutoPrecision

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with torch.inference_mode(), AutoPrecision(bf16=True, note="kept").job_context("cpu", model):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        yield


def _max_diff(a, b) -> int:
    a = a.cpu().numpy() if hasattr(a, "cpu") else np.asarray(a)
    return int(np.abs(a.astype(np.int16) - np.asarray(b).astype(np.int16)).max())


@pytest.fixture(scope="module")
def cmu(shared_slides) -> Path:
    return shared_slides / CMU


@pytest.fixture(scope="module")
def bach_tiff(tmp_path_factory, shared_bach) -> Path:
    """A two-level JPEG-tiled TIFF of two BACH images side by side, cut to a size that is
    no multiple of the 256 px tiles (edge tiles), levels as separate pages as OpenSlide's
    generic TIFF reader expects."""
    import cv2
    import imagecodecs

    files = sorted(shared_bach.glob("*.jpeg"))[:2]
    image = np.concatenate([imagecodecs.imread(p)[:1300, :1400] for p in files], axis=1)  # 1300 x 2800
    half = cv2.resize(image, (image.shape[1] // 2, image.shape[0] // 2), interpolation=cv2.INTER_AREA)
    path = tmp_path_factory.mktemp("jpeg") / "bach.tif"
    with tifffile.TiffWriter(path) as tw:
        for level, subfiletype in ((image, 0), (half, 1)):  # 1: a reduced-resolution level
            tw.write(level, tile=(256, 256), compression="jpeg", photometric="rgb", subfiletype=subfiletype,
                     resolution=(1e4 / 0.25, 1e4 / 0.25), resolutionunit="CENTIMETER")
    return path


def _geometry(slide: Path, side: int, size: int) -> TileGeometry:
    return TileGeometry(slide_path=slide, patch_size_level0=side, read_level=0, patch_size=size)


def _messages(slide: Path, xy, side: int, size: int, batch: int, input_size: int | None = None):
    """What a reading process sends for ``xy`` in batches of ``batch`` (one band), and the ring."""
    input_size = input_size or size
    ring = Ring(RingSize.for_job(1, batch, input_size * input_size * 3, batch * 4 * 65536))
    reader = BatchReader(ring, input_size, lambda t: t, ship_bytes=True)
    read = SlideRead(0, _geometry(slide, side, size), np.asarray(xy, np.int64))
    band = Band(0, 0, tuple((i, min(i + batch, len(xy))) for i in range(0, len(xy), batch)))
    messages = list(reader.band(read, band, iter(range(ring.size.slots))))
    reader.close()
    return messages, ring


def test_spliced_rgb_streams_decode_to_tifffiles_and_openslides_pixels(cmu):
    import openslide

    with tifffile.TiffFile(cmu) as tif:
        page = tif.pages[0]
        assert int(page.photometric) == 2 and page.jpegtables  # Aperio's RGB JPEG, tables apart
        indices = list(range(len(page.dataoffsets)))
        ours = [fancy(s) for s in tile_streams(page, indices)]
        reference = decode_native_tiles(page, indices)
        assert max(_max_diff(a, b) for a, b in zip(ours, reference)) == 0
        across = -(-page.imagewidth // page.tilewidth)
        with openslide.OpenSlide(str(cmu)) as slide:
            for index in (0, across - 1, across + 3):  # the last of the first row is an edge tile
                x, y = (index % across) * page.tilewidth, (index // across) * page.tilelength
                w, h = min(page.tilewidth, page.imagewidth - x), min(page.tilelength, page.imagelength - y)
                seen = np.asarray(slide.read_region((x, y), 0, (w, h)))[..., :3]
                assert _max_diff(ours[index][:h, :w], seen) <= 2  # the same libjpeg-turbo: rounding only
        # why the Adobe marker is spliced in: a decoder takes three-component JPEGs for YCbCr
        raw = tile_streams(page, [0])[0].replace(ADOBE_RGB, b"", 1)
        assert _max_diff(fancy(raw), reference[0]) > 50


def test_splice_joins_tables_and_stream():
    tables = b"\xff\xd8" + b"\xff\xdb\x00\x03\x07" + b"\xff\xd9"
    stream = b"\xff\xd8" + b"\xff\xda\x00\x02" + b"\x12\x34" + b"\xff\xd9"
    assert splice(tables, stream) == b"\xff\xd8\xff\xdb\x00\x03\x07\xff\xda\x00\x02\x12\x34\xff\xd9"
    assert splice(None, stream) == stream
    assert splice(None, stream, rgb=True) == b"\xff\xd8" + ADOBE_RGB + stream[2:]
    assert splice(None, splice(None, stream, rgb=True), rgb=True).count(b"Adobe") == 1
    with pytest.raises(ValueError, match="SOI"):
        splice(tables, b"\x00\x00" + stream)


def test_the_colour_transform_is_read_from_the_marker_segments_as_libjpeg_reads_it():
    from pathtwt.wsi.jpeg_streams import adobe_transform

    table = b"\xff\xdb\x00\x06\x00\xff\xee\x00"  # a quantisation table whose bytes hold an APP14 marker's
    ycbcr = ADOBE_RGB[:-1] + b"\x01"
    assert adobe_transform(table + b"\xff\xda\x00\x02") is None
    assert adobe_transform(ADOBE_RGB + table) == 0
    assert adobe_transform(ADOBE_RGB + ycbcr + b"\xff\xda\x00\x02" + ADOBE_RGB) == 1  # the last before the SOS
    assert StreamHeader.of(None, b"\xff\xd8" + table, rgb=True).rgb  # spliced: the table's bytes are no marker
    assert not StreamHeader.of(None, b"\xff\xd8" + ycbcr, rgb=True).rgb  # the stream's own marker stays


def test_streams_are_packed_into_the_slot_with_one_read_each(cmu, tmp_path):
    import os

    with tifffile.TiffFile(cmu) as tif:
        page = tif.pages[0]
        header = StreamHeader.of_page(page)
        want = tile_streams(page, [3, 4, 9])
        arena = memoryview(bytearray(200_000))
        fd = os.open(cmu, os.O_RDONLY)
        try:
            offsets, lengths = pack_streams(page, header, [3, 4, 9], fd, arena)
            assert [bytes(arena[o:o + n]) for o, n in zip(offsets, lengths)] == want
            assert pack_streams(page, header, list(range(40)), fd, memoryview(bytearray(50_000))) is None  # too small
        finally:
            os.close(fd)
        # a file cut short: the read comes up short and says so
        short = tmp_path / "short.svs"
        short.write_bytes(cmu.read_bytes()[: int(page.dataoffsets[9]) + 10])
        fd = os.open(short, os.O_RDONLY)
        try:
            with pytest.raises(OSError, match="truncated"):
                pack_streams(page, header, [9], fd, arena)
        finally:
            os.close(fd)


def test_natives_under_are_the_tiles_a_square_overlaps():
    grid = LevelGrid(width=1000, height=700, tile_width=256, tile_height=256)  # 4 x 3 native tiles
    assert grid.across == 4
    assert natives_under(grid, [(0, 0)], 256).tolist() == [0]
    assert natives_under(grid, [(200, 200)], 100).tolist() == [0, 1, 4, 5]
    assert natives_under(grid, [(900, 600), (-50, -50)], 200).tolist() == [0, 11]  # clipped to the level
    assert natives_under(grid, [(2000, 2000)], 64).tolist() == []  # wholly outside


def test_cut_and_shrink_give_the_slides_read_tile(cmu):
    """The gather cut from decoded native tiles, then area_resize: the pixels of
    Slide.read_tile, edges off the slide filled white, for whole and fractional factors
    and an enlargement."""
    from pathtwt.wsi.slides import open_slide

    xy = np.array([(0, 0), (448, 224), (1500, 2500), (2000, 2800)])  # the last runs off the slide
    with tifffile.TiffFile(cmu) as tif, open_slide(cmu) as slide:
        page = tif.pages[0]
        grid = LevelGrid.of_page(page)
        for side, size in ((448, 224), (267, 224), (224, 224), (200, 224)):
            natives = natives_under(grid, xy, side)
            decoded = np.stack(decode_native_tiles(page, natives) + [np.full((240, 240, 3), 255, np.uint8)])
            stack = torch.from_numpy(decoded)  # the natives, then the fill tile
            plan = CutPlan(grid, natives, xy, side, size)
            axes, lut = map(torch.from_numpy, gather_plan(plan))
            tiles = area_resize(cut(stack, axes, lut), size)
            assert tiles.shape == (len(xy), size, size, 3) and tiles.dtype == torch.uint8
            for tile, (x, y) in zip(tiles, xy):
                # whole factors: cv2's pixels; a fractional factor sums in another order (one grey
                # level, rarely); enlarging: cv2's fixed-point bilinear (one grey level)
                limit = 0 if side % size == 0 else 1
                assert _max_diff(tile, slide.read_tile(int(x), int(y), side, 0, size)) <= limit, (side, x, y)


def test_area_resize_matches_cv2():
    import cv2

    rng = np.random.default_rng(0)
    # a halving rounds half up (cv2's 2x2 fast path), other factors half to even
    for side, size, tolerance in ((448, 224, 0), (224, 56, 0), (256, 224, 1), (300, 224, 1), (267, 224, 1),
                                  (200, 224, 1)):
        batch = rng.integers(0, 256, (2, side, side, 3), dtype=np.uint8)
        ours = area_resize(torch.from_numpy(batch), size).numpy()
        interp = cv2.INTER_AREA if side > size else cv2.INTER_LINEAR
        theirs = np.stack([cv2.resize(t, (size, size), interpolation=interp) for t in batch])
        assert _max_diff(ours, theirs) <= tolerance, side


def test_a_bands_batches_share_their_native_tiles_on_the_device(bach_tiff):
    """Neighbouring batches of a band lie over the same native tiles: the reader ships each
    once and the device keeps what the next batch needs; the tiles are the CPU path's."""
    from pathtwt.wsi.slides import open_slide

    xy = np.array([(x, y) for y in range(0, 1000, 224) for x in range(0, 2600, 224)])
    messages, ring = _messages(bach_tiff, xy, 224, 224, batch=16)
    made = DeviceTiles(ring, "cpu", 224, decoder=make_decoder("host", "cpu"))
    tiles = torch.cat([made.batch(m).tiles() for m in messages])
    shipped = sum(len(m.fresh) for m in messages)
    needed = len(natives_under(LevelGrid(2800, 1300, 256, 256), xy, 224))
    assert all(m.kind == "bytes" for m in messages)
    record = made.records[0]
    assert shipped == needed == record.device and record.reused > 0 and record.host == 0  # each native tile once
    with open_slide(bach_tiff) as slide:
        expected = slide.read_tiles(xy, 224, 0, 224)
    assert max(_max_diff(a, b) for a, b in zip(tiles, expected)) == 0


def test_bands_span_enough_native_rows_that_few_tiles_are_read_twice():
    xy = np.array([(x, y) for y in range(0, 224 * 100, 224) for x in range(0, 224 * 10, 224)])
    read = SlideRead(0, _geometry(Path("x.tif"), 224, 224), xy, band_rows=24 * 256)
    bands = plan_bands(read, 32, 0, xy[:, 1])
    tops = [int(xy[b.batches[0][0], 1]) for b in bands]
    heights = [int(xy[b.batches[-1][1] - 1, 1]) - t for b, t in zip(bands, tops)]
    assert len(bands) == 3 and min(heights[:-1]) >= 24 * 256
    assert [s for b in bands for s in b.batches] == [(i, min(i + 32, len(xy))) for i in range(0, len(xy), 32)]
    # a level without native tiles: bands of a fixed number of batches
    plain = plan_bands(SlideRead(0, read.geometry, xy), 32, 5, None)
    assert [b.number for b in plain][:2] == [5, 6] and len(plain[0].batches) == 8


def _damaged_copy(source: Path, dest: Path, index: int, how: str) -> None:
    shutil.copy(source, dest)
    with tifffile.TiffFile(dest) as tif:
        offset, count = int(tif.pages[0].dataoffsets[index]), int(tif.pages[0].databytecounts[index])
    with open(dest, "r+b") as fh:
        if how == "truncated":  # the stream's second half zeroed: decodes with a warning on the host
            fh.seek(offset + count // 2)
            fh.write(b"\x00" * (count // 2 - 2))
        else:
            fh.seek(offset + 2)
            fh.write(bytes(range(256)) * 2)  # the header destroyed: no decoder reads it


def test_a_stream_the_gpu_decoder_refuses_is_decoded_on_the_host_with_one_line(bach_tiff, caplog):
    xy = np.array([(x, 0) for x in range(0, 1400, 224)])
    messages, ring = _messages(bach_tiff, xy, 224, 224, batch=3)

    shipped = [bytes(s) for m in messages for s in _streams(m, ring)]
    bad = set(shipped[1::2])

    def refusing(streams):  # a GPU decoder that refuses every other stream shipped, alone or not
        return [None if bytes(s) in bad else torch.from_numpy(fancy(s)) for s in streams]

    made = DeviceTiles(ring, "cpu", 224, decoder=BatchDecoder("refusing", refusing))
    with caplog.at_level(logging.WARNING, logger="pathtwt.features.device_tiles"):
        tiles = torch.cat([made.batch(m).tiles() for m in messages])
    from pathtwt.wsi.slides import open_slide

    with open_slide(bach_tiff) as slide:
        assert max(_max_diff(a, b) for a, b in zip(tiles, slide.read_tiles(xy, 224, 0, 224))) == 0
    assert made.records[0].refused > 1 and made.records[0].host == made.records[0].refused
    assert "refused" in made.records[0].fallback()
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]


def _streams(msg, ring) -> list:
    slot = ring.slot(msg.slot)
    return [slot[o:o + n] for o, n in zip(msg.offsets.tolist(), msg.lengths.tolist())]


def test_a_native_tile_no_decoder_reads_fails_its_slide(bach_tiff, tmp_path):
    damaged = tmp_path / "garbage.tif"
    _damaged_copy(bach_tiff, damaged, 1, "garbage")
    messages, ring = _messages(damaged, np.array([(0, 0), (224, 0), (448, 0)]), 224, 224, batch=3)
    made = DeviceTiles(ring, "cpu", 224, decoder=make_decoder("host", "cpu"))
    with pytest.raises(UndecodableTile, match="cannot decode a native tile at level 0"):
        made.batch(messages[0]).tiles()


def test_pixels_off_the_host_decoders_send_the_slide_to_the_cpu_path(bach_tiff, caplog):
    """A GPU decoder whose pixels differ from libjpeg's (say it ignored the colour-space
    marker; 20 grey levels, past the measured IDCT bound) is caught on the slide's first stream: the readers are told to send that slide
    as finished tiles, and what is already in flight is decoded on the host."""
    xy = np.array([(x, 0) for x in range(0, 1400, 224)])
    messages, ring = _messages(bach_tiff, xy, 224, 224, batch=3)
    told = []

    def off(streams):
        return [torch.from_numpy(np.clip(fancy(s).astype(np.int16) + 20, 0, 255).astype(np.uint8)) for s in streams]

    made = DeviceTiles(ring, "cpu", 224, decoder=BatchDecoder("off", off), use_tiles=told.append)
    with caplog.at_level(logging.WARNING, logger="pathtwt.features.device_tiles"):
        tiles = torch.cat([made.batch(m).tiles() for m in messages])
    from pathtwt.wsi.slides import open_slide

    with open_slide(bach_tiff) as slide:
        assert max(_max_diff(a, b) for a, b in zip(tiles, slide.read_tiles(xy, 224, 0, 224))) == 0
    record = made.records[0]
    assert told == [0] and record.to_cpu and record.device == 0 and record.host > 0
    assert len([r for r in caplog.records if "differ from its host reference by 20" in r.getMessage()]) == 1


def test_levels_that_are_not_jpeg_tiled_come_as_finished_tiles(tmp_path):
    image = np.random.default_rng(1).integers(0, 256, (512, 512, 3), dtype=np.uint8)
    path = tmp_path / "lzw.tif"
    tifffile.imwrite(path, image, tile=(256, 256), compression="lzw", photometric="rgb",
                     resolution=(1e4 / 0.5, 1e4 / 0.5), resolutionunit="CENTIMETER")
    messages, ring = _messages(path, np.array([(0, 0), (256, 256)]), 256, 256, batch=2)
    assert [m.kind for m in messages] == ["tiles"]
    made = DeviceTiles(ring, "cpu", 256, decoder=make_decoder("host", "cpu"))
    tiles = made.batch(messages[0]).tiles().numpy()
    assert np.array_equal(tiles[0], image[:256, :256]) and np.array_equal(tiles[1], image[256:, 256:])
    # the slide's features file does not claim the GPU decoded it, and says why
    attrs = made.records[0].attrs("GPU (host, embedding process)", True, 0)
    assert attrs["decode"].startswith("CPU") and attrs["natives_decoded_device"] == 0
    assert attrs["decode_fallback"] == "level 0 is not a JPEG-tiled TIFF page: decoded by the reading processes"
    assert jpeg_streams.is_jpeg_tiled(tifffile.TiffFile(path).pages[0]) is False


def _standin(decode, **said):
    """A GPU decoder stand-in checked against libjpeg's fancy upsampling within 2 grey
    levels, decoding RGB JPEGs, unless ``said`` says otherwise."""
    return BatchDecoder("standin", decode, **{"tolerance": 2, "decodes_rgb": True, **said})


def _host_tiles(streams):
    return [torch.from_numpy(fancy(s)) for s in streams]


def _warnings(caplog, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


def test_rgb_jpeg_tiles_with_a_decoder_that_reads_them_as_ycbcr_go_to_the_cpu_path(cmu, caplog):
    """Aperio's tiles are RGB (Adobe transform 0): a decoder that takes every three-component
    JPEG for YCbCr never sees them; the slide goes to the CPU path in one line naming it."""
    from pathtwt.wsi.slides import open_slide

    xy = np.array([(0, 0), (448, 0), (896, 0), (0, 448)])
    messages, ring = _messages(cmu, xy, 448, 224, batch=2)
    assert [m.rgb for m in messages] == [int(np.count_nonzero(m.lengths)) for m in messages] != [0, 0]
    calls, told = [], []
    decoder = _standin(lambda streams: calls.append(len(streams)) or _host_tiles(streams), decodes_rgb=False)
    made = DeviceTiles(ring, "cpu", 224, decoder=decoder, use_tiles=told.append, slide_name=lambda j: "cmu.svs")
    with caplog.at_level(logging.WARNING, logger="pathtwt.features.device_tiles"):
        tiles = torch.cat([made.batch(m).tiles() for m in messages])
    with open_slide(cmu) as slide:
        assert max(_max_diff(a, b) for a, b in zip(tiles, slide.read_tiles(xy, 448, 0, 224))) == 0
    record = made.records[0]
    assert calls == [] and told == [0] and record.device == 0 and record.host == sum(len(m.fresh) for m in messages)
    (line,) = _warnings(caplog, "Adobe transform 0")
    assert line.startswith("cmu.svs: ") and "standin decoder reads as YCbCr" in line and "decoded on the CPU" in line
    assert "RGB JPEG tiles (Adobe transform 0)" in record.fallback()


def test_a_slide_whose_tiles_mix_rgb_and_ycbcr_goes_to_the_cpu_path(bach_tiff, tmp_path, caplog):
    """One tile carrying an Adobe marker (transform 0) among YCbCr ones: one decoder call
    cannot read both, and the first tile's check saw only one of them."""
    mixed = tmp_path / "mixed.tif"
    shutil.copy(bach_tiff, mixed)
    with tifffile.TiffFile(mixed) as tif:
        offset = int(tif.pages[0].dataoffsets[1])
    with open(mixed, "r+b") as fh:
        fh.seek(offset + 2)
        assert fh.read(4) == b"\xff\xe0\x00\x10"  # the tile's JFIF APP0: 18 bytes, becomes an APP14 of 18
        fh.seek(offset + 2)
        fh.write(b"\xff\xee\x00\x10Adobe\x00\x64\x00\x00\x00\x00\x00\x00\x00")
    messages, ring = _messages(mixed, np.array([(0, 0), (256, 0), (0, 256)]), 224, 224, batch=1)
    assert [m.rgb for m in messages] == [0, 1, 0]
    told = []
    made = DeviceTiles(ring, "cpu", 224, decoder=_standin(_host_tiles), use_tiles=told.append)
    with caplog.at_level(logging.WARNING, logger="pathtwt.features.device_tiles"):
        for m in messages:
            made.batch(m).tiles()
    (line,) = _warnings(caplog, "mix RGB and YCbCr")
    assert line.startswith("slide 0: ") and told == [0]
    record = made.records[0]
    assert record.to_cpu and record.device == 1 and record.host == sum(len(m.fresh) for m in messages[1:])


def test_running_out_of_memory_while_decoding_halves_the_batch(bach_tiff, capsys):
    xy = np.array([(x, y) for y in (0, 224) for x in range(0, 1400, 224)])
    messages, ring = _messages(bach_tiff, xy, 224, 224, batch=12)
    whole = DeviceTiles(ring, "cpu", 224, decoder=_standin(_host_tiles))
    want = torch.cat([whole.batch(m).tiles() for m in messages])

    def small(streams):  # a GPU that holds two decoded tiles at a time
        if len(streams) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 MiB")
        return _host_tiles(streams)

    made = DeviceTiles(ring, "cpu", 224, decoder=_standin(small))
    got = torch.cat([made.batch(m).tiles() for m in messages])
    size = made.steps.size  # 14 native tiles: 7, then 3, then 1 a call
    assert torch.equal(got, want) and size == 1
    assert made.records[0].device == whole.records[0].device  # nothing counted twice by the retries
    made.steps.say()
    made.steps.say()
    (line,) = capsys.readouterr().err.splitlines()
    assert "out of memory decoding a batch of JPEG streams; going on with 1 tiles per pass" in line


def test_index_arrays_without_room_in_the_slot_are_copied_from_plain_memory(bach_tiff, monkeypatch):
    xy = np.array([(x, 0) for x in range(0, 1400, 224)])
    messages, ring = _messages(bach_tiff, xy, 224, 224, batch=3)
    made = DeviceTiles(ring, "cpu", 224, decoder=_standin(_host_tiles))
    want = torch.cat([made.batch(m).tiles() for m in messages])
    monkeypatch.setattr(DeviceTiles, "_tail", lambda self, msg: np.zeros(0, np.int32))
    made = DeviceTiles(ring, "cpu", 224, decoder=_standin(_host_tiles))
    assert torch.equal(torch.cat([made.batch(m).tiles() for m in messages]), want)


def test_what_a_slide_records_of_where_its_tiles_were_decoded():
    from pathtwt.features.device_tiles import SlideDecode

    gpu = "GPU (nvimgcodec, embedding process)"
    assert SlideDecode(device=40).attrs(gpu, True, 0) == {
        "decode": gpu, "natives_decoded_device": 40, "natives_decoded_host": 0, "decode_fallback": ""}
    refused = SlideDecode(device=38, host=2, refused=2).attrs(gpu, True, 0)
    assert refused["decode"].startswith(gpu + " for 38 native tiles, CPU for the rest")
    assert refused["decode_fallback"] == "the GPU decoder refused 2 JPEG stream(s), decoded on the host"
    moved = SlideDecode(host=9, to_cpu=True, reasons=["why"]).attrs(gpu, True, 31)
    assert moved["decode"].startswith("CPU") and moved["natives_decoded_host"] == 40 and moved["decode_fallback"] == "why"
    cpu = SlideDecode().attrs("CPU (reading processes)", False, 12)
    assert cpu == {"decode": "CPU (reading processes)", "natives_decoded_device": 0, "natives_decoded_host": 12,
                   "decode_fallback": ""}


def test_a_decoders_batch_is_viewed_whole_and_anything_else_is_stacked():
    """The rows of one tensor, in order (how gpu_decoders hands back a batch), become that
    tensor again without a copy, under inference mode too (which keeps no ``_base``); rows
    out of order, a row of another tensor, or rows of a larger tensor are not one block,
    and are stacked into the caller's rows. The pixels are the same either way."""
    from pathtwt.features.gpu_decoders import as_block, place

    def same_storage(a, b):
        return a.untyped_storage()._cdata == b.untyped_storage()._cdata

    batch = torch.arange(4 * 2 * 2 * 3, dtype=torch.int64).to(torch.uint8).view(4, 2, 2, 3)
    rows = list(batch.unbind(0))
    whole = as_block(rows)
    assert same_storage(whole, batch) and torch.equal(whole, batch)
    other = torch.zeros(2, 2, 3, dtype=torch.uint8)
    for tiles in (rows[::-1], [*rows[:3], other], list(batch[:3].unbind(0))):
        assert as_block(tiles) is None
        out = torch.empty((len(tiles), 2, 2, 3), dtype=torch.uint8)
        assert place(tiles, out) == [True] * len(tiles) and torch.equal(out, torch.stack(tiles))
    # a tile of another shape is handed back to be fitted, a missing one stays None
    out = torch.zeros((3, 2, 2, 3), dtype=torch.uint8)
    odd = torch.ones((1, 2, 3), dtype=torch.uint8)
    placed = place([rows[0], odd, None], out)
    assert placed[0] is True and placed[1] is odd and placed[2] is None and torch.equal(out[0], rows[0])


# ---- the third reading: precision, memory, parts -------------------------------------

def test_tiles_are_cut_and_shrunk_in_fp32_inside_the_jobs_bf16_autocast(bach_tiff):
    """A bf16 job (an H100's or H200's) makes its tiles inside its autocast: the batch's
    pixels are those made outside autocast, and the CPU reader's (cv2) within the resize
    bound, at a fractional and a whole factor. Under autocast the resize's matmuls would
    run in bf16 and move pixels by up to 2 grey levels."""
    from pathtwt.wsi.slides import open_slide

    assert torch.is_autocast_enabled("cpu")  # the job's context (the fixture)
    for side, limit in ((267, 1), (448, 0)):
        xy = np.array([(x, y) for y in (0, side) for x in range(0, 2800 - side, side)])[:12]
        messages, ring = _messages(bach_tiff, xy, side, 224, batch=12)
        made = DeviceTiles(ring, "cpu", 224, decoder=_standin(_host_tiles))
        inside = torch.cat([made.batch(m).tiles() for m in messages])
        with torch.autocast("cpu", enabled=False):
            plain = DeviceTiles(ring, "cpu", 224, decoder=_standin(_host_tiles))
            outside = torch.cat([plain.batch(m).tiles() for m in messages])
        assert torch.equal(inside, outside), (side, int((inside != outside).sum()))
        with open_slide(bach_tiff) as slide:
            assert _max_diff(inside, slide.read_tiles(xy, side, 0, 224)) <= limit, side


def test_the_fp32_context_turns_tf32_off_for_the_pixels_only():
    from pathtwt.models.precision import exact_fp32

    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True  # an Ampere-or-later job's choice for its forward passes
    try:
        with exact_fp32("cuda"):
            assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.cuda.matmul.allow_tf32 is True
        with exact_fp32("cpu"):
            assert not torch.is_autocast_enabled("cpu")
            assert torch.backends.cuda.matmul.allow_tf32 is True  # a CPU's matmuls have no TF32
        assert torch.is_autocast_enabled("cpu")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


class LiveTiles:
    """A GPU decoder stand-in that counts the bytes of its decoded tiles still alive (a
    call's tiles are one array, alive until its last row is dropped). With ``cap`` (bytes)
    it gives no image, as nvImageCodec does for an Image it cannot allocate, for the
    streams beyond what fits; a stream in ``bad`` it never decodes."""

    def __init__(self, cap: int | None = None, bad=()) -> None:
        self.cap, self.bad = cap, set(bad)
        self.live = self.peak = 0
        self.calls: list[int] = []

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes

    def __call__(self, streams):
        import weakref

        self.calls.append(len(streams))
        good = [k for k, s in enumerate(streams) if bytes(s) not in self.bad]
        if self.cap is not None and good:
            good = good[:max(0, (self.cap - self.live) // fancy(streams[good[0]]).nbytes)]
        if not good:
            return [None] * len(streams)
        block = np.stack([fancy(streams[k]) for k in good])
        self.live += block.nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(block, self._freed, block.nbytes)
        rows = dict(zip(good, torch.from_numpy(block).unbind(0)))
        return [rows.get(k) for k in range(len(streams))]


def test_decoding_in_parts_lowers_the_peak_of_decoded_tiles(bach_tiff):
    """Each part of a batch is decoded into the stack and freed before the next: k parts
    hold at most 1/k of the batch's decoded tiles beside the stack."""
    xy = np.array([(x, y) for y in (0, 224, 448) for x in range(0, 1400, 224)])
    messages, ring = _messages(bach_tiff, xy, 224, 224, batch=len(xy))
    (msg,) = messages
    fresh = len(msg.fresh)
    tile = 256 * 256 * 3
    peaks, batches = {}, {}
    for k in (1, 2, 4):
        decoder = LiveTiles()
        made = DeviceTiles(ring, "cpu", 224, decoder=_standin(decoder))
        made.steps.size = None if k == 1 else -(-fresh // k)
        batches[k] = made.batch(msg).tiles()
        peaks[k] = decoder.peak
        assert decoder.live == 0 and len(decoder.calls) == k
    assert peaks[1] == fresh * tile, peaks
    for k in (2, 4):
        assert peaks[k] <= -(-fresh // k) * tile, peaks
        assert torch.equal(batches[k], batches[1])


def test_a_decoder_that_gives_no_image_for_lack_of_memory_steps_down_and_refused_streams_go_to_the_host(
        bach_tiff, caplog, capsys):
    """A GPU that holds 4 decoded tiles: the decoder gives no image for the rest of a batch
    (as nvImageCodec does when it cannot allocate). Those are decoded again in smaller
    calls, on the device, and the job steps down, saying it ran out of memory. A stream it gives no image for even alone
    is refused: decoded on the host, counted, said once."""
    from pathtwt.wsi.slides import open_slide

    xy = np.array([(x, y) for y in (0, 224) for x in range(0, 1400, 224)])
    messages, ring = _messages(bach_tiff, xy, 224, 224, batch=len(xy))
    (msg,) = messages
    streams = _streams(msg, ring)
    capped = LiveTiles(cap=4 * 256 * 256 * 3, bad=[bytes(streams[5])])
    made = DeviceTiles(ring, "cpu", 224, decoder=_standin(capped))
    with caplog.at_level(logging.WARNING, logger="pathtwt.features.device_tiles"):
        tiles = made.batch(msg).tiles()
    with open_slide(bach_tiff) as slide:
        assert _max_diff(tiles, slide.read_tiles(xy, 224, 0, 224)) == 0
    record = made.records[0]
    assert (record.device, record.refused, record.host) == (len(streams) - 1, 1, 1)
    assert capped.calls[0] == len(streams) and max(capped.calls[1:]) <= len(streams) // 2
    assert made.steps.size == len(streams) // 2  # the parts halved
    made.steps.say()
    (line,) = capsys.readouterr().err.splitlines()
    assert "ran out of memory decoding a batch of JPEG streams (the GPU decoder gave no image for" in line
    (refused,) = _warnings(caplog, "refused")
    assert "even when given it alone" in refused and "not for lack of memory" in refused


def test_a_step_down_gives_back_what_the_decoder_keeps(bach_tiff):
    """Out of memory in decoding: the decoder drops the buffers it keeps and trims its
    memory pool (release with trim) before the smaller parts run."""
    xy = np.array([(x, 0) for x in range(0, 1400, 224)])
    messages, ring = _messages(bach_tiff, xy, 224, 224, batch=len(xy))
    events = []

    def small(streams):
        events.append(len(streams))
        if len(streams) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 MiB")
        return _host_tiles(streams)

    made = DeviceTiles(ring, "cpu", 224, decoder=_standin(small, release=lambda trim: events.append(("release", trim))))
    made.batch(messages[0])
    assert events[:2] == [len(messages[0].fresh), ("release", True)] and made.steps.size <= 2
    made.close()  # the job ends
    assert events[-1] == ("release", False)


def test_refused_streams_cross_to_the_device_in_one_copy_per_batch(bach_tiff):
    """On PyTorch's meta device (nothing computed): a batch whose decoder refuses several
    streams copies host memory to the device twice, its index arrays and its host-decoded
    tiles, however many were refused."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class HostCopies(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func._overloadpacket in (torch.ops.aten.to, torch.ops.aten._to_copy) and \
                    args[0].device.type == "cpu" and str(kwargs.get("device")) == "meta":
                HostCopies.count += 1
            return func(*args, **kwargs)

    xy = np.array([(x, 0) for x in range(0, 1400, 224)])
    messages, ring = _messages(bach_tiff, xy, 224, 224, batch=len(xy))
    (msg,) = messages
    bad = {bytes(s) for s in _streams(msg, ring)[1::2]}
    assert len(bad) >= 3

    def refusing(streams):
        return [None if bytes(s) in bad else torch.empty((256, 256, 3), dtype=torch.uint8, device="meta")
                for s in streams]

    made = DeviceTiles(ring, "meta", 224, decoder=BatchDecoder("refusing", refusing, is_host=True))
    with HostCopies():
        made.batch(msg)
    assert made.records[0].refused == len(bad) and HostCopies.count == 2
