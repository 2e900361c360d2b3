"""The reading processes of an extraction job (torch-free: they never touch CUDA).

A job's slides are cut into *bands*: runs of consecutive batches (tiles in coords order,
row by row) that span at least :data:`BAND_NATIVE_ROWS` rows of native tiles. A reading
process takes a whole band, so the native tiles two neighbouring batches share are read
(and, on the CPU path, decoded) once by one process; only the row where two bands meet
is read by both, at most 1 / BAND_NATIVE_ROWS more than needed. Bands are handed out in
slide order as processes ask for them, so a job of many small slides keeps every process
busy and one of a few large slides splits each.

For each batch a process writes into a free slot of the shared ring (:mod:`ring`) either

- ``tiles``: the finished uint8 tiles at the model's input size (the CPU path: native
  tiles decoded once, cut, resized), or
- ``bytes``: the complete JPEG streams of the native tiles under the batch that the
  embedding process does not hold already, and a :class:`~pathtwt.wsi.cut_plan.CutPlan`
  (the GPU path: the embedding process decodes them on its GPU, cuts and shrinks there).

and sends a :class:`BatchMessage` (the slot's number and the plan, a few hundred bytes).
A slide whose read level is not JPEG-tiled (or that the embedding process switched to the
CPU path, :data:`SLIDE_TILES`) comes as tiles on either path.
"""

from __future__ import annotations

import os
import queue
import signal
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from pathtwt.errors import PathtwtError
from pathtwt.features.ring import Ring
from pathtwt.wsi.coords_tiles import TileGeometry

# a band spans at least this many rows of native tiles: the rows two bands share are read
# twice, so at most 1/24 (4 %) of the native tiles are read or decoded more than once
BAND_NATIVE_ROWS = 24
# a slide's mode in the shared table the embedding process can flip (:meth:`ReaderPool.use_tiles`)
SLIDE_BYTES, SLIDE_TILES = 0, 1
# how long the embedding process waits for a batch before it checks that the readers live
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class SlideRead:
    """What a reading process needs to read one slide's tiles (picklable)."""

    number: int  # the slide's place in the job
    geometry: TileGeometry
    xy: np.ndarray  # level-0 top-left of every tile, in coords order
    band_rows: int = 0  # level pixels a band spans (0: one band per BAND_BATCHES batches)


@dataclass(frozen=True)
class Band:
    slide: int
    number: int  # unique in the job
    batches: tuple[tuple[int, int], ...]  # [start, end) tile ranges within the slide, consecutive


@dataclass
class BatchMessage:
    """One batch's worth of news from a reading process."""

    slide: int
    band: int
    start: int  # tile range [start, end) within the slide
    end: int
    slot: int | None = None
    kind: str = "tiles"  # tiles | bytes | error
    error: str = ""
    seconds: float = 0.0  # the reader's own time for this batch
    decoded: int = 0  # native tiles this batch made the reader decode (CPU path)
    last: bool = False  # the band's last batch
    level: int = 0
    plan: Any = None  # CutPlan (bytes)
    fresh: np.ndarray | None = None  # positions in plan.natives whose streams are in the slot (bytes)
    offsets: np.ndarray | None = None
    lengths: np.ndarray | None = None
    keep: np.ndarray | None = None  # native indices to hold for the band's next batch (bytes)
    rgb: int = 0  # the shipped streams that decode as RGB (Adobe transform 0), not YCbCr (bytes)
    why_tiles: str = ""  # why a batch of the GPU path comes as finished tiles (the slide's decode_fallback)


def band_batches(n: int, batch_size: int) -> list[tuple[int, int]]:
    return [(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]


# bands of slides whose native rows are unknown (no native view): this many batches each
BAND_BATCHES = 8


def plan_bands(slide: SlideRead, batch_size: int, first_band: int, level_ys: np.ndarray | None = None) -> list[Band]:
    """A slide's batches grouped into bands of at least ``slide.band_rows`` level pixels
    of height (the tiles' level-pixel rows ``level_ys``), the last band taking the rest."""
    batches = band_batches(len(slide.xy), batch_size)
    if not batches:
        return []
    groups: list[list[tuple[int, int]]] = [[]]
    if slide.band_rows and level_ys is not None:
        top = None
        for start, end in batches:
            if top is None:
                top = int(level_ys[start])
            groups[-1].append((start, end))
            if int(level_ys[end - 1]) - top >= slide.band_rows:
                groups.append([])
                top = None
    else:
        for k, batch in enumerate(batches):
            if k and k % BAND_BATCHES == 0:
                groups.append([])
            groups[-1].append(batch)
    groups = [g for g in groups if g]
    if len(groups) > 1 and slide.band_rows and level_ys is not None:
        last = groups[-1]
        if int(level_ys[last[-1][1] - 1]) - int(level_ys[last[0][0]]) < slide.band_rows // 2:
            groups[-2].extend(groups.pop())  # a short remainder joins the band before it
    return [Band(slide.number, first_band + k, tuple(g)) for k, g in enumerate(groups)]


# -- what a reading process does for one batch ---------------------------------------------


class BatchReader:
    """Reads batches of one job in one process: the slide it read last stays open."""

    def __init__(self, ring: Ring, input_size: int, resize: Any, ship_bytes: bool, slide_modes: Any = None) -> None:
        self.ring = ring
        self.input_size = int(input_size)
        self.resize = resize  # TileTransform.resize: patch size -> the model's input size
        self.ship_bytes = bool(ship_bytes)
        self.slide_modes = slide_modes  # shared uint8 table: SLIDE_BYTES / SLIDE_TILES per slide
        self._open: tuple[int, Any, Any] | None = None  # (slide number, Slide, file descriptor)
        self._headers: dict[int, Any] = {}
        self._ships: dict[int, bool] = {}  # read level -> its batches go as bytes (decided once a slide)

    def close(self) -> None:
        if self._open is not None:
            _num, slide, fd = self._open
            slide.close()
            if fd is not None:
                os.close(fd)
            self._open = None
            self._headers = {}
            self._ships = {}

    def _slide(self, read: SlideRead) -> Any:
        if self._open is None or self._open[0] != read.number:
            self.close()
            self._open = (read.number, read.geometry.open(), None)
        return self._open[1]

    def _fd(self, read: SlideRead) -> int:
        num, slide, fd = self._open  # type: ignore[misc]
        if fd is None:
            fd = os.open(str(read.geometry.slide_path), os.O_RDONLY)
            self._open = (num, slide, fd)
        return fd

    def band(self, read: SlideRead, band: Band, slots: Iterator[int]) -> Iterator[BatchMessage]:
        """The messages of ``band``'s batches, each written into the next slot of ``slots``."""
        keep_prev = np.zeros(0, np.int64)
        ahead = None  # the next batch's plan, made while this one was shipped
        for k, (start, end) in enumerate(band.batches):
            began = time.perf_counter()
            msg = BatchMessage(read.number, band.number, start, end, last=k == len(band.batches) - 1,
                               level=read.geometry.read_level)
            msg.slot = next(slots)
            try:
                slide = self._slide(read)
                plan = None
                if self._bytes_for(read, slide):
                    plan = ahead if ahead is not None else self._byte_plan(read, slide, start, end)
                    if plan is None:
                        msg.why_tiles = "tiles whose corners fall between the read level's pixels"
                elif self.ship_bytes and self._ships.get(read.geometry.read_level) is False:
                    msg.why_tiles = f"level {read.geometry.read_level} is not a JPEG-tiled TIFF page"
                ahead = None
                if plan is not None:
                    following = band.batches[k + 1] if k + 1 < len(band.batches) else None
                    keep_prev, ahead = self._ship(read, slide, plan, following, keep_prev, msg)
                if msg.kind != "bytes":
                    keep_prev = np.zeros(0, np.int64)
                    self._tiles(read, slide, start, end, msg)
            except Exception as exc:  # noqa: BLE001 - carried to the embedding process, raised there in one line
                msg.kind, msg.error = "error", " ".join(f"{type(exc).__name__}: {exc}".split())
                keep_prev, ahead = np.zeros(0, np.int64), None
            msg.seconds = time.perf_counter() - began
            yield msg

    def _bytes_for(self, read: SlideRead, slide: Any) -> bool:
        """Whether this batch goes as bytes: the slide's tile source of its read level,
        chosen once when the slide is opened (JPEG-tiled native pages, on the GPU path),
        unless the embedding process has since sent the slide to the CPU path."""
        if self.slide_modes is not None and self.slide_modes[read.number] == SLIDE_TILES:
            return False
        level = read.geometry.read_level
        if level not in self._ships:
            from pathtwt.wsi.jpeg_streams import is_jpeg_tiled

            native = slide.native_level(level) if self.ship_bytes else None
            self._ships[level] = native is not None and is_jpeg_tiled(native.page)
        return self._ships[level]

    def _byte_plan(self, read: SlideRead, slide: Any, start: int, end: int) -> Any:
        from pathtwt.wsi import supertiles
        from pathtwt.wsi.cut_plan import CutPlan, LevelGrid, natives_under

        g = read.geometry
        ds = slide.level_downsamples[g.read_level]
        origins, exact = supertiles.level_origins(read.xy[start:end], ds, slide.reader)
        if not exact:
            return None
        page = slide.native_level(g.read_level).page
        grid = LevelGrid.of_page(page)
        side = max(1, int(round(g.patch_size_level0 / ds)))
        return CutPlan(grid, natives_under(grid, origins, side), origins, side, g.patch_size, slide.fill)

    def _ship(self, read: SlideRead, slide: Any, plan: Any, following: tuple[int, int] | None,
              keep_prev: np.ndarray, msg: BatchMessage) -> tuple[np.ndarray, Any]:
        """Write the streams the embedding process lacks into the slot. Returns the natives
        it should keep for the band's next batch, and that batch's plan (made here to know
        them; the next batch uses it)."""
        from pathtwt.wsi.jpeg_streams import StreamHeader, pack_streams, rgb_streams

        page = slide.native_level(read.geometry.read_level).page
        header = self._headers.get(read.geometry.read_level)
        if header is None:
            header = self._headers[read.geometry.read_level] = StreamHeader.of_page(page)
        fresh = np.flatnonzero(~np.isin(plan.natives, keep_prev))
        packed = pack_streams(page, header, plan.natives[fresh], self._fd(read), self.ring.slot(msg.slot))
        if packed is None:  # more bytes than a slot holds: this batch is decoded here
            msg.why_tiles = "a batch's JPEG streams larger than a ring slot"
            return np.zeros(0, np.int64), None
        nxt = self._byte_plan(read, slide, *following) if following is not None else None
        keep = np.intersect1d(plan.natives, nxt.natives) if nxt is not None else np.zeros(0, np.int64)
        msg.kind, msg.plan, msg.fresh, msg.keep = "bytes", plan, fresh, keep
        msg.offsets, msg.lengths = packed
        msg.rgb = rgb_streams(self.ring.slot(msg.slot), *packed, header)
        return keep, nxt

    def _tiles(self, read: SlideRead, slide: Any, start: int, end: int, msg: BatchMessage) -> None:
        out = self.ring.tiles(msg.slot, end - start, self.input_size)
        native = slide.native_level(read.geometry.read_level)  # None for a reader without native tiles
        before = native.decoded if native is not None else 0
        if read.geometry.patch_size == self.input_size:  # straight into the slot
            read.geometry.read_many(slide, read.xy[start:end], out=out)
        else:
            for b, tile in enumerate(read.geometry.read_many(slide, read.xy[start:end])):
                out[b] = self.resize(tile)
        msg.decoded = (native.decoded - before) if native is not None else 0
        msg.kind = "tiles"


# -- the processes -------------------------------------------------------------------------


def _reading_process(worker: int, reader: BatchReader, tasks: Any, free: Any, results: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the embedding process stops the job, not a Ctrl-C here
    try:
        import cv2

        cv2.setNumThreads(1)  # one thread each: the compute threads belong to the embedding process
    except ImportError:  # pragma: no cover - OpenCV is a dependency
        pass

    def slots() -> Iterator[int]:
        while True:
            yield free.get()

    free_slots = slots()
    while True:
        task = tasks.get()
        if task is None:
            break
        read, band = task
        results.put(("band", worker, band.number, read.number))
        for msg in reader.band(read, band, free_slots):
            results.put(msg)
    reader.close()
    results.put(("done", worker, -1, -1))


class ReaderPool:
    """``workers`` forked reading processes, the band queue they take from, the free slots
    and the messages they send. The embedding process feeds bands (:meth:`add`), takes
    messages (:meth:`get`) and gives slots back (:meth:`release`)."""

    def __init__(self, reader: BatchReader, workers: int) -> None:
        import multiprocessing as mp

        self.reader = reader
        self.workers = int(workers)
        context = mp.get_context("fork")
        try:
            self.tasks = context.Queue()
            self.free = context.Queue()
            self.results = context.Queue()
        except OSError as exc:  # the queues' semaphores live in /dev/shm
            raise PathtwtError(
                f"extract: cannot make the reading processes' queues ({exc.strerror or exc}); /dev/shm must be a "
                "writable tmpfs (docker run --shm-size=256m, or mount one), or read in this process with --workers 0"
            ) from None
        for k in range(reader.ring.size.slots):
            self.free.put(k)
        self.processes = [context.Process(target=_reading_process, args=(w, reader, self.tasks, self.free, self.results),
                                          daemon=True, name=f"pathtwt-reader-{w}") for w in range(self.workers)]
        self.current: dict[int, int] = {}  # reading process -> slide it is reading
        self.finished = 0
        for p in self.processes:
            p.start()

    def add(self, read: SlideRead, bands: Sequence[Band]) -> None:
        for band in bands:
            self.tasks.put((read, band))

    def close_input(self) -> None:
        for _ in self.processes:
            self.tasks.put(None)

    def release(self, slot: int | None) -> None:
        if slot is not None:
            self.free.put(slot)

    def get(self) -> BatchMessage | None:
        """The next batch; None once every process has finished its bands. A process that
        died raises one line naming the slide it was reading."""
        while True:
            try:
                item = self.results.get(timeout=POLL_SECONDS)
            except queue.Empty:
                self._check_alive()
                continue
            if isinstance(item, BatchMessage):
                return item
            what, worker, _band, slide = item
            if what == "band":
                self.current[worker] = slide
            elif what == "done":
                self.current.pop(worker, None)
                self.finished += 1
                if self.finished == self.workers:
                    return None

    def _check_alive(self) -> None:
        for w, p in enumerate(self.processes):
            if p.exitcode not in (None, 0):
                raise ReaderDied(w, p.exitcode, self.current.get(w))

    def stop(self) -> None:
        for p in self.processes:
            if p.is_alive():
                p.terminate()
        for p in self.processes:
            p.join(timeout=5)
        for q in (self.tasks, self.free, self.results):
            q.cancel_join_thread()
            q.close()


class ReaderDied(RuntimeError):
    """A reading process ended without finishing its bands (killed for memory, a crash in
    a reader library)."""

    def __init__(self, worker: int, exitcode: int, slide: int | None) -> None:
        how = f"signal {-exitcode}" if exitcode < 0 else f"exit code {exitcode}"
        super().__init__(f"reading process {worker} died ({how})")
        self.worker, self.exitcode, self.slide = worker, exitcode, slide


class InlineReader:
    """The reading process's work done in the embedding process, band by band (a job of a
    batch or two on a CPU: starting a process costs more than reading them)."""

    def __init__(self, reader: BatchReader) -> None:
        self.reader = reader
        self.workers = 0
        self._tasks: queue.Queue = queue.Queue()
        self._messages: Iterator[BatchMessage] | None = None
        self._free = list(range(reader.ring.size.slots))
        self._closed = False

    def add(self, read: SlideRead, bands: Sequence[Band]) -> None:
        for band in bands:
            self._tasks.put((read, band))

    def close_input(self) -> None:
        self._tasks.put(None)

    def release(self, slot: int | None) -> None:
        if slot is not None:
            self._free.append(slot)

    def _slots(self) -> Iterator[int]:
        while True:
            yield self._free.pop()

    def get(self) -> BatchMessage | None:
        while True:
            if self._messages is not None:
                msg = next(self._messages, None)
                if msg is not None:
                    return msg
                self._messages = None
            if self._closed:
                return None
            task = self._tasks.get()
            if task is None:
                self._closed = True
                continue
            read, band = task
            self._messages = self.reader.band(read, band, self._slots())

    def stop(self) -> None:
        self.reader.close()
