"""Damaged slides for reliability tests: a valid pyramid whose middle level-0 tile holds
bytes no JPEG decoder accepts, as a failing disk or an interrupted copy leaves them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from pathtwt.io.atomic import atomic_output


def corrupt_middle_tile(path: str | os.PathLike, *, seed: int = 0) -> tuple[int, int]:
    """Overwrite the compressed bytes of the level-0 tile nearest the slide centre with
    noise (the file layout is unchanged); return that tile's level-0 (x, y)."""
    import tifffile

    path = Path(path)
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        across = -(-page.imagewidth // page.tilewidth)
        down = -(-page.imagelength // page.tilelength)
        row, col = down // 2, across // 2
        index = row * across + col
        offset, count = int(page.dataoffsets[index]), int(page.databytecounts[index])
    noise = np.random.default_rng(seed).integers(0, 256, count, dtype=np.uint8).tobytes()
    with atomic_output(path) as tmp:
        shutil.copyfile(path, tmp)
        with open(tmp, "r+b") as fh:
            fh.seek(offset)
            fh.write(noise)
    return col * page.tilewidth, row * page.tilelength
