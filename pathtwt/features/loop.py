"""The embedding loop of an extraction job: batches in, features files out.

One process owns the model and the device. It takes each batch the reading processes
announce (:mod:`reading`), makes its uint8 tiles on the device (:mod:`device_tiles`:
copied from the ring, or decoded, cut and shrunk there), normalises them, runs the forward
pass, and hands the embeddings to the writer thread (:mod:`sink`). Nothing in the loop
waits for the device: the embeddings come back into pinned buffers with a CUDA event,
the finite check runs on the host in the writer thread, and on a GPU the decode of the
next batch runs on a second stream while this one's forward pass runs. The weights are
cast to the run's precision once (:meth:`~pathtwt.models.bf16_guard.AutoPrecision.job_context`).
A forward pass that runs out of GPU memory is split in halves, said once, and the job goes on.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from pathtwt.errors import NumericsError, PathtwtError, SlideError
from pathtwt.features.device_tiles import DeviceTiles, UndecodableTile, pin_host_memory
from pathtwt.features.reading import (
    SLIDE_TILES, BatchReader, InlineReader, ReaderDied, ReaderPool, SlideRead, plan_bands,
)
from pathtwt.features.ring import Ring, RingSize
from pathtwt.features.sink import FeaturesSink, SlideState
from pathtwt.models.bf16_guard import AutoPrecision
from pathtwt.models.embedding import embed_tiles

log = logging.getLogger(__name__)

# on CPU, a job of at most this many batches of tiles is read in the embedding process
# (starting a reading process costs ~0.3 s, more than reading a batch or two here)
IN_PROCESS_BATCHES = 2
# bytes a batch's compressed native tiles may take in a ring slot, per tile of the batch
# (a 40x tile lies over about three 256 px native tiles of 20-60 KB each)
STREAM_BYTES_PER_TILE = 4 * 64 * 1024


class FeedTiming:
    """Who waited for whom over a job: the embedding process's time blocked on the next
    batch, the readers' time spent reading (summed), and the forward passes' time."""

    def __init__(self, workers: int, ring: str = "") -> None:
        self.workers = workers
        self.ring = ring  # the tile ring's size, said with the bound
        self.began = time.perf_counter()
        self.waited = 0.0
        self.reading = 0.0
        self.embedding = 0.0

    def shares(self) -> dict[str, float]:
        wall = max(time.perf_counter() - self.began, 1e-9)
        model = min(1.0, self.waited / wall)
        # in process, the reading is the model's wait and no reader ever waits
        readers = 0.0 if not self.workers else max(0.0, 1.0 - self.reading / (self.workers * wall))
        return {"model_waited_share": round(model, 4), "readers_waited_share": round(readers, 4)}

    def line(self) -> str:
        sh = self.shares()
        waited = sh["model_waited_share"]
        if self.workers:
            other = sh["readers_waited_share"]
            bound = "reading" if waited > other else "the model"
            return (f"extract: the model waited for tiles {waited:.0%} of the time and the {self.workers} reading "
                    f"process(es) waited for the model {other:.0%}: bound by {bound} (tile ring: {self.ring} of "
                    "shared memory)")
        wall = max(time.perf_counter() - self.began, 1e-9)
        model = min(1.0, self.embedding / wall)
        bound = "reading" if waited > model else "the model"
        return (f"extract: tiles read in this process: reading took {waited:.0%} of the time and the model "
                f"{model:.0%}: bound by {bound}")


class Embedder:
    """Normalise and embed uint8 tiles on the device, in the run's precision; on a GPU a
    forward pass that runs out of memory is split in halves (said once)."""

    def __init__(self, backbone: Any, embedding: str) -> None:
        self.backbone = backbone
        self.embedding = embedding
        self.micro: int | None = None  # the forward pass's tiles after an out-of-memory step-down

    def __call__(self, tiles: torch.Tensor) -> torch.Tensor:
        b = self.backbone
        x = b.transform.normalise_batch(tiles, b.device)
        size = self.micro or len(x)
        stepped = False
        while True:
            try:
                parts = [embed_tiles(b.model, x[i:i + size], b.spec.num_prefix_tokens, self.embedding)
                         for i in range(0, len(x), size)]
                break
            except torch.cuda.OutOfMemoryError:  # ROCm raises it too ("HIP out of memory")
                if size <= 1:
                    raise
                size, stepped = max(1, size // 2), True
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        if stepped:  # said once, with the size that fits
            self.micro = size
            print(f"extract: the GPU ran out of memory in a forward pass; going on with {size} tiles per pass "
                  f"(start with --batch-size {size} to skip this)", file=sys.stderr, flush=True)
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class HostBuffers:
    """Pinned host buffers the embeddings come back into (CUDA), reused once written."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._free: deque[torch.Tensor] = deque()
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, int]) -> torch.Tensor:
        with self._lock:
            while self._free:
                buf = self._free.popleft()
                if buf.shape[0] >= shape[0] and buf.shape[1] == shape[1]:
                    return buf[: shape[0]]
        return torch.empty(shape, dtype=torch.float32, pin_memory=True)

    def give(self, buf: torch.Tensor) -> None:
        base = buf if buf._base is None else buf._base
        with self._lock:
            self._free.append(base)


def embed_job(jobs: Sequence[Any], prepare: Callable[[Any], Any], backbone: Any, options: Any, decoding: Any,
              precision: AutoPrecision) -> Iterator[tuple[int, Any]]:
    """(job number, summary dict or the SlideError/NumericsError that stopped the slide)
    per job, as slides finish. ``prepare(job)`` checks a slide and gives its
    PreparedSlide; it runs in a thread as the readers reach the slide, not all before the
    first tile is read."""
    from tqdm import tqdm

    from pathtwt.features.gpu_decoders import make_decoder
    from pathtwt.io.h5 import count_coords
    from pathtwt.wsi.coords_tiles import cv2_pool_stopped

    device = torch.device(backbone.device)
    on_cuda = device.type == "cuda"
    size = int(backbone.transform.input_size)
    batch_size = options.resolved_batch_size(device)
    ship_bytes = decoding.where == "gpu"
    sizes = [count_coords(job.coords) for job in jobs]  # for the progress bar and the reader count
    workers = options.workers
    if workers is None:
        from pathtwt.devices import reading_workers

        workers = reading_workers(device)
    if not on_cuda and sum(-(-n // batch_size) for n in sizes) <= IN_PROCESS_BATCHES:
        workers = 0
    ring = Ring(RingSize.for_job(workers, batch_size, size * size * 3,
                                 batch_size * STREAM_BYTES_PER_TILE if ship_bytes else 0))
    modes = np.frombuffer(_shared_bytes(max(len(jobs), 1)), np.uint8)  # per slide: SLIDE_BYTES or SLIDE_TILES
    reader = BatchReader(ring, size, backbone.transform.resize, ship_bytes, modes)
    with cv2_pool_stopped(workers > 0):  # OpenCV's thread pool does not survive a fork
        source: Any = ReaderPool(reader, workers) if workers else InlineReader(reader)
    sink: FeaturesSink | None = None
    states: dict[int, SlideState] = {}
    unpin = lambda: None  # noqa: E731
    bar = tqdm(total=sum(sizes), unit="tile", disable=not options.progress, dynamic_ncols=True)
    try:
        unpin = pin_host_memory(ring, device)
        decoder = make_decoder(options.gpu_decoder or decoding.decoder, device) if ship_bytes else None
        made = DeviceTiles(ring, device, size, decoder=decoder,
                           use_tiles=lambda j: modes.__setitem__(j, SLIDE_TILES))
        timing = FeedTiming(workers, ring.describe())
        batches = 0  # the batches the job received (none: no closing line)
        embedder = Embedder(backbone, options.embedding)
        buffers = HostBuffers(device) if on_cuda else None
        side_stream = torch.cuda.Stream(device) if on_cuda else None
        in_flight: deque[tuple[Any, int | None]] = deque()  # (event, slot) of device work queued on a slot
        unprepared: queue.Queue = queue.Queue()  # (job number, why it could not be prepared)

        def finish_attrs(state: SlideState) -> dict[str, Any]:
            seconds = state.seconds
            state.outcome = {"slide": str(state.prepared.job.slide), "out": str(state.prepared.job.out),
                             "tiles": state.prepared.n, "seconds": seconds,
                             "tiles_per_s": state.prepared.n / max(seconds, 1e-9),
                             "embed_seconds": state.embed_seconds}
            return {"extract_seconds": seconds, "embed_seconds": state.embed_seconds,
                    # the CPU threads of the forward passes: a one-thread job (extract.threads 1,
                    # jobs side by side) embeds at a lower tiles/s than one with every core
                    "torch_threads": torch.get_num_threads(), **timing.shares(), "reading_workers": workers,
                    "forward_batch": embedder.micro or batch_size, "decode": decoding.describe(),
                    "tile_ring": ring.describe(),
                    # native tiles decoded by the readers (CPU path) and on the device (GPU path,
                    # the job's so far): against the natives under the tiles, the decode amplification
                    "native_tiles_decoded": state.decoded, "device_natives_decoded": made.counts.decoded}

        sink = FeaturesSink(finish_attrs)

        def feed() -> None:
            """Prepare each slide when the job reaches it and hand its bands to the readers."""
            next_band = 0
            try:
                for number, job in enumerate(jobs):
                    try:
                        item = prepare(job)
                    except (SlideError, NumericsError) as exc:
                        unprepared.put((number, exc))
                        continue
                    state = states[number] = SlideState(item, number, left=-(-item.n // batch_size))
                    if state.left == 0:
                        sink.finish(state)
                        continue
                    read = SlideRead(number, item.geometry, item.xy, item.band_rows)
                    bands = plan_bands(read, batch_size, next_band, item.level_ys)
                    next_band += len(bands)
                    source.add(read, bands)
            except BaseException as exc:  # noqa: BLE001 - raised in the loop's thread
                unprepared.put((-1, exc))
            finally:
                source.close_input()

        def release_done(wait: bool = False) -> None:
            while in_flight and (wait or in_flight[0][0].query()):
                event, slot = in_flight.popleft()
                if wait:
                    event.synchronize()
                source.release(slot)

        def outcomes(finished: Sequence[SlideState]) -> Iterator[tuple[int, Any]]:
            while True:
                try:
                    number, exc = unprepared.get_nowait()
                except queue.Empty:
                    break
                if number < 0:
                    raise exc
                bar.update(sizes[number])
                yield number, exc
            for state in finished:
                yield state.number, state.error if state.failed else state.outcome

        def settle(state: SlideState, tiles: int) -> None:
            bar.update(tiles)
            state.left -= 1
            if state.left == 0:
                sink.finish(state)

        feeder = threading.Thread(target=feed, name="pathtwt-slide-feeder", daemon=True)
        feeder.start()
        last = time.perf_counter()  # each batch's share of the job's wall time goes to its slide
        with torch.inference_mode(), precision.job_context(device, backbone.model):
            while True:
                waited = time.perf_counter()
                try:
                    msg = source.get()
                except ReaderDied as died:
                    raise _died_line(died, states) from None
                timing.waited += time.perf_counter() - waited
                if msg is None:
                    break
                batches += 1
                timing.reading += msg.seconds
                state = states[msg.slide]
                state.decoded += msg.decoded
                if msg.kind == "error":
                    state.fail(_read_error(state, msg.start, msg.end, msg.error))
                began = time.perf_counter()
                tiles = None
                if not state.failed:
                    try:
                        with torch.cuda.stream(side_stream) if side_stream is not None else contextlib.nullcontext():
                            tiles = made.batch(msg)
                            ready = torch.cuda.Event() if on_cuda else None
                            if ready is not None:
                                ready.record()
                    except UndecodableTile as exc:
                        state.fail(SlideError(f"{state.prepared.job.slide}: {exc}; the file is corrupt or truncated: "
                                              "re-export or exclude it"))
                if tiles is None:  # the slide failed: its remaining batches are dropped
                    made.forget(msg.band)
                    source.release(msg.slot)
                elif on_cuda:
                    compute = torch.cuda.current_stream(device)
                    compute.wait_event(ready)
                    tiles.record_stream(compute)
                    in_flight.append((ready, msg.slot))
                    start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start_ev.record()
                    feats = embedder(tiles)
                    end_ev.record()
                    host = buffers.take(tuple(feats.shape))
                    host.copy_(feats, non_blocking=True)
                    done = torch.cuda.Event()
                    done.record()
                    sink.write(state, msg.start, host, ready=done, release=lambda h=host: buffers.give(h),
                               timing=(start_ev, end_ev))
                    release_done()
                else:
                    feats = embedder(tiles)
                    source.release(msg.slot)  # the normalisation has read the tiles out of the slot
                    state.embed_seconds += time.perf_counter() - began
                    sink.write(state, msg.start, feats.float())
                now = time.perf_counter()
                timing.embedding += now - began
                state.seconds, last = state.seconds + now - last, now
                settle(state, msg.end - msg.start)
                yield from outcomes(sink.done())
            release_done(wait=True)
        feeder.join()
        closing, sink = sink.close(), None
        yield from outcomes(closing)
        if batches:
            print(timing.line(), file=sys.stderr, flush=True)
    finally:
        bar.close()
        source.stop()
        if sink is not None:  # the job stopped early: no slide left half-written
            try:
                sink.abandon(list(states.values()))
            except Exception:  # noqa: BLE001 - the error that stopped the job is the one raised
                pass
        unpin()
        ring.close()


def _read_error(state: SlideState, start: int, end: int, error: str) -> SlideError:
    xy = state.prepared.xy
    (x0, y0), (x1, y1) = xy[start], xy[end - 1]
    where = f"tile at level-0 (x={x0}, y={y0})" if end - start == 1 else \
        f"tiles {start}-{end - 1} (level-0 x={x0}, y={y0} to x={x1}, y={y1})"
    return SlideError(f"{state.prepared.job.slide}: cannot read {where}: {error}")


def _died_line(died: ReaderDied, states: dict[int, SlideState]) -> PathtwtError:
    slide = states[died.slide].prepared.job.slide if died.slide in states else "a slide"
    return PathtwtError(
        f"extract: {died} while reading {slide}; no features file of an unfinished slide was written. "
        "If the system killed it for memory, lower --workers or --batch-size; rerun with --skip-existing to "
        "keep the slides already done")


def _shared_bytes(n: int) -> Any:
    import mmap

    return mmap.mmap(-1, n, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
