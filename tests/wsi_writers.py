"""Small whole-slide files in the layouts of the vendors' formats, written with tifffile
for the format and reliability tests (helpers, not tests)."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import tifffile

# Hamamatsu NDPI private tags: format flag, source lens (magnification), x/y/z offsets.
NDPI_TAGS = [(65420, 4, 1, 1, True), (65421, 11, 1, 20.0, True), (65422, 9, 1, 0, True),
             (65423, 9, 1, 0, True), (65424, 9, 1, 0, True)]


def he_image(width: int, height: int, seed: int = 0) -> np.ndarray:
    """RGB uint8: pink/purple tissue islands with nuclei-like texture on pale glass."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((height, width), np.uint8)
    for _ in range(3):
        centre = (int(rng.integers(width // 4, 3 * width // 4)), int(rng.integers(height // 4, 3 * height // 4)))
        axes = (int(width * rng.uniform(0.15, 0.3)), int(height * rng.uniform(0.15, 0.3)))
        cv2.ellipse(mask, centre, axes, float(rng.uniform(0, 180)), 0, 360, 1, -1)
    image = np.full((height, width, 3), 240, np.uint8)
    image -= rng.integers(0, 6, (height, width, 1), dtype=np.uint8)
    # smooth texture (blurred noise) so JPEG keeps it and resampling differences stay small
    texture = cv2.GaussianBlur(rng.normal(0, 1, (height, width)).astype(np.float32), (0, 0), 3)
    texture = (texture / (texture.std() + 1e-6) * 25).clip(-60, 60)
    tissue = np.stack([200 + texture * 0.5, 110 + texture, 170 + texture * 0.6], axis=-1)
    image[mask.astype(bool)] = tissue[mask.astype(bool)].clip(0, 255).astype(np.uint8)
    return image


def pyramid(level0: np.ndarray, downsamples: tuple[int, ...] = (1, 4, 16)) -> list[np.ndarray]:
    h, w = level0.shape[:2]
    return [level0 if d == 1 else cv2.resize(level0, (w // d, h // d), interpolation=cv2.INTER_AREA) for d in downsamples]


def _resolution(mpp: float, ds: float) -> dict:
    return {"resolution": (1e4 / (mpp * ds),) * 2, "resolutionunit": "CENTIMETER"}


def write_generic_tiff(path: Path, levels: list[np.ndarray], mpp: float, *, compression: str | None = "jpeg",
                       tile: int = 256) -> Path:
    """Generic tiled pyramidal TIFF: one tiled page per level in the main IFD chain."""
    with tifffile.TiffWriter(path) as tif:
        for i, level in enumerate(levels):
            ds = levels[0].shape[1] / level.shape[1]
            tif.write(level, tile=(tile, tile), compression=compression, photometric="rgb",
                      subfiletype=int(i > 0), **_resolution(mpp, ds))
    return path


def write_svs(path: Path, levels: list[np.ndarray], mpp: float, *, jpeg2000: bool = False) -> Path:
    """Aperio SVS layout: tiled level 0 with an 'Aperio Image Library' description, a
    stripped thumbnail as the second page, then the tiled reduced levels. JPEG, or
    Aperio's JPEG 2000 (compression 33005, RGB) with ``jpeg2000``."""
    h0, w0 = levels[0].shape[:2]
    codec, label = (33005, "J2K/KDU") if jpeg2000 else ("jpeg", "JPEG/RGB")
    head = f"Aperio Image Library v12.0.15\r\n{w0}x{h0} [0,0 {w0}x{h0}] (256x256) {label} Q=90"
    thumb = cv2.resize(levels[0], (max(1, w0 // 32), max(1, h0 // 32)), interpolation=cv2.INTER_AREA)
    pages = [(levels[0], True)] + [(thumb, False)] + [(level, True) for level in levels[1:]]
    with tifffile.TiffWriter(path) as tif:
        for i, (image, tiled) in enumerate(pages):
            size = "" if i == 0 else f" -> {image.shape[1]}x{image.shape[0]} -"
            tif.write(image, tile=(256, 256) if tiled else None, compression=codec if tiled else "jpeg",
                      photometric="rgb", metadata=None, description=f"{head}{size} |AppMag = 20|MPP = {mpp}")
    return path


def write_ndpi_like(path: Path, levels: list[np.ndarray], mpp: float) -> Path:
    """Hamamatsu NDPI layout in a classic (32-bit offset) TIFF: every level one JPEG
    strip, no tiling, tagged with the NDPI format flag and source lens. OpenSlide reads it
    with its Hamamatsu driver and, as with real NDPI files, adds levels it decodes with
    JPEG scaling; tiffslide (tifffile) sees only the full-resolution level. Real NDPI
    files also carry the high halves of 64-bit offsets, which nothing here can write."""
    with tifffile.TiffWriter(path) as tif:
        for level in levels:
            ds = levels[0].shape[1] / level.shape[1]
            tif.write(level, compression="jpeg", photometric="rgb", rowsperstrip=level.shape[0],
                      extratags=NDPI_TAGS, metadata=None, **_resolution(mpp, ds))
    return path


def write_ome_tiff(path: Path, levels: list[np.ndarray], mpp: float) -> Path:
    """OME-TIFF with the reduced levels in SubIFDs of level 0 (the OME pyramid layout)."""
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(levels[0], subifds=len(levels) - 1, tile=(256, 256), compression="jpeg", photometric="rgb",
                  metadata={"axes": "YXS", "PhysicalSizeX": mpp, "PhysicalSizeY": mpp}, **_resolution(mpp, 1))
        for level in levels[1:]:
            ds = levels[0].shape[1] / level.shape[1]
            tif.write(level, subfiletype=1, tile=(256, 256), compression="jpeg", photometric="rgb",
                      **_resolution(mpp, ds))
    return path


def corrupt_tile(path: Path, *, page: int, index: int, seed: int = 0) -> None:
    """Overwrite the compressed bytes of tile ``index`` of ``page`` with noise (the file
    layout, offsets and byte counts are unchanged), as a failing disk leaves them."""
    with tifffile.TiffFile(path) as tif:
        offset, count = int(tif.pages[page].dataoffsets[index]), int(tif.pages[page].databytecounts[index])
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(np.random.default_rng(seed).integers(0, 256, count, dtype=np.uint8).tobytes())


def _encoded_tile(tile: np.ndarray, **options) -> bytes:
    """The compressed bytes tifffile stores for ``tile`` (one-tile TIFF in memory)."""
    import io

    buffer = io.BytesIO()
    tifffile.imwrite(buffer, tile, tile=tile.shape[:2], **options)
    buffer.seek(0)
    with tifffile.TiffFile(buffer) as tif:
        page = tif.pages[0]
        buffer.seek(page.dataoffsets[0])
        return buffer.read(page.databytecounts[0])


def write_sparse_giant(path: Path, *, side: int, mpp: float, tissue: dict[tuple[int, int], np.ndarray],
                       tile: int = 1024, downsamples: tuple[int, ...] = (1, 4, 16, 64)) -> Path:
    """A ``side`` x ``side`` pyramidal JPEG TIFF, blank white except the level-0 tiles
    given in ``tissue`` ((col, row) -> RGB tile); reduced levels hold those tiles' area
    averages. Every blank tile of a level points at one stored blank JPEG (TIFF allows
    tiles to share bytes), so the file is a few MB and written in seconds at any size."""
    options = {"compression": "jpeg", "photometric": "rgb"}
    blank = _encoded_tile(np.full((tile, tile, 3), 255, np.uint8), **options)
    levels = []
    with tifffile.TiffWriter(path, bigtiff=True) as tif:
        for i, ds in enumerate(downsamples):
            level_side = side // ds
            n = -(-level_side // tile)
            content: dict[tuple[int, int], np.ndarray] = {}
            for (col, row), pixels in tissue.items():
                small = pixels if ds == 1 else cv2.resize(pixels, (tile // ds, tile // ds), interpolation=cv2.INTER_AREA)
                x, y = col * tile // ds, row * tile // ds
                canvas = content.setdefault((x // tile, y // tile), np.full((tile, tile, 3), 255, np.uint8))
                canvas[y % tile : y % tile + small.shape[0], x % tile : x % tile + small.shape[1]] = small

            def tiles(n=n, content=content):
                # the first tile carries the shared blank bytes; other blank tiles are empty for now
                for k in range(n * n):
                    c, r = k % n, k // n
                    yield _encoded_tile(content[(c, r)], **options) if (c, r) in content else (blank if k == 0 else b"")

            levels.append(set(r * n + c for c, r in content))
            tif.write(tiles(), shape=(level_side, level_side, 3), dtype=np.uint8, tile=(tile, tile),
                      subfiletype=int(i > 0), metadata=None, **options, **_resolution(mpp, ds))
    with tifffile.TiffFile(path, mode="r+b") as tif:
        for page, stored in zip(tif.pages, levels):
            offsets, counts = list(page.dataoffsets), list(page.databytecounts)
            first_blank = 0 if 0 not in stored else None
            if first_blank is None:
                continue  # tile 0 holds tissue: no blank tile to share
            shared = (offsets[0], counts[0])
            for k in range(len(offsets)):
                if counts[k] == 0:
                    offsets[k], counts[k] = shared
            page.tags["TileOffsets"].overwrite(offsets)
            page.tags["TileByteCounts"].overwrite(counts)
    return path


def fluorescence_channels(width: int, height: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(channels uint8 (height, width, 3), tissue mask bool): a fluorescence scan of
    DAPI-like nuclei (channel 0), a dim cytoplasm stain (channel 1) and a sparse marker
    (channel 2) on a black background with low sensor noise, as scanners store it."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((height, width), np.uint8)
    cv2.ellipse(mask, (width // 2, height // 2), (width // 4, height // 4), 20.0, 0, 360, 1, -1)
    tissue = mask.astype(bool)
    channels = rng.integers(0, 7, (height, width, 3), dtype=np.uint8)  # noise of the dark background
    cytoplasm = cv2.GaussianBlur(rng.normal(0, 1, (height, width)).astype(np.float32), (0, 0), 4)
    cytoplasm = 60 + cytoplasm / (cytoplasm.std() + 1e-6) * 12
    channels[..., 1][tissue] = cytoplasm[tissue].clip(0, 255).astype(np.uint8)
    nuclei = np.zeros((height, width), np.uint8)
    ys, xs = np.nonzero(tissue)
    for k in rng.choice(len(xs), size=max(1, len(xs) // 400), replace=False):
        cv2.circle(nuclei, (int(xs[k]), int(ys[k])), 3, 220, -1)
    channels[..., 0] = np.maximum(channels[..., 0], nuclei * tissue)
    marker = (rng.random((height, width)) < 0.01) & tissue
    channels[..., 2][marker] = 180
    return channels, tissue


def write_channel_pages(path: Path, channels: np.ndarray, mpp: float, *, levels: int = 3) -> Path:
    """OME-TIFF with one page per channel (axes CYX, as QPTIFF and Bio-Formats exports
    store fluorescence), the reduced levels in SubIFDs."""
    planes = np.ascontiguousarray(np.moveaxis(channels, -1, 0))
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(planes, subifds=levels - 1, tile=(256, 256), photometric="minisblack", compression="zlib",
                  metadata={"axes": "CYX", "PhysicalSizeX": mpp, "PhysicalSizeY": mpp}, **_resolution(mpp, 1))
        for i in range(1, levels):
            ds = 4 ** i
            small = np.stack([cv2.resize(p, (p.shape[1] // ds, p.shape[0] // ds), interpolation=cv2.INTER_AREA)
                              for p in planes])
            tif.write(small, subfiletype=1, tile=(256, 256), photometric="minisblack", compression="zlib",
                      **_resolution(mpp, ds))
    return path


def write_ome_zarr(path: str | os.PathLike, levels: list[np.ndarray], mpp: float | None, *, chunk: int = 256,
                   version: str = "0.4") -> Path:
    """Write RGB uint8 (h, w, 3) ``levels`` (finest first, each a whole factor of level 0)
    as an NGFF image (axes c, y, x, pixel size ``mpp`` micrometres or none): version 0.4 in
    zarr v2, 0.5 in zarr v3 (metadata under "ome"). The folder appears whole (written
    beside it, then renamed)."""
    import shutil

    import zarr

    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    v3 = version == "0.5"
    root = zarr.open_group(str(tmp), mode="w", zarr_format=3 if v3 else 2)
    datasets = []
    for i, level in enumerate(levels):
        factor = levels[0].shape[1] / level.shape[1]
        data = np.ascontiguousarray(np.moveaxis(np.asarray(level, np.uint8), -1, 0))
        arr = root.create_array(str(i), shape=data.shape, chunks=(3, chunk, chunk), dtype="uint8",
                                **({"dimension_names": ["c", "y", "x"]} if v3 else {}))
        arr[...] = data
        scale = [1.0, (mpp or 1.0) * factor, (mpp or 1.0) * factor]
        datasets.append({"path": str(i), "coordinateTransformations": [{"type": "scale", "scale": scale}]})
    unit = {"unit": "micrometer"} if mpp is not None else {}
    multiscales = [{
        "name": path.name, "datasets": datasets,
        "axes": [{"name": "c", "type": "channel"}, {"name": "y", "type": "space", **unit},
                 {"name": "x", "type": "space", **unit}],
    }]
    if v3:
        root.attrs["ome"] = {"version": version, "multiscales": multiscales}
    else:
        multiscales[0]["version"] = version
        root.attrs["multiscales"] = multiscales
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path

