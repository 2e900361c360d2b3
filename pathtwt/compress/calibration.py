"""The calibration set: tiles drawn reproducibly from the training cohort (coords files
read back from their slides) or from image files, split three ways.

The split is seeded and disjoint: ``fit`` tiles train a student (and give the teacher's
mean embedding that centres fidelity), ``select`` tiles are the only ones anything that
chooses may read (auditioning's ranking, the subset search, NOSE's layer choice), and
``report`` tiles are only ever measured, so the fidelity reported on them is not inflated
by a choice made on the same tiles. ``holdout`` is the fraction kept out of fitting; it is
shared equally between select and report.

Sources may be coords files (``pathtwt tile`` output), folders of them, image files
(tif/tiff/png/jpg/jpeg) or folders of images, or calibration files written by
``pathtwt calibrate`` (an HDF5 with a ``tiles`` dataset). Images larger than the tile size
are cut into a grid of non-overlapping tiles; smaller ones are resized up to it.

The draw is proportional across slides/images (largest remainder), uniform without
replacement inside each, and depends only on the seed and the sorted source list.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence

import h5py
import numpy as np

from pathtwt.compress.defaults import COMPRESS_DEFAULTS
from pathtwt.errors import ConfigError, PathtwtError
from pathtwt.io.atomic import atomic_output
from pathtwt.io.h5_writer import writing_h5

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".tif", ".tiff", ".png", ".jpg", ".jpeg")
CALIBRATION_FORMAT = "pathtwt-calibration/2"  # /1 had a fit/holdout split only
SPLITS = ("fit", "select", "report")  # stored as split codes 0, 1, 2
DEFAULT_PATCH_SIZE = 224


class TileSource(Protocol):
    """Tiles read one at a time (:mod:`pathtwt.compress.training_tiles`: in memory or
    streamed from the slides of coords files)."""

    def __len__(self) -> int: ...
    def read(self, index: int) -> np.ndarray: ...
    def describe(self) -> dict[str, Any]: ...


@dataclass
class TeacherCentre:
    """The teacher's means over fit tiles: of the tile embedding (E,) and of every layer's
    tokens, per position (L + 1, T, D), entry l being layer l's output (0: embedded tokens)."""

    embedding: "torch.Tensor"
    layers: "torch.Tensor"
    n_tiles: int


@dataclass
class DerivedValues:
    """What is computed from a calibration set once per teacher (keyed by
    ``id(teacher.model)``) and reused by every measurement on it: the teacher's fit means
    and select-tile embeddings and the reference rows (:mod:`pathtwt.compress.fidelity`),
    its layer outputs of the fit and held-out tiles (:mod:`pathtwt.compress.teacher_cache`),
    and the subset search's candidate scores (:mod:`pathtwt.compress.methods.subset`); and,
    once per set, the hash of its tiles (:func:`pathtwt.compress.teacher_cache.tiles_digest`)."""

    teacher_centres: dict[int, TeacherCentre] = field(default_factory=dict)
    select_embeddings: dict[int, "torch.Tensor"] = field(default_factory=dict)
    references: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    subset_scores: dict[tuple[Any, ...], dict[tuple[int, ...], float]] = field(default_factory=dict)
    teacher_caches: dict[int, Any] = field(default_factory=dict)  # pathtwt.compress.teacher_cache.TeacherCache
    fit_outputs: dict[tuple[int, int], list["torch.Tensor"]] = field(default_factory=dict)  # ... fit_layer_outputs
    held_out_outputs: dict[tuple[int, str, int], list["torch.Tensor"]] = field(default_factory=dict)  # ... held_out_outputs
    tiles_digest: str | None = None


@dataclass(frozen=True, eq=False)
class CalibrationSet:
    """uint8 tiles (N, P, P, 3) in three disjoint parts: ``fit`` for fitting and teacher
    statistics, ``select`` for every choice, ``report`` only for the reported fidelity.
    ``patch_size`` is P, the side the tiles were resampled to (the teacher's input size).

    ``training`` is what distillation trains on when it is not the fit tiles: the streamed
    training cohort (:func:`pathtwt.compress.training_tiles.with_streamed_training`). The set
    is frozen once loaded; ``derived`` holds the values computed from it once per teacher."""

    fit: np.ndarray
    select: np.ndarray
    report: np.ndarray
    patch_size: int
    sources: tuple[str, ...] = ()
    provenance: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    training: TileSource | None = None
    derived: DerivedValues = field(default_factory=DerivedValues, repr=False)

    def training_tiles(self) -> np.ndarray | TileSource:
        """What distillation trains on: the streamed cohort when one is attached, else the
        in-memory fit tiles."""
        return self.fit if self.training is None else self.training

    def training_record(self) -> dict[str, Any]:
        """model.json's account of the training tiles: source, count, the slides held out."""
        if self.training is None:
            return {"source": "in-memory calibration fit tiles", "tiles": int(len(self.fit))}
        return self.training.describe()

    @property
    def all(self) -> np.ndarray:
        return np.concatenate([p for p in (self.fit, self.select, self.report) if len(p)])

    def choosing_tiles(self) -> np.ndarray:
        """The tiles a choice is scored on: ``select`` (``fit`` when the set has none)."""
        return self.select if len(self.select) else self.fit

    def choosing_split(self) -> str:
        """The name of the split :meth:`choosing_tiles` returns."""
        return "select" if len(self.select) else "fit"

    def reported_tiles(self) -> tuple[np.ndarray, str]:
        """The tiles fidelity is reported on and their split's name (``fit`` when the set
        holds out nothing, which model.json then says)."""
        return (self.report, "report") if len(self.report) else (self.fit, "fit")

    def splits_record(self) -> dict[str, Any]:
        """Sizes and seed of the split, as model.json records them."""
        return {"fit": int(len(self.fit)), "select": int(len(self.select)), "report": int(len(self.report)),
                "seed": self.seed}


@dataclass(frozen=True)
class _Group:
    """One slide (coords file) or one image: the unit the draw is proportional over."""

    source: str
    kind: str  # "coords" | "image"
    origins: np.ndarray  # (n, 2) int64: level-0 (x, y) for slides, crop offset for images
    size: int = 0  # image: side of the square cut before resizing to the tile size


def _hidden_below(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def _is_calibration_file(path: Path) -> bool:
    try:
        with h5py.File(path, "r") as h5:
            return "tiles" in h5
    except OSError as exc:
        raise PathtwtError(
            f"{path}: not a readable HDF5 file ({exc}); re-create it or remove it from the sources"
        ) from None


def expand_sources(sources: Iterable[str | os.PathLike]) -> tuple[list[Path], list[Path], list[Path]]:
    """Split sources into (calibration files, coords files, image files), sorted.
    Folders are scanned recursively; names starting with "." (temporary files) are skipped."""
    calib, coords, images = set(), set(), set()
    for src in sources:
        src = Path(src)
        if not src.exists():
            raise ConfigError(f"calibration source {src} does not exist")
        if src.is_file():
            files = [src]
        else:  # skip hidden names anywhere below the folder: temporary files of atomic writes
            files = [p for p in sorted(src.rglob("*")) if p.is_file() and not _hidden_below(p, src)]
        for f in files:
            suffix = f.suffix.lower()
            if suffix == ".h5":
                (calib if _is_calibration_file(f) else coords).add(f)
            elif suffix in IMAGE_SUFFIXES:
                images.add(f)
            elif src.is_file():
                raise ConfigError(f"calibration source {f}: expected .h5 coords/calibration or an image file")
    return sorted(calib), sorted(coords), sorted(images)


def restrict_to_splits(
    coords_files: Sequence[Path], labels_csv: str | os.PathLike, splits: Sequence[str]
) -> list[Path]:
    """Keep the coords files (named ``{slide_id}.h5``) whose slide is in one of ``splits``
    of the label table; a slide missing from the table is an error, since it cannot be
    shown to belong to the training cohort."""
    import csv

    from pathtwt.io.slide_ids import check_slide_ids

    try:
        with open(labels_csv, newline="", encoding="utf-8") as fh:
            rows = [(row["slide_id"], row["split"]) for row in csv.DictReader(fh)]
    except (OSError, KeyError) as exc:
        raise ConfigError(f"{labels_csv}: cannot read columns slide_id and split ({exc})") from None
    check_slide_ids([r[0] for r in rows], labels_csv, rows=[f"line {i + 2}" for i in range(len(rows))])
    split_of = dict(rows)
    unknown = [p.name for p in coords_files if p.stem not in split_of]
    if unknown:
        raise ConfigError(f"{labels_csv}: no row for {unknown[0]} ({len(unknown)} coords files); fix the label table")
    return [p for p in coords_files if split_of[p.stem] in splits]


def _coords_group(path: Path) -> tuple[_Group | None, dict[str, Any]]:
    from pathtwt.io.h5 import read_coords
    from pathtwt.wsi.coords_tiles import check_geometry

    coords, _, attrs = read_coords(path)
    if attrs.get("status", "ok") != "ok" or len(coords) == 0:
        return None, attrs
    check_geometry(path, attrs)
    return _Group(source=str(path), kind="coords", origins=coords), attrs


def _read_image(path: Path, size_only: bool = False) -> Any:
    from PIL import Image

    try:
        with Image.open(path) as im:
            return im.size if size_only else np.asarray(im.convert("RGB"))
    except (OSError, ValueError) as exc:
        raise PathtwtError(f"{path}: cannot read image ({exc}); remove it from the calibration sources") from None


def _image_group(path: Path, size: int) -> _Group:
    w, h = _read_image(path, size_only=True)
    # a non-overlapping grid of squares of the image's own pixels; an image smaller than
    # the tile size contributes one square (its centre) resized up
    if min(w, h) >= size:
        side = size
        xs, ys = range(0, w - side + 1, side), range(0, h - side + 1, side)
    else:
        side = min(w, h)
        xs, ys = [(w - side) // 2], [(h - side) // 2]
    origins = np.array([(x, y) for y in ys for x in xs], dtype=np.int64).reshape(-1, 2)
    return _Group(source=str(path), kind="image", origins=origins, size=side)


def allocate(sizes: Sequence[int], n: int) -> list[int]:
    """Largest-remainder proportional allocation of ``n`` draws over groups, capped by
    each group's size (ties go to the earlier group, so it is deterministic)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    if n >= total:
        return sizes.tolist()
    exact = sizes * n / total
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind="stable")
    for i in order[: n - int(counts.sum())]:
        counts[i] += 1
    return counts.tolist()


def _draw(groups: list[_Group], n_tiles: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    counts = allocate([len(g.origins) for g in groups], n_tiles)
    picks = []
    for gi, (g, c) in enumerate(zip(groups, counts)):
        idx = np.sort(rng.choice(len(g.origins), size=c, replace=False)) if c else []
        picks += [(gi, int(i)) for i in idx]
    return picks


def split_codes(n: int, holdout: float, rng: np.random.Generator) -> np.ndarray:
    """0 fit, 1 select, 2 report for ``n`` tiles: ``holdout`` of them held out of fitting,
    half select and half report (select gets the odd one); all three non-empty when a
    holdout is asked for and there are at least three tiles."""
    n_hold = int(round(n * holdout))
    if holdout > 0 and n >= 3:
        n_hold = min(max(n_hold, 2), n - 1)
    n_report = n_hold // 2
    split = np.zeros(n, dtype=np.uint8)
    order = rng.permutation(n)
    split[order[: n_hold - n_report]] = 1
    split[order[n_hold - n_report : n_hold]] = 2
    return split


def _split_by_source(source_index: np.ndarray, holdout: float, rng: np.random.Generator) -> np.ndarray:
    """Hold out whole sources (slides), in a seeded order, each one taken if it brings the
    held-out share closer to ``holdout`` (the first always, never all of them), so that a
    streamed training set can leave them out entirely. Held-out slides go to select (1) and
    report (2) in turn; a single held-out slide has its tiles split between the two."""
    split = np.zeros(len(source_index), dtype=np.uint8)
    present = np.unique(source_index)
    if holdout <= 0 or len(present) < 2:
        return split
    want, held, chosen = holdout * len(source_index), 0, []
    for s in rng.permutation(present):
        rows = source_index == s
        n = int(rows.sum())
        if len(chosen) == len(present) - 1:
            break
        if not chosen or abs(held + n - want) < abs(held - want):
            chosen.append(s)
            held += n
    if len(chosen) == 1:
        rows = np.flatnonzero(source_index == chosen[0])
        split[rows] = 2
        split[rng.permutation(rows)[: (len(rows) + 1) // 2]] = 1
    else:
        for k, s in enumerate(chosen):
            split[source_index == s] = 1 + k % 2
    return split


def _read_coords_tiles(group: _Group, indices: list[int], attrs: dict[str, Any], size: int) -> np.ndarray:
    from pathtwt.wsi.coords_tiles import CoordsTileReader, TileGeometry

    geometry = TileGeometry.from_attrs(group.source, attrs)
    out = np.empty((len(indices), size, size, 3), dtype=np.uint8)
    # resampled to the backbone's input size where it differs from the tiling's
    # a slide's draw read a batch at a time, in the coords file's order, so neighbours
    # share their native tiles (each decoded once: Slide.read_tiles)
    order = np.argsort(np.asarray(indices), kind="stable")
    with CoordsTileReader(geometry, group.origins[indices], size=size) as reader:
        for start in range(0, len(order), _READ_BATCH):
            chunk = order[start:start + _READ_BATCH]
            for k, tile in zip(chunk, reader.read_many(chunk)):
                out[k] = tile
    return out


_READ_BATCH = 64  # tiles of one slide read together by the calibration draw


def _read_image_tiles(group: _Group, indices: list[int], size: int) -> np.ndarray:
    import cv2

    image = _read_image(Path(group.source))
    out = np.empty((len(indices), size, size, 3), dtype=np.uint8)
    for k, i in enumerate(indices):
        x, y = group.origins[i]
        crop = image[y : y + group.size, x : x + group.size]
        if group.size != size:
            crop = cv2.resize(crop, (size, size), interpolation=cv2.INTER_CUBIC)
        out[k] = crop
    return out


@dataclass
class _Drawn:
    tiles: np.ndarray
    split: np.ndarray
    source_index: np.ndarray
    origins: np.ndarray
    sources: list[str]
    patch_size: int


def draw_tiles(
    coords_files: Sequence[Path],
    image_files: Sequence[Path],
    *,
    n_tiles: int,
    seed: int,
    holdout: float,
    resize_to: int | None = None,
    progress: Callable[[int], Any] | None = None,
    holdout_by: str = "tile",
) -> _Drawn:
    """Draw and read the tiles (in a fixed order: by source, then by tile index).
    ``resize_to`` is the side in pixels every drawn tile is resampled to (the teacher's
    input size); None keeps the coords files' tiling size (their ``patch_size`` attribute,
    which must then agree), else 224. ``progress`` is called with the number of tiles read
    from each source. ``holdout_by``: "tile" (a random fraction of the tiles) or "slide"
    (whole slides)."""
    if holdout_by not in ("tile", "slide"):
        raise ConfigError(f"--holdout-by {holdout_by!r}: use tile or slide")
    if n_tiles < 1:
        raise ConfigError(f"--n-tiles must be >= 1, got {n_tiles}")
    if not 0.0 <= holdout < 1.0:
        raise ConfigError(f"--holdout must be in [0, 1), got {holdout}")  # checked before any slide is read
    groups: list[_Group] = []
    attrs_of: dict[str, dict[str, Any]] = {}
    # an explicit resize_to resizes slide tiles to it; otherwise the coords files' tiling
    # size sets it and must agree between them
    coords_size: int | None = None
    for path in coords_files:
        group, attrs = _coords_group(path)
        if group is None:
            continue  # status no_tissue: nothing to draw
        if coords_size is None:
            coords_size = int(attrs["patch_size"])
        elif int(attrs["patch_size"]) != coords_size and resize_to is None:
            raise ConfigError(
                f"{path}: patch_size {attrs['patch_size']} differs from {coords_size}; calibrate with coords "
                "files of one tile geometry"
            )
        groups.append(group)
        attrs_of[group.source] = attrs
    size = int(resize_to or coords_size or DEFAULT_PATCH_SIZE)
    groups += [g for g in (_image_group(p, size) for p in image_files) if len(g.origins)]
    if not groups:
        raise ConfigError("calibration sources hold no tiles (no coords with status ok and no images)")
    rng = np.random.default_rng(seed)
    picks = _draw(groups, n_tiles, rng)
    if len(picks) < n_tiles:
        log.warning("asked for %d calibration tiles, the sources hold only %d; using all", n_tiles, len(picks))
    tiles = np.empty((len(picks), size, size, 3), dtype=np.uint8)
    source_index = np.array([gi for gi, _ in picks], dtype=np.int32)
    origins = np.array([groups[gi].origins[i] for gi, i in picks], dtype=np.int64).reshape(-1, 2)
    for gi, g in enumerate(groups):
        rows = np.flatnonzero(source_index == gi)
        if not len(rows):
            continue
        indices = [picks[r][1] for r in rows]
        if g.kind == "coords":
            tiles[rows] = _read_coords_tiles(g, indices, attrs_of[g.source], size)
        else:
            tiles[rows] = _read_image_tiles(g, indices, size)
        if progress is not None:
            progress(len(rows))
    split = split_codes(len(picks), holdout, rng) if holdout_by == "tile" else _split_by_source(source_index, holdout, rng)
    return _Drawn(tiles, split, source_index, origins, [g.source for g in groups], size)


def write_calibration(path: str | os.PathLike, drawn: _Drawn, provenance: dict[str, Any]) -> None:
    """Atomic HDF5: ``tiles`` uint8 (N, P, P, 3) chunked one tile per chunk (so any subset
    reads lazily), ``split`` (0 fit, 1 select, 2 report), ``source_index``, ``origins``, ``sources``."""
    import json

    with atomic_output(path) as tmp:
        with writing_h5(tmp) as h5:
            n, p = len(drawn.tiles), drawn.patch_size
            h5.create_dataset("tiles", data=drawn.tiles, chunks=(1, p, p, 3) if n else None)
            h5.create_dataset("split", data=drawn.split)
            h5.create_dataset("source_index", data=drawn.source_index)
            h5.create_dataset("origins", data=drawn.origins)
            h5.create_dataset("sources", data=np.array(drawn.sources, dtype=h5py.string_dtype()))
            h5.attrs["format"] = CALIBRATION_FORMAT
            h5.attrs["patch_size"] = p
            h5.attrs["provenance"] = json.dumps(provenance)


def _subsample(idx: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    return idx if n >= len(idx) else np.sort(rng.choice(idx, size=n, replace=False))


def _stored_split(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as h5:
        if h5.attrs.get("format") != CALIBRATION_FORMAT:
            raise ConfigError(
                f"{path}: calibration file of format {h5.attrs.get('format')!r}, which has no select/report split; "
                "rerun pathtwt calibrate"
            )
        return h5["split"][()]


PARTS = (*SPLITS, "all")  # what load_calibration's ``part`` may name


def _read_rows(dataset: "h5py.Dataset", rows: np.ndarray) -> np.ndarray:
    """``dataset[rows]`` for sorted ``rows``. Rows spread over a span at most twice their
    number are read as that one slice and picked in memory: h5py reads scattered rows one
    selection at a time (112 of 128 one-tile chunks: 1.06 s against 0.09 s for the slice)."""
    if not len(rows):
        return np.zeros((0, *dataset.shape[1:]), dataset.dtype)
    lo, hi = int(rows[0]), int(rows[-1]) + 1
    if hi - lo <= 2 * len(rows):
        return dataset[lo:hi][rows - lo]
    return dataset[rows]


def _read_files(paths: Sequence[Path], *, n_tiles: int | None, seed: int, part: str | None = None) -> CalibrationSet:
    """Concatenate calibration files, keeping their stored split. With ``n_tiles`` below
    the stored count, a seeded subset, proportional over files and over the three parts.
    With ``part``, up to ``n_tiles`` tiles of that stored part alone (every part for
    "all"), proportional over files, as ``fit``."""
    import json

    splits = [_stored_split(p) for p in paths]
    rng = np.random.default_rng(seed)
    # the rows of each file to read, per part (sorted: h5py reads only the chosen one-tile chunks)
    picks: list[list[np.ndarray]] = []
    if part is None:
        want = allocate([len(s) for s in splits], sum(map(len, splits)) if n_tiles is None else n_tiles)
        for split, n in zip(splits, want):
            counts = allocate([int((split == code).sum()) for code in range(len(SPLITS))], n)
            picks.append([_subsample(np.flatnonzero(split == code), count, rng) for code, count in enumerate(counts)])
    else:
        wanted = tuple(range(len(SPLITS))) if part == "all" else (SPLITS.index(part),)
        pools = [np.flatnonzero(np.isin(split, wanted)) for split in splits]
        want = allocate([len(p) for p in pools], sum(map(len, pools)) if n_tiles is None else n_tiles)
        none = np.zeros(0, dtype=np.int64)
        picks = [[_subsample(pool, n, rng), none, none] for pool, n in zip(pools, want)]
    parts: dict[int, list[np.ndarray]] = {code: [] for code in range(len(SPLITS))}
    sources, sizes, provenance, seeds = [], set(), {}, set()
    for path, rows in zip(paths, picks):
        with h5py.File(path, "r") as h5:
            sizes.add(int(h5.attrs["patch_size"]))
            sources += [s.decode() if isinstance(s, bytes) else str(s) for s in h5["sources"][()]]
            provenance[str(path)] = json.loads(h5.attrs.get("provenance", "{}"))
            seeds.add(provenance[str(path)].get("seed"))
            for code, idx in enumerate(rows):
                parts[code].append(_read_rows(h5["tiles"], idx))
    if len(sizes) != 1:
        raise ConfigError(f"calibration files {', '.join(map(str, paths))} have different tile sizes {sorted(sizes)}")
    fit, select, report = (np.concatenate(parts[code]) for code in range(len(SPLITS)))
    if part is not None and not len(fit):
        raise ConfigError(f"calibration files {', '.join(map(str, paths))} hold no {part} tiles")
    return CalibrationSet(
        fit=fit, select=select, report=report, patch_size=sizes.pop(), sources=tuple(sources),
        provenance={"calibration_files": provenance, **({"part": part} if part is not None else {})},
        seed=seeds.pop() if len(seeds) == 1 else None,  # files drawn with different seeds: see provenance
    )


def load_calibration(
    sources: Sequence[str | os.PathLike],
    *,
    n_tiles: int | None = 10_000,
    seed: int = 0,
    holdout: float = COMPRESS_DEFAULTS.holdout,
    resize_to: int | None = None,
    part: str | None = None,
) -> CalibrationSet:
    """A CalibrationSet from calibration files (``pathtwt calibrate``, their stored split
    kept), or drawn fresh from coords/image sources.

    ``resize_to`` is the side in pixels freshly drawn tiles are resampled to (the teacher's
    input size; None: the coords files' tiling size, else 224); calibration files hold
    tiles already drawn at a size. ``part`` ("fit", "select", "report" or "all") reads
    only up to ``n_tiles`` tiles of that stored part of calibration files, returned as
    ``fit`` with ``select`` and ``report`` empty; coords/image sources carry no split, so
    they give a fresh draw of ``n_tiles`` with nothing held out. ``provenance["part"]``
    then says which part the tiles are: ``part`` itself, or "all" for a fresh draw."""
    if part is not None and part not in PARTS:
        raise ConfigError(f"calibration part {part!r}: expected one of {', '.join(PARTS)}")
    calib, coords, images = expand_sources(sources)
    if calib and (coords or images):
        raise ConfigError(
            "mix of calibration files and coords/images in --calibration; pass either calib.h5 files or raw sources"
        )
    if calib:
        return _read_files(calib, n_tiles=n_tiles, seed=seed, part=part)
    if not coords and not images:
        raise ConfigError(f"no coords files or images found in {', '.join(map(str, sources))}")
    if part is not None:
        holdout = 0.0  # no stored part to take: every drawn tile is one of "all"
    drawn = draw_tiles(coords, images, n_tiles=n_tiles or 10_000, seed=seed, holdout=holdout, resize_to=resize_to)
    fit, select, report = (drawn.tiles[drawn.split == code] for code in range(len(SPLITS)))
    return CalibrationSet(
        fit=fit, select=select, report=report, patch_size=drawn.patch_size, sources=tuple(drawn.sources), seed=seed,
        provenance={"seed": seed, "holdout": holdout, "n_tiles": len(drawn.tiles), "sources": drawn.sources,
                    **({"part": "all"} if part is not None else {})},
    )
