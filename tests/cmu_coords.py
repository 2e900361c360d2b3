"""Coords files over the real CMU-1-Small-Region.svs (2220 x 2967 px at 0.499 um/px) for the
extraction tests: 448 level-0 px squares read at level 0 and shrunk to 224 px."""

from __future__ import annotations

import numpy as np

from pathtwt.io import h5 as h5io

CMU = "CMU-1-Small-Region.svs"
# every whole 448 px square of the slide, row by row
GRID = [(x, y) for y in range(0, 2967 - 448 + 1, 448) for x in range(0, 2220 - 448 + 1, 448)]


def write_cmu_coords(path, slide, xy, status="ok"):
    attrs = dict(patch_size=224, patch_size_level0=448, target_mpp=1.0, level0_mpp=0.499, read_level=0,
                 level0_width=2220, level0_height=2967, target_magnification=10, status=status, slide_path=str(slide))
    h5io.write_coords(path, np.array(xy, dtype=np.int64).reshape(-1, 2), np.ones(len(xy)), attrs)
    return path
