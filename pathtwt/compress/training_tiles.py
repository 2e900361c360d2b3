"""The tiles distillation trains on, and the order it sees them in.

Two sources share one interface (``len`` and ``read(i) -> uint8 (P, P, 3)``):
:class:`ArrayTiles`, tiles already in memory (the calibration set: short runs, tests),
and :class:`SlideTiles`, every tile listed in the training cohort's coords files, read
from its slide at the coords file's geometry when it is needed. Memory does not grow with
the number of tiles streamed: what is held is the coords (16 bytes a tile), one epoch's
permutation and, per DataLoader worker, a few open slide handles.

The order is an endless stream of positions p = 0, 1, 2, ...: epoch p // N visits tile
``perm_e[p % N]``, with ``perm_e`` a permutation seeded by (seed, e) over all N tiles,
across slides. Micro-batch m covers positions [m B, (m + 1) B) for a global batch B, and
rank r of W takes the r-th of W equal slices of it. The whole state of the sampler is
therefore the next position, a plain integer: a run resumed from a checkpoint, with any
number of ranks, continues mid-epoch with exactly the tiles an uninterrupted run sees, and
each epoch sees every tile exactly once. Augmentation of the tile at position p is seeded
by (seed, p), so it too does not depend on which rank draws the tile.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import torch

from pathtwt.compress.augment import BatchAugmenter, step_seed
from pathtwt.compress.stopping import training_worker_init
from pathtwt.errors import ConfigError, PathtwtError, SlideError
from pathtwt.wsi.coords_tiles import cv2_pool_stopped, reader_worker_init  # noqa: F401 - cv2_pool_stopped: used with loader()
from pathtwt.wsi.slides import Slide

if TYPE_CHECKING:
    from pathtwt.compress.calibration import CalibrationSet

log = logging.getLogger(__name__)

OPEN_SLIDES_PER_WORKER = 16  # a shuffled stream touches many slides; keep the recent ones open


class ArrayTiles:
    """uint8 tiles (N, P, P, 3) in memory."""

    def __init__(self, tiles: np.ndarray) -> None:
        self.tiles = tiles

    def __len__(self) -> int:
        return len(self.tiles)

    def read(self, index: int) -> np.ndarray:
        return self.tiles[index]

    def describe(self) -> dict[str, Any]:
        return {"source": "in-memory calibration tiles", "tiles": len(self)}


class SlideTiles:
    """Every tile of the given coords files (status ok), read from its slide on demand.

    No slide handle is shared across processes: a pickled copy (a spawned DataLoader
    worker) carries none (``__getstate__``), and a forked worker, which inherits the
    handles the main process opened (the loss normalisation and the bf16 check read the
    first tiles there) together with their file offsets, leaves those alone and opens its
    own: the handles are kept per process id. Two processes reading through one inherited
    descriptor move one shared file offset, so each could read the other's bytes."""

    def __init__(self, coords_files: Sequence[Path], *, excluded: dict[str, str] | None = None) -> None:
        from pathtwt.io.h5 import read_coords
        from pathtwt.wsi.coords_tiles import TileGeometry

        self.entries: list[TileGeometry] = []
        self.excluded = dict(excluded or {})
        parts, counts = [], []
        for path in sorted(Path(p) for p in coords_files):
            if path.stem in self.excluded:
                continue
            xy, _tissue, attrs = read_coords(path)
            if attrs.get("status", "ok") != "ok" or len(xy) == 0:
                continue
            self.entries.append(TileGeometry.from_attrs(path, attrs))
            parts.append(np.asarray(xy, dtype=np.int64))
            counts.append(len(xy))
        if not self.entries:
            raise ConfigError("the training coords files hold no tiles (none with status ok outside the held-out slides)")
        self.coords = np.concatenate(parts)
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._open: OrderedDict[int, Slide] = OrderedDict()
        self._owner = os.getpid()  # the process whose handles ``_open`` holds
        self._inherited: list[Slide] = []  # a forked copy's handles of its parent, never used

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_open"], state["_inherited"] = OrderedDict(), []
        return state

    def locate(self, index: int) -> tuple[int, int, int]:
        """Tile ``index`` -> (slide number, level-0 x, y)."""
        s = int(np.searchsorted(self.offsets, index, side="right")) - 1
        x, y = self.coords[index]
        return s, int(x), int(y)

    def _slide(self, s: int) -> Slide:
        if self._owner != os.getpid():
            # a forked copy: the parent's handles stay the parent's, kept referenced and
            # never closed here (closing could touch the library state the parent shares);
            # this process opens its own
            self._inherited = [*self._inherited, *self._open.values()]
            self._open, self._owner = OrderedDict(), os.getpid()
        if s in self._open:
            self._open.move_to_end(s)
            return self._open[s]
        slide = self.entries[s].open()
        self._open[s] = slide
        if len(self._open) > OPEN_SLIDES_PER_WORKER:
            _, old = self._open.popitem(last=False)
            old.close()
        return slide

    def read(self, index: int) -> np.ndarray:
        s, x, y = self.locate(index)
        return self.entries[s].read(self._slide(s), x, y)

    def close(self) -> None:
        """Close this process's open slides (they reopen on the next read)."""
        if self._owner == os.getpid():
            while self._open:
                self._open.popitem(last=False)[1].close()

    def describe(self) -> dict[str, Any]:
        return {"source": "coords files, streamed from the slides", "tiles": len(self), "slides": len(self.entries),
                "excluded_slides": sorted(self.excluded)}


def coords_files_of(sources: Sequence[str | os.PathLike]) -> list[Path]:
    """Coords files named directly, in folders (recursively), or listed one a line in a
    ``.txt`` file (as the workflow writes them)."""
    out: set[Path] = set()
    for src in sources:
        src = Path(src)
        if src.is_dir():
            out.update(p for p in src.rglob("*.h5") if not any(q.startswith(".") for q in p.relative_to(src).parts))
        elif src.suffix == ".txt" and src.is_file():
            out.update(Path(line.strip()) for line in src.read_text().splitlines() if line.strip())
        elif src.is_file():
            out.add(src)
        else:
            raise ConfigError(f"--train-coords {src}: no such file or folder")
    return sorted(out)


def held_out_slides(calibration_files: Sequence[Path]) -> dict[str, str]:
    """slide id -> coords file of every slide that gives a held-out (not fit) tile of the
    calibration files. Training must not see these slides, so the held-out numbers are
    measured on tiles of slides the student never trained on."""
    import h5py

    held: dict[str, str] = {}
    for path in calibration_files:
        with h5py.File(path, "r") as h5:
            if "source_index" not in h5 or "sources" not in h5:
                raise ConfigError(f"{path}: calibration file without source_index/sources; re-run pathtwt calibrate")
            sources = [s.decode() if isinstance(s, bytes) else str(s) for s in h5["sources"][()]]
            split, index = h5["split"][()], h5["source_index"][()]
            for i in np.unique(index[split != 0]):
                held[Path(sources[int(i)]).stem] = sources[int(i)]
    return held


class EpochOrder:
    """Position -> tile index; see the module doc. Keeps one epoch's permutation."""

    def __init__(self, n_tiles: int, seed: int) -> None:
        self.n_tiles, self.seed = int(n_tiles), int(seed)
        self._epoch, self._perm = -1, np.zeros(0, np.int64)

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(step_seed(self.seed, 10_000_019 * (epoch + 1)))
            self._epoch, self._perm = epoch, torch.randperm(self.n_tiles, generator=g).numpy()
        return self._perm

    def tiles(self, start: int, count: int) -> np.ndarray:
        out = np.empty(count, np.int64)
        for k, p in enumerate(range(start, start + count)):
            epoch, i = divmod(p, self.n_tiles)
            out[k] = self.permutation(epoch)[i]
        return out


@dataclass(frozen=True)
class Sharding:
    """Global micro-batch ``batch`` split over ``world`` ranks; this is ``rank``."""

    batch: int
    world: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        if self.batch % self.world:
            raise ConfigError(f"--batch-size {self.batch} is not divisible by the {self.world} ranks; choose a multiple")

    @property
    def local(self) -> int:
        return self.batch // self.world

    def positions(self, micro: int) -> range:
        start = micro * self.batch + self.rank * self.local
        return range(start, start + self.local)


class MicroBatches(torch.utils.data.Sampler):
    """This rank's (position, tile) pairs of micro-batches ``first`` .. ``last - 1``."""

    def __init__(self, order: EpochOrder, sharding: Sharding, first: int, last: int) -> None:
        self.order, self.sharding, self.first, self.last = order, sharding, int(first), int(last)

    def __len__(self) -> int:
        return max(0, self.last - self.first)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for m in range(self.first, self.last):
            pos = self.sharding.positions(m)
            yield list(zip(pos, self.order.tiles(pos.start, len(pos)).tolist()))


class TrainingItems(torch.utils.data.Dataset):
    """(position, tile) -> (position, tile index, uint8 (3, S, S) tile at the backbone's
    input size, error text or ""): the worker reads and resizes only; augmentation and
    normalisation run on the whole batch where the model trains (:meth:`to_model_input`),
    and uint8 tiles are a quarter of float32's shared memory and host-to-device traffic. A
    tile that cannot be read comes back as zeros with the reason, raised in the main
    process as one line naming the slide (a worker's exception would arrive as a multi-line
    traceback)."""

    def __init__(self, source: Any, transform: Any, *, augment: bool, seed: int) -> None:
        self.source, self.transform, self.seed = source, transform, int(seed)
        self.augmenter = BatchAugmenter() if augment else None

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, key: tuple[int, int]):
        position, index = key
        try:
            tile = self.transform.resize(self.source.read(index))
            return position, index, torch.from_numpy(np.ascontiguousarray(tile.transpose(2, 0, 1))), ""
        except Exception as exc:  # noqa: BLE001 - carried to the main process and raised there
            size = self.transform.input_size
            return position, index, torch.zeros(3, size, size, dtype=torch.uint8), " ".join(f"{type(exc).__name__}: {exc}".split())

    def to_model_input(self, positions: torch.Tensor, tiles: torch.Tensor, device: str) -> torch.Tensor:
        """uint8 (B, 3, S, S) tiles of the stream ``positions`` -> the model's input on
        ``device``: augmented there (seeded by position) and normalised with the backbone's
        mean and std, bit-identical to its per-tile transform when not augmented."""
        x = tiles.to(device, non_blocking=True)
        if self.augmenter is not None:
            x = self.augmenter(x, [step_seed(self.seed, int(p)) for p in positions])
        return self.transform.normalise_batch(x, device, channels_first=True)

    def failure(self, index: int, reason: str) -> PathtwtError:
        if isinstance(self.source, SlideTiles):
            s, x, y = self.source.locate(index)
            return SlideError(f"{self.source.entries[s].slide_path}: cannot read training tile at level-0 (x={x}, y={y}): {reason}")
        return PathtwtError(f"training tile {index}: {reason}")


# most reading processes a GPU run starts by default: enough to keep a GPU busy with JPEG/
# JPEG 2000 tiles of ~224 px (a few ms each) at thousands of tiles/s, without a worker per
# core of a 128-core node (each holds prefetched batches and open slides)
GPU_FEEDERS = 16


def default_workers(device: str, streaming: bool) -> int:
    """Reading processes of a distillation when ``--workers`` is not given: none for tiles
    in memory (a worker would only copy them; augmentation runs on the device); when
    streaming, this rank's share of the job's cores (SLURM's allocation or the affinity
    mask, over torchrun's ranks on the node) less the training process: at most
    :data:`GPU_FEEDERS` on a GPU, whose training leaves the cores to the readers, and at
    most 4 on CPU, where the training itself computes on them (as extraction's readers)."""
    if not streaming:
        return 0
    if not str(device).startswith("cuda"):
        from pathtwt.devices import reading_workers

        return reading_workers()
    from pathtwt.devices import available_cores

    from pathtwt.compress.ranks import _env_int

    share = available_cores() // max(1, _env_int("LOCAL_WORLD_SIZE", default=1))
    return max(1, min(GPU_FEEDERS, share - 1))


def loader(items: TrainingItems, sampler: MicroBatches, *, workers: int, pin_memory: bool) -> torch.utils.data.DataLoader:
    """Batches of this rank's tiles; iterate it inside :func:`cv2_pool_stopped` when
    ``workers`` > 0."""
    return torch.utils.data.DataLoader(
        items, batch_sampler=sampler, num_workers=workers, worker_init_fn=training_worker_init if workers else None,
        prefetch_factor=4 if workers else None, pin_memory=pin_memory, persistent_workers=False,
    )


def with_streamed_training(calib: CalibrationSet, calibration_sources: Sequence[str | os.PathLike],
                           train_coords: Sequence[str | os.PathLike]) -> CalibrationSet:
    """``calib`` with the streamed training cohort as its ``training`` source: every tile of
    ``train_coords`` except those of the slides whose tiles the calibration files hold out
    (the held-out parts, whatever they are called, are every split other than fit). The one
    place that ties the in-memory calibration set to the streamed training set."""
    import dataclasses

    from pathtwt.compress.calibration import expand_sources

    calib_files, coords, images = expand_sources(calibration_sources)
    if not calib_files or coords or images:
        raise ConfigError("--train-coords needs --calibration calibration files (pathtwt calibrate output), which record "
                          "the slides their held-out tiles come from")
    held = held_out_slides(calib_files)
    streamed = SlideTiles(coords_files_of(train_coords), excluded=held)
    log.info("training on %d tiles of %d slides, %d held-out slides left out", len(streamed), len(streamed.entries), len(held))
    return dataclasses.replace(calib, training=streamed)
