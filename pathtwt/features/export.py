"""A folder of pathtwt features files in the layout another tool trains on.

* ``clam-pt``: CLAM's ``OUT/pt_files/{slide}.pt`` (a float32 (N, D) tensor saved with
  ``torch.save``, what CLAM's ``Generic_MIL_Dataset`` loads) and ``OUT/h5_files/{slide}.h5``
  (``features`` and ``coords``, its ``--use_h5`` and heatmap input; pathtwt's file as it is).
* ``stamp``: STAMP's ``OUT/{slide}.h5`` with ``feats`` float32 (N, D) and ``coords`` float
  (N, 2) in micrometres (level-0 pixels x level-0 mpp), attrs ``unit`` = "um",
  ``tile_size_um``, ``tile_size_px``, ``extractor`` and ``feat_type`` = "tile".

Slides whose extraction failed or that have no tiles are left out (neither tool accepts an
empty bag) and listed in the summary. Every file is written atomically.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from pathtwt.errors import PathtwtError
from pathtwt.io.atomic import atomic_output
from pathtwt.io.h5 import read_features
from pathtwt.io.h5_writer import writing_h5

FORMATS = ("clam-pt", "stamp")


def features_folder_files(folder: str | os.PathLike) -> list[Path]:
    folder = Path(folder)
    if not folder.is_dir():
        raise PathtwtError(f"{folder}: features folder not found; give the folder `pathtwt extract` wrote")
    files = [p for p in sorted(folder.glob("*.h5")) if not p.name.startswith(".")]
    if not files:
        raise PathtwtError(f"{folder}: no features files (*.h5) in this folder")
    return files


def export_features(features_dir: str | os.PathLike, out: str | os.PathLike, fmt: str) -> dict[str, Any]:
    """Export every features file of ``features_dir`` to ``out`` in format ``fmt``."""
    if fmt not in FORMATS:
        raise PathtwtError(f"export format {fmt!r} is unknown; use one of {', '.join(FORMATS)}")
    out = Path(out)
    written, skipped = [], {}
    for path in features_folder_files(features_dir):
        feats, coords, attrs = read_features(path)
        status = str(attrs.get("status", "ok"))
        if status != "ok" or len(feats) == 0:
            skipped[path.stem] = f"status {status}, {len(feats)} tiles"
            continue
        if fmt == "clam-pt":
            write_clam(path, feats, out)
        else:
            write_stamp(path, feats, coords, attrs, out / f"{path.stem}.h5")
        written.append(path.stem)
    return {"format": fmt, "out": str(out), "written": len(written), "skipped": skipped}


def write_clam(source: Path, feats: np.ndarray, out: Path) -> None:
    import torch

    with atomic_output(out / "pt_files" / f"{source.stem}.pt") as tmp:
        torch.save(torch.from_numpy(np.ascontiguousarray(feats, dtype=np.float32)), tmp)
    with atomic_output(out / "h5_files" / source.name) as tmp:
        shutil.copyfile(source, tmp)


def stamp_geometry(source: Path, attrs: dict[str, Any]) -> tuple[float, float, int]:
    """(level-0 mpp, tile side in um, tile side in px) from a features file's attrs."""
    missing = [k for k in ("level0_mpp", "patch_size_level0", "patch_size") if k not in attrs]
    if missing:
        raise PathtwtError(
            f"{source}: features file lacks the tile geometry {missing} that STAMP's micrometre "
            "coordinates need; re-extract it with this version of `pathtwt extract`"
        )
    mpp = float(attrs["level0_mpp"])
    if not mpp > 0:
        raise PathtwtError(f"{source}: level0_mpp is {mpp}; STAMP needs the slide's microns per pixel")
    return mpp, int(attrs["patch_size_level0"]) * mpp, int(attrs["patch_size"])


def write_stamp(source: Path, feats: np.ndarray, coords: np.ndarray, attrs: dict[str, Any], target: Path) -> None:
    mpp, tile_um, tile_px = stamp_geometry(source, attrs)
    with atomic_output(target) as tmp:
        with writing_h5(tmp) as h5:
            h5.create_dataset("feats", data=np.asarray(feats, dtype=np.float32))
            h5.create_dataset("coords", data=np.asarray(coords, dtype=np.float64) * mpp)
            h5.attrs["unit"] = "um"
            h5.attrs["tile_size_um"] = float(tile_um)
            h5.attrs["tile_size_px"] = int(tile_px)
            h5.attrs["extractor"] = str(attrs.get("encoder") or attrs.get("backbone", ""))
            h5.attrs["feat_type"] = "tile"
            h5.attrs["embedding_recipe"] = str(attrs.get("embedding_recipe", ""))
            h5.attrs["source"] = str(source)
