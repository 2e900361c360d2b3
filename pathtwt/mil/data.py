"""Bags of tile features: one ``{slide_id}.h5`` per slide in a features folder (datasets
``features`` (N, D), ``coords`` (N, 2), attr ``status``) matched against a label table.

Only shapes and attributes are held in memory up front; a bag's features are read from
HDF5 when it is first used and kept while all kept bags stay under ``BAG_CACHE_BYTES``, so
small bags (a few hundred tiles, read every epoch) are read once per run, and cohorts of
50,000-tile slides never need to fit in memory at once. Every
inconsistency between table and folder is an error that lists the slides concerned;
``allow_missing`` turns the missing/unlisted cases into counted skips instead."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import pandas as pd

from pathtwt.errors import ConfigError, NumericsError
from pathtwt.mil.labels import slide_listing

SPLITS = ("train", "val", "test")
SCAN_ROWS = 8192  # rows per read when scanning for NaN/inf: bounded memory per slide
BAG_CACHE_BYTES = 1 << 30  # bags kept in memory after their first read, at most this much

# (path, mtime_ns, size) -> (features, coords) of whole bags, filled first come first kept
_bag_cache: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray]] = {}


@dataclass(frozen=True)
class Bag:
    slide_id: str
    label: int
    path: Path
    n_tiles: int
    group: str | None = None  # the label table's `group` (patient, case), when it has one


@dataclass
class Cohort:
    """The bags of one evaluated group (a split of the main table or an external table)."""

    name: str
    bags: list[Bag]
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def labels(self) -> np.ndarray:
        return np.array([b.label for b in self.bags], dtype=np.int64)


def features_files(features_dir: str | os.PathLike) -> dict[str, Path]:
    """slide_id -> features file; hidden names (temporary files) are ignored."""
    folder = Path(features_dir)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: features folder not found; run `pathtwt extract` for this cohort first")
    return {p.stem: p for p in sorted(folder.glob("*.h5")) if not p.name.startswith(".")}


def match_table(
    table: pd.DataFrame, features_dir: str | os.PathLike, *, allow_missing: bool, where: str,
    also_listed: frozenset[str] = frozenset(),
) -> tuple[pd.DataFrame, dict[str, int]]:
    """Keep the table rows that have a features file; check the folder holds no slide the
    table does not list (``also_listed``: slides the table lists for another use, such as
    a cross-validation table's compression hold-out). Returns the kept rows and the skip
    counts."""
    files = features_files(features_dir)
    ids = set(table["slide_id"]) | set(also_listed)
    missing = [s for s in table["slide_id"] if s not in files]
    unlisted = sorted(s for s in files if s not in ids)
    if missing and not allow_missing:
        raise ConfigError(
            f"{where}: {len(missing)} slide(s) of the label table have no features file in {features_dir}: "
            f"{slide_listing(missing)}; extract them or pass --allow-missing to skip them"
        )
    if unlisted and not allow_missing:
        raise ConfigError(
            f"{where}: {len(unlisted)} features file(s) in {features_dir} are not in the label table: "
            f"{slide_listing(unlisted)}; add them to the table or pass --allow-missing to ignore them"
        )
    kept = table[table["slide_id"].isin(files)].copy()
    kept["path"] = [files[s] for s in kept["slide_id"]]
    return kept, {"missing_features": len(missing), "unlisted_features": len(unlisted)}


def inspect_bags(
    rows: pd.DataFrame, *, where: str, check_finite: bool = True, failed: str = "stop", skipped: dict | None = None
) -> tuple[list[Bag], int]:
    """Read each file's shape and status (and scan for NaN/inf); return the bags and the
    feature dimension. Empty bags and non-finite features are errors; bags whose
    extraction failed (status "failed") are errors too, or with ``failed="exclude"``
    left out and counted in ``skipped["failed_extraction"]``; so are, with "exclude",
    slides that kept no tile at the cohort's tissue threshold (status ok, 0 tiles: e.g. a
    near-empty image), counted in ``skipped["no_tiles"]``."""
    bags: list[Bag] = []
    empty: list[str] = []
    excluded: list[str] = []
    no_tiles: list[str] = []
    unreadable: list[str] = []
    non_finite: list[str] = []
    dims: dict[int, list[str]] = {}
    groups = rows["group"] if "group" in rows.columns else [None] * len(rows)
    for slide_id, label, path, group in zip(rows["slide_id"], rows["label"], rows["path"], groups):
        try:
            with h5py.File(path, "r") as h5:
                dataset = h5["features"]
                status = h5.attrs.get("status", "ok")
                status = status.decode() if isinstance(status, bytes) else str(status)
                n_tiles = int(dataset.shape[0]) if dataset.ndim == 2 else 0
                if status == "failed" and failed == "exclude":
                    excluded.append(slide_id)
                    continue
                if n_tiles == 0 and status == "ok" and failed == "exclude":
                    no_tiles.append(slide_id)
                    continue
                if n_tiles == 0 or status != "ok":
                    empty.append(f"{slide_id} ({n_tiles} tiles, status {status})")
                    continue
                dims.setdefault(int(dataset.shape[1]), []).append(slide_id)
                if check_finite and not _all_finite(dataset):
                    non_finite.append(slide_id)
        except (OSError, KeyError) as exc:
            unreadable.append(f"{slide_id} ({type(exc).__name__})")
            continue
        bags.append(Bag(slide_id=slide_id, label=int(label), path=Path(path), n_tiles=n_tiles,
                        group=None if group is None or pd.isna(group) else str(group)))
    if skipped is not None:
        skipped["failed_extraction"] = len(excluded)
        skipped["no_tiles"] = len(no_tiles)
    if unreadable:
        raise ConfigError(
            f"{where}: unreadable features file(s) (no 'features' dataset or not HDF5): "
            f"{slide_listing(unreadable)}; re-run `pathtwt extract` for them"
        )
    if empty:
        raise ConfigError(
            f"{where}: empty bag(s), no usable tiles: {slide_listing(empty)}; "
            "remove these slides from the label table or re-tile/re-extract them"
        )
    if non_finite:
        raise NumericsError(
            f"{where}: NaN or infinite features in slide(s) {slide_listing(non_finite)}; "
            "re-extract them (check the backbone weights and precision)"
        )
    if len(dims) > 1:
        parts = [f"{d}-d: {slide_listing(ids, 3)}" for d, ids in sorted(dims.items())]
        raise ConfigError(f"{where}: features of different widths ({'; '.join(parts)}); use one backbone variant")
    dim = next(iter(dims)) if dims else 0
    return bags, dim


# the features-file attrs a trained head records: what it can be applied to (the backbone
# variant and embedding) and the tile geometry a new slide should be tiled with
PROVENANCE_ATTRS = (
    "backbone", "base_backbone", "weights_sha256", "weights_source", "embedding_recipe", "embedding_dim",
    "target_mpp", "patch_size", "input_size",
)


def features_provenance(path: str | os.PathLike) -> dict:
    """The :data:`PROVENANCE_ATTRS` of one features file (those it has)."""
    with h5py.File(path, "r") as h5:
        out = {}
        for key in PROVENANCE_ATTRS:
            if key in h5.attrs:
                value = h5.attrs[key]
                value = value.decode() if isinstance(value, bytes) else value.item() if isinstance(value, np.generic) else value
                out[key] = value
        return out


def _all_finite(dataset: h5py.Dataset) -> bool:
    for start in range(0, dataset.shape[0], SCAN_ROWS):
        if not np.isfinite(dataset[start : start + SCAN_ROWS]).all():
            return False
    return True


def load_bag(
    bag: Bag, *, max_instances: int | None = None, rng: np.random.Generator | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Read (features float32 (n, D), coords int64 (n, 2)) of one bag. With
    ``max_instances`` a random subset of that many tiles (kept in file order) is read;
    only training uses it."""
    if max_instances is not None and rng is None:
        raise ValueError("instance subsampling needs a random generator")
    stat = os.stat(bag.path)
    key = (str(bag.path), stat.st_mtime_ns, stat.st_size)
    cached = _bag_cache.get(key)
    if cached is not None:
        features, coords = cached
        n = len(features)
        if max_instances is not None and n > max_instances:
            # the same draw as from the file below: the same tiles in the same order
            index = np.sort(rng.choice(n, size=max_instances, replace=False))
            return features[index], coords[index]
        return features, coords
    with h5py.File(bag.path, "r") as h5:
        feats = h5["features"]
        n = feats.shape[0]
        if max_instances is not None and n > max_instances:
            index = np.sort(rng.choice(n, size=max_instances, replace=False))
            features = feats[index]
            coords = h5["coords"][index] if "coords" in h5 else np.zeros((len(index), 2), np.int64)
            return np.asarray(features, dtype=np.float32), np.asarray(coords, dtype=np.int64).reshape(-1, 2)
        features = np.asarray(feats[()], dtype=np.float32)
        coords = np.asarray(h5["coords"][()] if "coords" in h5 else np.zeros((n, 2), np.int64), dtype=np.int64).reshape(-1, 2)
    if sum(f.nbytes + c.nbytes for f, c in _bag_cache.values()) + features.nbytes + coords.nbytes <= BAG_CACHE_BYTES:
        features.flags.writeable = False  # shared by every later read of this bag
        coords.flags.writeable = False
        _bag_cache[key] = (features, coords)
    return features, coords


def check_labels(cohorts: list[Cohort], n_classes: int, *, where: str) -> None:
    """Every label must be a class of the task (0..n_classes-1)."""
    bad = [f"{c.name}:{b.slide_id}={b.label}" for c in cohorts for b in c.bags if not 0 <= b.label < n_classes]
    if bad:
        raise ConfigError(
            f"{where}: label(s) outside the task's classes 0..{n_classes - 1}: {slide_listing(bad)}; "
            "fix the label table or pass --classes"
        )


@dataclass
class MILData:
    """Everything a run trains and evaluates on."""

    train: Cohort
    evaluated: list[Cohort]  # val first, then test (when present), then external cohorts
    dim: int
    n_classes: int
    fold: int | None = None  # the test fold of a cross-validation run

    def cohort(self, name: str) -> Cohort:
        return next(c for c in [self.train, *self.evaluated] if c.name == name)

    def skipped(self) -> dict[str, dict[str, int]]:
        """Skip counts (``--allow-missing``) of the main label table and each external one."""
        out = {"main": self.train.skipped}
        out.update({c.name: c.skipped for c in self.evaluated if c.name not in SPLITS})
        return out

    def fingerprint(self) -> list[list]:
        """Slides and labels per cohort: a resumed run must see the same data."""
        return [[c.name, [[b.slide_id, b.label] for b in c.bags]] for c in [self.train, *self.evaluated]]


def parse_external(spec: str) -> tuple[str, Path, Path]:
    """``NAME=DIR:CSV`` -> (name, features dir, label table)."""
    name, sep, rest = spec.partition("=")
    folder, colon, csv = rest.rpartition(":")
    if not sep or not colon or not name.strip() or not folder or not csv:
        raise ConfigError(f"--external {spec!r}: expected NAME=FEATURES_DIR:LABELS_CSV")
    return name.strip(), Path(folder), Path(csv)


def prepare_data(
    *,
    features_dir: str | os.PathLike,
    labels: str | os.PathLike,
    externals: list[tuple[str, Path, Path]] = (),
    n_classes: int | None = None,
    allow_missing: bool = False,
    failed: str = "stop",
    fold: int | None = None,
) -> MILData:
    """Match the label table(s) with the features folder(s) and check everything before
    any training starts. With ``fold`` the table's ``fold`` column gives the splits
    (:func:`fold_splits`)."""
    from pathtwt.mil.labels import read_label_table

    table = read_label_table(labels)
    listed = frozenset(table["slide_id"])
    if fold is not None:
        table = fold_splits(table, fold, where=str(labels))
    odd = table.loc[~table["split"].isin(SPLITS), "slide_id"].tolist()
    if odd:
        raise ConfigError(f"{labels}: split must be one of {', '.join(SPLITS)}; not so for slide(s) {slide_listing(odd)}")
    kept, skipped = match_table(table, features_dir, allow_missing=allow_missing, where=str(labels), also_listed=listed)
    bags, dim = inspect_bags(kept, where=str(features_dir), failed=failed, skipped=skipped)
    split_of = dict(zip(kept["slide_id"], kept["split"]))
    cohorts = {s: Cohort(name=s, bags=[b for b in bags if split_of[b.slide_id] == s], skipped=skipped) for s in SPLITS}
    for needed in ("train", "val"):
        if not cohorts[needed].bags:
            raise ConfigError(f"{labels}: no '{needed}' slides with features; the protocols train on 'train' and select on 'val'")
    evaluated = [cohorts["val"]] + ([cohorts["test"]] if cohorts["test"].bags else [])
    for name, folder, csv in externals:
        if name in SPLITS or any(c.name == name for c in evaluated):
            raise ConfigError(f"--external {name}: the name is taken (train/val/test or another external); rename it")
        ext_table = read_label_table(csv, need_split=False)
        ext_kept, ext_skipped = match_table(ext_table, folder, allow_missing=allow_missing, where=str(csv))
        ext_bags, ext_dim = inspect_bags(ext_kept, where=str(folder), failed=failed, skipped=ext_skipped)
        if ext_dim != dim:
            raise ConfigError(f"--external {name}: features are {ext_dim}-d but the training features are {dim}-d; extract both with the same backbone variant")
        if not ext_bags:
            raise ConfigError(f"--external {name}: no slides with features in {folder}")
        evaluated.append(Cohort(name=name, bags=ext_bags, skipped=ext_skipped))
    if n_classes is None:  # from the whole main table, so a grade seen only in test still counts
        n_classes = max(2, int(max(b.label for b in bags)) + 1)
    data = MILData(train=cohorts["train"], evaluated=evaluated, dim=dim, n_classes=int(n_classes), fold=fold)
    check_labels([data.train, *evaluated], data.n_classes, where=str(labels))
    return data


def fold_splits(table: pd.DataFrame, fold: int, *, where: str) -> pd.DataFrame:
    """The rows of a cross-validation table (``fold`` column 0..K-1, -1 for the
    compression-only hold-out) with ``split`` set for test fold ``fold``
    (:func:`pathtwt.mil.folds.fold_roles`); the hold-out rows are left out."""
    from pathtwt.mil import folds as cv

    if "fold" not in table.columns:
        raise ConfigError(f"{where}: --fold {fold} needs a `fold` column; draw one with `pathtwt labels split --folds K`")
    values = pd.to_numeric(table["fold"], errors="coerce")
    bad = table.loc[values.isna() | (values != np.round(values)), "slide_id"].tolist()
    if bad:
        raise ConfigError(f"{where}: fold not an integer for slide(s) {slide_listing(bad)}; folds are 0..K-1 (-1: hold-out)")
    values = values.astype(np.int64).to_numpy()
    k = int(values.max()) + 1
    cv.check_fold_column(values, k, where)
    if not 0 <= fold < k:
        raise ConfigError(f"{where}: --fold {fold}: the table has folds 0..{k - 1}")
    out = table.assign(split=cv.fold_roles(values, fold, k))
    return out[values != cv.HOLDOUT].reset_index(drop=True)
