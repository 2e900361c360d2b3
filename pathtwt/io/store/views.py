"""A study's view of the store: folders in its results that hold symbolic links to the
entries it uses, laid out as the study's readers expect (the MIL heads read a folder of
``{slide}.h5``, the report ``models/``, ``discovery/``, ``tiles/`` and ``thumbnails/``),
so a reader of the study folder finds every file it used under the study's own names.

Each entry is checked as it is linked (its record against its key; a slide's features
against the tiles they were made from), so a study never reads an entry that was moved by
hand or corrupted. A view folder is built under a hidden name and renamed into place.
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
import time
from pathlib import Path
from typing import Any, Mapping

from pathtwt.errors import StoreError
from pathtwt.io.atomic import _fsync_dir
from pathtwt.io.store.layout import RECORD, Store
from pathtwt.io.store.records import read_checked


def link_folder(folder: str | os.PathLike, links: Mapping[str, str | os.PathLike]) -> None:
    """Make ``folder`` a folder of symbolic links (name -> absolute target), replacing what
    was there; built beside it under a hidden name and renamed into place."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    build = folder.with_name(f".{folder.name}.view-{os.getpid()}-{time.time_ns()}")
    build.mkdir()
    try:
        for name, target in links.items():
            os.symlink(os.path.abspath(target), build / name)
        if folder.is_symlink() or folder.is_file():
            folder.unlink()
        elif folder.exists():
            shutil.rmtree(folder)
        os.rename(build, folder)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    _fsync_dir(folder.parent)


def tiles_view(store: Store, tiles_folder: Path, thumbnails_folder: Path, slides: Mapping[str, str]) -> None:
    """``tiles/{cohort}/`` and ``thumbnails/{cohort}/`` of a study: ``slides`` is slide id ->
    tiles key; every entry's record is checked."""
    for key in dict.fromkeys(slides.values()):
        read_checked(store.tiles(key).record, kind="tiles", key=key)
    link_folder(tiles_folder, {f"{s}.h5": store.tiles(k).coords for s, k in slides.items()})
    link_folder(thumbnails_folder, {f"{s}.png": store.tiles(k).thumbnail for s, k in slides.items()})


def entry_view(folder: Path, entry: Path, kind: str) -> None:
    """A study's link folder of a folder entry (a model, a discovery): a link per file."""
    read_checked(entry / RECORD, kind=kind, key=entry.name)
    link_folder(folder, {p.name: p for p in sorted(entry.iterdir()) if not p.name.startswith(".")})


def features_view(store: Store, folder: Path, extractor: str, slides: Mapping[str, str],
                  failures: Path | None = None) -> list[dict[str, Any]]:
    """``features/{backbone}/{variant}/{cohort}/`` of a study: ``slides`` is slide id ->
    tiles key, each linked to its features entry by ``extractor`` after it is checked; with
    ``failures``, the cohort's failures table (the slides whose entry says it failed).
    Returns the failures."""
    record = read_checked(store.extractor(extractor) / RECORD, kind="extractor", key=extractor)
    failed = []
    for slide, key in slides.items():
        failure = check_features(store.features(extractor, key), key, record)
        if failure is not None:
            failed.append({"slide": slide, **failure})
    link_folder(folder, {f"{s}.h5": store.features(extractor, k) for s, k in slides.items()})
    if failures is not None:
        from pathtwt.io.failures import Failure, write_failures

        write_failures(failures, [Failure(f["slide"], "extract", f["reason"], f["time"]) for f in failed])
    return failed


def check_features(path: Path, tiles_key: str, extractor_record: Mapping[str, Any]) -> dict[str, str] | None:
    """Refuse (StoreError, one line) a slide's features entry that was not made from the
    tiles ``tiles_key`` or by the extractor's weights and recipe; its failure (reason, time)
    when it records one, else None."""
    import h5py

    try:
        with h5py.File(path, "r") as h5:
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in h5.attrs.items()}
    except FileNotFoundError:
        raise StoreError(f"{path}: features entry missing; run the workflow again to make it") from None
    except OSError as exc:
        raise StoreError(f"{path}: unreadable features entry ({exc}); delete it and run the workflow again") from None
    made_from = Path(str(attrs.get("coords_path", ""))).name
    if made_from != f"{tiles_key}.coords.h5":
        raise StoreError(f"{path}: made from the tiles {made_from or 'of no store entry'}, not {tiles_key} (moved by hand "
                         "or corrupted); delete it and run the workflow again")
    expected = extractor_record["inputs"]
    weights = ((expected.get("model") or {}).get("teacher") or {}).get("weights") or {}
    wrong = []
    if weights.get("sha256") and attrs.get("weights_sha256") and attrs["weights_sha256"] != weights["sha256"]:
        wrong.append(f"weights sha256 {str(attrs['weights_sha256'])[:12]} vs {weights['sha256'][:12]}")
    recipe = (expected.get("settings") or {}).get("embedding")
    if recipe and attrs.get("embedding_recipe") and attrs["embedding_recipe"] != recipe:
        wrong.append(f"embedding {attrs['embedding_recipe']} vs {recipe}")
    if wrong:
        raise StoreError(f"{path}: not what its extractor {path.parent.name} makes ({'; '.join(wrong)}); delete it and "
                         "run the workflow again")
    if attrs.get("status") == "failed":
        when = _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.timezone.utc).isoformat(timespec="seconds")
        return {"reason": str(attrs.get("failure_reason", "unknown")), "time": when}
    return None


# (folder of a study's results, depth of its leaf folders, a file name in them or None for
# any): where a study from before the store kept real files that are now links
_OLD_PRODUCTS = (("tiles", 1, None), ("thumbnails", 1, None), ("features", 3, None), ("models", 2, "model.safetensors"),
                 ("discovery", 1, "plan.json"), ("calibration", 0, None))


def products_before_the_store(results: str | os.PathLike) -> list[str]:
    """The folders of a study's results that hold tiles, features, models, discovery or
    calibration files of their own (from a pathtwt before the store), where the store's
    layout has links; only the first file of each leaf folder is looked at."""
    found = []
    for name, depth, file in _OLD_PRODUCTS:
        if any(_owns_files(leaf, file) for leaf in _leaves(Path(results) / name, depth)):
            found.append(f"{name}/")
    return found


def _leaves(folder: Path, depth: int) -> list[Path]:
    if depth == 0:
        return [folder] if folder.is_dir() and not folder.is_symlink() else []
    try:
        children = [folder / n for n in sorted(os.listdir(folder)) if not n.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [leaf for child in children if child.is_dir() and not child.is_symlink() for leaf in _leaves(child, depth - 1)]


def _owns_files(folder: Path, name: str | None) -> bool:
    if name is not None:
        path = folder / name
        return path.is_file() and not path.is_symlink()
    with os.scandir(folder) as it:
        for entry in it:
            if not entry.name.startswith(".") and entry.name.endswith((".h5", ".png")):
                return not entry.is_symlink()
    return False
