"""Tiling one slide into its coords file: the use-case behind ``pathtwt tile`` and the
tiling step of ``pathtwt predict``.

A :class:`TileRequest` says how the tiles are chosen and the slide is opened;
:func:`write_tiles` opens the slide, finds its tissue tiles (inside its regions of
interest where given), writes the thumbnail and then the coords file (the file a workflow
waits for, so it appears last); :func:`write_failed` writes the coords file of a slide that
cannot be read, so a cohort's run goes on without it.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from pathtwt.errors import PathtwtError, SlideError
from pathtwt.wsi.tiling import TILING_DEFAULTS, Tiling
from pathtwt.wsi.tissue import TissueParams


@dataclass(frozen=True)
class TileRequest:
    """How to tile a slide (the options of ``pathtwt tile`` but the files)."""

    mpp: float = TILING_DEFAULTS.target_mpp  # target microns per pixel of the tiles
    tile_size: int = TILING_DEFAULTS.tile_size  # tile side in pixels at ``mpp``
    tissue: str = TILING_DEFAULTS.tissue  # "fraction" or "otsu"
    min_tissue: float | None = TILING_DEFAULTS.min_tissue  # None: the filter's default
    slide_mpp: float | None = None  # level-0 um/px where the slide's metadata has none
    mask_mpp: float = TissueParams.mask_mpp  # resolution of the tissue mask
    reader: str = "auto"
    channels: str | None = None  # "I,J,K": the channels shown as R, G, B (fluorescence)
    modality: str | None = None  # None: fluorescence with channels, else brightfield
    allow_upsample: bool = TILING_DEFAULTS.allow_upsample
    roi: str | None = None  # QuPath GeoJSON of the regions to tile

    def check(self) -> None:
        if self.tile_size < 1 or self.mpp <= 0 or self.mask_mpp <= 0:
            raise PathtwtError("--tile-size, --mpp and --mask-mpp must be positive")


def write_tiles(request: TileRequest, slide_path: str | os.PathLike, out: str | os.PathLike,
                thumbnail: str | os.PathLike | None = None) -> Tiling:
    """Tile ``slide_path`` as ``request`` says and write the coords file ``out`` (and the
    ``thumbnail`` PNG); returns the :class:`~pathtwt.wsi.tiling.Tiling`. A slide that cannot
    be opened raises :class:`SlideError`; errors after it opened carry ``after_open``."""
    from pathtwt.io.h5 import write_coords
    from pathtwt.wsi.slides import open_slide
    from pathtwt.wsi.thumbnail import write_thumbnail
    from pathtwt.wsi.tiling import UPSAMPLE_TOLERANCE, tile_slide

    request.check()
    channels = request.channels
    if request.modality == "fluorescence" and not channels:
        channels = "0,1,2"
    roi = None
    if request.roi:
        from pathtwt.wsi.roi import read_roi

        roi = read_roi(request.roi)  # a bad file is refused before the slide is read
    slide = open_slide(slide_path, mpp_fallback=request.slide_mpp, reader=request.reader, channel_map=channels)
    try:
        with slide:
            tiling = tile_slide(
                slide, target_mpp=request.mpp, tile_size=request.tile_size, tissue=request.tissue,
                min_tissue=request.min_tissue, params=TissueParams(mask_mpp=request.mask_mpp),
                modality=request.modality, allow_upsample=request.allow_upsample,
            )
    except SlideError as exc:
        exc.after_open = True  # a tiling error, not an unreadable slide: never recorded as failed
        raise
    if roi is not None:
        from pathtwt.wsi.roi import apply_roi, check_in_slide

        if tiling.attrs["status"] == "ok":
            tiling = apply_roi(tiling, roi, slide_path)
        else:  # no tissue tile to choose from; the file must still belong to this slide
            check_in_slide(roi, tiling.attrs["level0_width"], tiling.attrs["level0_height"], slide_path)
    if tiling.attrs["upsample_factor"] > UPSAMPLE_TOLERANCE:
        print(
            f"pathtwt tile: warning: {slide_path}: tiles upsampled {tiling.attrs['upsample_factor']:.2f}x "
            f"(level 0 is {tiling.attrs['level0_mpp']:.4g} um/px, target {request.mpp:g}); recorded in {out}",
            file=sys.stderr,
        )
    # Thumbnail first: the coords file is the output the workflow waits for, so it
    # appears last, once everything else has succeeded.
    if thumbnail:
        write_thumbnail(thumbnail, tiling, regions=roi.regions if roi is not None else ())
    texts = {"roi": json.dumps(roi.to_geojson())} if roi is not None else None
    write_coords(out, tiling.coords, tiling.tissue_fraction, tiling.attrs, texts=texts)
    return tiling


def write_failed(request: TileRequest, slide_path: str | os.PathLike, out: str | os.PathLike,
                 thumbnail: str | os.PathLike | None, reason: str) -> None:
    """The coords file of a slide that cannot be read: no tiles, status "failed" and the
    reason, so the workflow goes on (the failures convention of `pathtwt extract`)."""
    import numpy as np

    from pathtwt.io.atomic import atomic_output
    from pathtwt.io.h5 import write_coords

    attrs = {
        "patch_size": int(request.tile_size), "patch_size_level0": 0, "target_mpp": float(request.mpp),
        "level0_mpp": float("nan"), "read_level": 0, "level0_width": 0, "level0_height": 0,
        "target_magnification": 0.0, "status": "failed", "slide_path": str(slide_path), "failure_reason": reason,
    }
    if thumbnail:  # a blank grey square: the workflow expects a thumbnail per slide
        from PIL import Image

        with atomic_output(Path(thumbnail)) as tmp:
            Image.new("RGB", (64, 64), (128, 128, 128)).save(tmp, format="PNG")
    write_coords(out, np.zeros((0, 2), np.int64), np.zeros(0, np.float32), attrs)
    print(f"pathtwt tile: warning: {slide_path}: recorded as failed ({reason}) -> {out}", file=sys.stderr)
