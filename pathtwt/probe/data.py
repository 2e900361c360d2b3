"""A probe set on disk: ``TILES/<class>/<image>`` plus a train/test split.

The split comes from a CSV (columns ``path,split``, ``path`` relative to the tiles folder,
``split`` train or test) or is drawn: seeded, stratified by class, and keeping tiles of
one *group* on one side. A tile's group is its file stem up to the first ``_`` (the whole
stem when it has none), so tiles named ``SLIDE_x_y.png`` from one slide never sit on both
sides of the split.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from pathtwt.errors import PathtwtError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp")
SPLITS = ("train", "test")
GROUP_SEPARATOR = "_"
# Rows of a faulty split file listed in one error line before it is cut short.
MAX_LISTED = 5


class ProbeDataError(PathtwtError):
    """The tiles folder or its split cannot make a probe set."""


@dataclass(frozen=True)
class Tile:
    path: str  # relative to the tiles folder, with "/" separators
    label: int
    split: str


@dataclass
class ProbeSet:
    root: Path
    classes: list[str]
    tiles: list[Tile]
    split_source: str

    def in_split(self, split: str) -> list[Tile]:
        return [t for t in self.tiles if t.split == split]


def _listed(items: Sequence[str]) -> str:
    more = f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return ", ".join(items[:MAX_LISTED]) + more


def scan_classes(root: str | os.PathLike) -> dict[str, list[str]]:
    """class name -> sorted image paths relative to ``root``, for every subfolder that
    holds at least one image (hidden names, the temporary files of atomic writes, skipped)."""
    root = Path(root)
    if not root.is_dir():
        raise ProbeDataError(f"{root}: tiles folder not found; give a folder of class subfolders of images")
    classes: dict[str, list[str]] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        images = sorted(
            f"{folder.name}/{f.name}" for f in folder.iterdir()
            if f.is_file() and not f.name.startswith(".") and f.suffix.lower() in IMAGE_SUFFIXES
        )
        if images:
            classes[folder.name] = images
    if len(classes) < 2:
        found = ", ".join(classes) or "none"
        raise ProbeDataError(
            f"{root}: a probe needs at least two class subfolders holding images ({', '.join(IMAGE_SUFFIXES)}); "
            f"found {len(classes)} ({found})"
        )
    return classes


def group_of(path: str) -> str:
    """The split group of a tile: its file stem up to the first ``_`` (class folder not
    included, so one slide's tiles stay together even across classes)."""
    stem = Path(path.rpartition("/")[2]).stem
    return stem.split(GROUP_SEPARATOR, 1)[0]


def read_split_file(path: str | os.PathLike, root: Path, classes: dict[str, list[str]]) -> dict[str, str]:
    """relative tile path -> split from a ``path,split`` CSV; every named file must exist
    under ``root`` in a class folder."""
    import csv

    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing_cols = {"path", "split"} - set(reader.fieldnames or [])
            if missing_cols:
                raise ProbeDataError(f"{path}: split file lacks columns {sorted(missing_cols)}; it needs path,split")
            rows = [(i + 2, (r["path"] or "").strip(), (r["split"] or "").strip()) for i, r in enumerate(reader)]
    except OSError as exc:
        raise ProbeDataError(f"{path}: split file unreadable ({exc.strerror or exc})") from None
    known = {p for images in classes.values() for p in images}
    bad_split = [f"line {n} ({s!r})" for n, _, s in rows if s not in SPLITS]
    if bad_split:
        raise ProbeDataError(f"{path}: split must be train or test: {_listed(bad_split)}")
    absent = [p for _, p, _ in rows if p.replace(os.sep, "/") not in known]
    if absent:
        raise ProbeDataError(
            f"{path}: {len(absent)} listed tile(s) do not exist as images in a class folder of {root}: {_listed(absent)}"
        )
    out: dict[str, str] = {}
    for n, p, s in rows:
        p = p.replace(os.sep, "/")
        if p in out and out[p] != s:
            raise ProbeDataError(f"{path}: line {n}: {p} is listed in both train and test")
        out[p] = s
    return out


def draw_split(classes: dict[str, list[str]], test_fraction: float, seed: int) -> dict[str, str]:
    """Seeded split, stratified by class, whole groups (``group_of``) on one side.

    A group belongs to the class holding most of its tiles (ties: the first name). Per
    class, its groups in a seeded shuffled order go to test until the class's test share
    reaches ``test_fraction``, always leaving at least one group for train."""
    if not 0.0 < test_fraction < 1.0:
        raise ProbeDataError(f"--test-fraction must lie strictly between 0 and 1, got {test_fraction}")
    label_of = {p: c for c in sorted(classes) for p in classes[c]}
    groups: dict[str, list[str]] = {}
    for p in sorted(label_of):
        groups.setdefault(group_of(p), []).append(p)
    order = sorted(groups)
    random.Random(seed).shuffle(order)
    by_class: dict[str, list[str]] = {c: [] for c in sorted(classes)}
    for g in order:
        owners = [label_of[p] for p in groups[g]]
        by_class[max(sorted(set(owners)), key=owners.count)].append(g)
    out: dict[str, str] = {}
    for c, class_groups in by_class.items():
        total = sum(len(groups[g]) for g in class_groups)
        n_test = 0
        for i, g in enumerate(class_groups):
            last = i == len(class_groups) - 1
            split = "test" if n_test < test_fraction * total and not last else "train"
            n_test += len(groups[g]) if split == "test" else 0
            out.update({p: split for p in groups[g]})
    return out


def load_probe_set(
    root: str | os.PathLike,
    *,
    split_file: str | os.PathLike | None = None,
    test_fraction: float = 0.3,
    seed: int = 0,
    max_per_class: int | None = None,
) -> ProbeSet:
    """The tiles of ``root`` with their class and split. ``max_per_class`` keeps at most
    that many tiles per class in each split, drawn with ``seed``. Refuses (one line) sets
    with fewer than two classes or a class with no train or no test tile."""
    root = Path(root)
    classes = scan_classes(root)
    if split_file is not None:
        splits = read_split_file(split_file, root, classes)
        source = str(split_file)
    else:
        splits = draw_split(classes, test_fraction, seed)
        source = f"drawn (seed {seed}, test fraction {test_fraction}, groups: file stem up to the first '_')"
    names = sorted(classes)
    tiles = [Tile(p, names.index(c), splits[p]) for c in names for p in classes[c] if p in splits]
    if max_per_class is not None:
        if max_per_class < 1:
            raise ProbeDataError(f"--max-per-class must be at least 1, got {max_per_class}")
        rng = np.random.default_rng(seed)
        kept: list[Tile] = []
        for label in range(len(names)):
            for split in SPLITS:
                members = [t for t in tiles if t.label == label and t.split == split]
                if len(members) > max_per_class:
                    idx = np.sort(rng.choice(len(members), size=max_per_class, replace=False))
                    members = [members[i] for i in idx]
                kept += members
        tiles = sorted(kept, key=lambda t: (t.label, t.path))
    for label, name in enumerate(names):
        for split in SPLITS:
            if not any(t.label == label and t.split == split for t in tiles):
                raise ProbeDataError(
                    f"{root}: class {name!r} has no {split} tile (split: {source}); every class needs tiles on both sides"
                )
    return ProbeSet(root=root, classes=names, tiles=tiles, split_source=source)


def read_tile(root: Path, rel: str) -> np.ndarray:
    """An image file as uint8 RGB (H, W, 3); a file that does not decode is a one-line error naming it."""
    from PIL import Image, UnidentifiedImageError

    path = root / rel
    try:
        with Image.open(path) as im:
            arr = np.asarray(im.convert("RGB"))
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
        raise ProbeDataError(f"{path}: unreadable image ({exc}); remove or replace this tile") from None
    if arr.ndim != 3 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ProbeDataError(f"{path}: empty image; remove or replace this tile")
    return arr
