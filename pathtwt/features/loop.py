"""The embedding loop of an extraction job: batches in, features files out.

One process owns the model and the device. It takes each batch the reading processes
announce (:mod:`reading`), makes its uint8 tiles on the device (:mod:`device_tiles`:
copied from the ring, or decoded, cut and shrunk there), normalises them, runs the forward
pass, and hands the embeddings to the writer thread (:mod:`sink`). Nothing in the loop
waits for the device: the embeddings come back into pinned buffers with a CUDA event,
the finite check runs on the host in the writer thread, and on a GPU the decode of the
next batch runs on a second stream while this one's forward pass runs. The weights are
cast to the run's precision once (:meth:`~pathtwt.models.bf16_guard.AutoPrecision.job_context`);
the tiles are cut, shrunk and normalised in IEEE fp32 inside it
(:class:`~pathtwt.models.precision.exact_fp32`).
Running out of GPU memory anywhere on the device path (decode, stack, cut, shrink,
normalisation, forward pass) splits that batch and the rest of the job's in halves, said
once (:mod:`step_down`), and the job goes on.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from pathtwt.errors import NumericsError, PathtwtError, SlideError
from pathtwt.features.device_tiles import DeviceBatch, DeviceTiles, SlideDecode, UndecodableTile, pin_host_memory
from pathtwt.features.reading import (
    SLIDE_TILES, BatchMessage, BatchReader, InlineReader, ReaderDied, ReaderPool, SlideRead, plan_bands,
)
from pathtwt.features.ring import Ring, RingSize
from pathtwt.features.sink import FeaturesSink, SlideState
from pathtwt.features.step_down import StepDown
from pathtwt.models.bf16_guard import AutoPrecision
from pathtwt.models.embedding import embed_tiles
from pathtwt.models.precision import exact_fp32

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


@dataclass
class Made:
    """A batch's tiles as :meth:`EmbedJob.make_tiles` queued them: ``tiles`` the whole
    batch on the device, or None once batches go in parts (made where they are embedded);
    ``ready`` the event after them on the side stream, ``timing`` the events around their
    embedding (CUDA)."""

    batch: DeviceBatch
    tiles: torch.Tensor | None
    ready: Any = None
    timing: Any = None


# how long a job that stopped early waits for the slide its feeder is preparing (EmbedJob._stop_feeder)
FEEDER_WAIT_S = 30.0


class EmbedJob:
    """The embedding loop of one job; iterating it gives (job number, summary dict or the
    SlideError/NumericsError that stopped the slide) per job, as slides finish.
    ``prepare(job)`` checks a slide and gives its PreparedSlide; it runs in a thread as the
    readers reach the slide, not all before the first tile is read.

    Each batch goes through :meth:`receive`, :meth:`make_tiles`, :meth:`embed`,
    :meth:`hand_to_writer` and :meth:`settle`; :meth:`close` ends the job."""

    def __init__(self, jobs: Sequence[Any], prepare: Callable[[Any], Any], backbone: Any, options: Any,
                 decoding: Any, precision: AutoPrecision) -> None:
        from pathtwt.io.h5 import count_coords

        self.jobs, self.prepare, self.backbone = jobs, prepare, backbone
        self.options, self.decoding, self.precision = options, decoding, precision
        self.device = torch.device(backbone.device)
        self.on_cuda = self.device.type == "cuda"
        self.batch_size = options.resolved_batch_size(self.device)
        self.sizes = [count_coords(job.coords) for job in jobs]  # for the progress bar and the reader count
        self.states: dict[int, SlideState] = {}
        self.unprepared: queue.Queue = queue.Queue()  # (job number, why it could not be prepared)
        self.in_flight: deque[tuple[Any, int | None]] = deque()  # (event, slot) of device work queued on a slot
        self.steps = StepDown()
        self.batches = 0  # the batches the job received (none: no closing line)
        self.fell_back = 0  # slides of the GPU path decoded on the CPU in whole or in part
        self.sink: FeaturesSink | None = None
        self.device_tiles: DeviceTiles | None = None
        self.feeder: threading.Thread | None = None
        self.stopping = threading.Event()  # the job stopped early: the feeder prepares no further slide

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        from tqdm import tqdm

        self.bar = tqdm(total=sum(self.sizes), unit="tile", disable=not self.options.progress, dynamic_ncols=True)
        self.unpin: Callable[[], None] = lambda: None
        self.ring = self.source = None
        try:
            self._start()
            with torch.inference_mode(), self.precision.job_context(self.device, self.backbone.model):
                while (msg := self.receive()) is not None:
                    began = time.perf_counter()
                    state = self.states[msg.slide]
                    made = self.make_tiles(msg, state)
                    if made is not None:
                        self.hand_to_writer(msg, state, made, self.embed(made), began)
                    else:  # the slide failed: its remaining batches are dropped
                        self.device_tiles.forget(msg.band)
                        self.source.release(msg.slot)
                    self.settle(msg, state, began)
                    yield from self.outcomes(self.sink.done())
            yield from self.close()
        finally:
            self._stop()

    # -- the job's start and end -----------------------------------------------------------
    def _start(self) -> None:
        from pathtwt.features import gpu_decoders
        from pathtwt.wsi.coords_tiles import cv2_pool_stopped

        options, size = self.options, int(self.backbone.transform.input_size)
        ship_bytes = self.decoding.where == "gpu"
        workers = options.workers
        if workers is None:
            from pathtwt.devices import reading_workers

            workers = reading_workers(self.device)
        if not self.on_cuda and sum(-(-n // self.batch_size) for n in self.sizes) <= IN_PROCESS_BATCHES:
            workers = 0
        self.workers = workers
        self.ring = Ring(RingSize.for_job(workers, self.batch_size, size * size * 3,
                                          self.batch_size * STREAM_BYTES_PER_TILE if ship_bytes else 0))
        modes = np.frombuffer(_shared_bytes(max(len(self.jobs), 1)), np.uint8)  # per slide: SLIDE_BYTES or SLIDE_TILES
        reader = BatchReader(self.ring, size, self.backbone.transform.resize, ship_bytes, modes)
        with cv2_pool_stopped(workers > 0):  # OpenCV's thread pool does not survive a fork
            self.source = ReaderPool(reader, workers) if workers else InlineReader(reader)
        self.unpin = pin_host_memory(self.ring, self.device)
        decoder = gpu_decoders.shared_decoder(options.gpu_decoder or self.decoding.decoder, self.device) \
            if ship_bytes else None
        self.device_tiles = DeviceTiles(self.ring, self.device, size, decoder=decoder,
                                use_tiles=lambda j: modes.__setitem__(j, SLIDE_TILES), steps=self.steps,
                                slide_name=lambda j: str(self.jobs[j].slide))
        self.timing = FeedTiming(workers, self.ring.describe())
        self.buffers = HostBuffers(self.device) if self.on_cuda else None
        self.side_stream = torch.cuda.Stream(self.device) if self.on_cuda else None
        self.sink = FeaturesSink(self.finish_attrs)
        self.feeder = threading.Thread(target=self.feed, name="pathtwt-slide-feeder", daemon=True)
        self.feeder.start()
        self.last = time.perf_counter()  # each batch's share of the job's wall time goes to its slide

    def _stop(self) -> None:
        self.bar.close()
        self._stop_feeder()
        if self.source is not None:
            self.source.stop()
        if self.sink is not None:  # the job stopped early: no slide left half-written
            try:
                self.sink.abandon(list(self.states.values()))
            except Exception:  # noqa: BLE001 - the error that stopped the job is the one raised
                pass
        if self.device_tiles is not None:
            self.device_tiles.close()  # the decoder's buffers kept for this job's streams
        self.unpin()
        if self.ring is not None:
            self.ring.close()

    def _stop_feeder(self) -> None:
        """Let the feeder finish the slide it is preparing, at most :data:`FEEDER_WAIT_S`,
        and prepare no further one, before the readers' queues close. A feeder left running
        would go on reading the next slides after the job ended, and its hand-off to the
        closed queues would raise in its thread: a traceback ("Queue ... is closed") after the
        job's own error line."""
        self.stopping.set()
        if self.feeder is not None and self.feeder.is_alive():
            self.feeder.join(FEEDER_WAIT_S)

    def feed(self) -> None:
        """Prepare each slide when the job reaches it and hand its bands to the readers (a
        thread)."""
        next_band = 0
        try:
            for number, job in enumerate(self.jobs):
                if self.stopping.is_set():
                    break
                try:
                    item = self.prepare(job)
                except (SlideError, NumericsError) as exc:
                    self.unprepared.put((number, exc))
                    continue
                state = self.states[number] = SlideState(item, number, left=-(-item.n // self.batch_size))
                if state.left == 0:
                    self.sink.finish(state)
                    continue
                read = SlideRead(number, item.geometry, item.xy, item.band_rows)
                bands = plan_bands(read, self.batch_size, next_band, item.level_ys)
                next_band += len(bands)
                self.source.add(read, bands)
        except BaseException as exc:  # noqa: BLE001 - raised in the loop's thread
            self.unprepared.put((-1, exc))
        finally:
            self.source.close_input()

    # -- a batch's steps -------------------------------------------------------------------
    def receive(self) -> BatchMessage | None:
        """The next batch the readers announce (None when they are done), its slide told
        what the readers did for it."""
        waited = time.perf_counter()
        try:
            msg = self.source.get()
        except ReaderDied as died:
            raise _died_line(died, self.states) from None
        self.timing.waited += time.perf_counter() - waited
        if msg is None:
            return None
        self.batches += 1
        self.timing.reading += msg.seconds
        state = self.states[msg.slide]
        state.decoded += msg.decoded
        if msg.kind == "error":
            state.fail(_read_error(state, msg.start, msg.end, msg.error))
        return msg

    def make_tiles(self, msg: BatchMessage, state: SlideState) -> Made | None:
        """The batch's uint8 tiles on the device, queued on the side stream on a GPU (the
        forward pass of the batch before runs meanwhile); None when the slide has failed."""
        if state.failed:
            return None
        try:
            with torch.cuda.stream(self.side_stream) if self.side_stream is not None else contextlib.nullcontext():
                batch = self.device_tiles.batch(msg)
                tiles = self.steps.whole(batch.n, batch.make, "cutting and shrinking the tiles")
                ready = torch.cuda.Event() if self.on_cuda else None
                if ready is not None:
                    ready.record()
        except UndecodableTile as exc:
            state.fail(SlideError(f"{state.prepared.job.slide}: {exc}; the file is corrupt or truncated: re-export or "
                                  "exclude it"))
            return None
        return Made(batch, tiles, ready)

    def embed(self, made: Made) -> torch.Tensor:
        """Normalise and embed the tiles on the compute stream, in parts once the GPU ran
        out of memory (the tiles then made part by part here)."""
        if made.ready is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(made.ready)
            if made.tiles is not None:
                made.tiles.record_stream(compute)
            else:
                made.batch.used_on(compute)
            made.timing = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            made.timing[0].record()
        b, n = self.backbone, made.batch.n

        def part(lo: int, hi: int) -> torch.Tensor:
            if made.tiles is None:
                tiles = made.batch.tiles(lo, hi)
            else:
                tiles = made.tiles if (lo, hi) == (0, n) else made.tiles[lo:hi]
            with exact_fp32(b.device):  # the pixels' arithmetic, not the model's: outside autocast
                x = b.transform.normalise_batch(tiles, b.device)
            return embed_tiles(b.model, x, b.spec.num_prefix_tokens, self.options.embedding)

        parts = self.steps.run(n, part, "in a forward pass" if made.tiles is not None else
                               "making and embedding the tiles")
        self.steps.say()
        feats = parts[0] if len(parts) == 1 else torch.cat(parts)
        if made.timing is not None:
            made.timing[1].record()
        return feats

    def hand_to_writer(self, msg: BatchMessage, state: SlideState, made: Made, feats: torch.Tensor,
                       began: float) -> None:
        """The embeddings to the writer thread: on a GPU copied into a pinned buffer after
        an event, the slot given back once the device has read it; nothing waits here."""
        if not self.on_cuda:
            self.source.release(msg.slot)  # the normalisation has read the tiles out of the slot
            state.embed_seconds += time.perf_counter() - began
            self.sink.write(state, msg.start, feats.float())
            return
        host = self.buffers.take(tuple(feats.shape))
        host.copy_(feats, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        # made whole, the tiles left the slot by the side stream's event; in parts, the
        # compute stream read the slot (a batch of finished tiles) up to the copy
        self.in_flight.append((made.ready if made.tiles is not None else done, msg.slot))
        self.sink.write(state, msg.start, host, ready=done, release=lambda h=host: self.buffers.give(h),
                        timing=made.timing)
        self.release_done()

    def settle(self, msg: BatchMessage, state: SlideState, began: float) -> None:
        """Book the batch to its slide; its last batch hands the slide to the writer."""
        now = time.perf_counter()
        self.timing.embedding += now - began
        state.seconds, self.last = state.seconds + now - self.last, now
        self.bar.update(msg.end - msg.start)
        state.left -= 1
        if state.left == 0:
            state.decoding = self.device_tiles.take_record(msg.slide)
            if self.decoding.where == "gpu" and state.decoding.fallback() and not state.failed:
                self.fell_back += 1
            self.sink.finish(state)

    def close(self) -> Iterator[tuple[int, Any]]:
        """Wait for the device and the writer; the last outcomes and the closing line."""
        self.release_done(wait=True)
        self.feeder.join()
        closing, self.sink = self.sink.close(), None
        yield from self.outcomes(closing)
        if self.batches:
            line = self.timing.line()
            if self.fell_back:
                line += (f"; {self.fell_back} slide(s) were decoded on the CPU in whole or in part instead of on the "
                         "GPU (their features files' decode_fallback says why)")
            print(line, file=sys.stderr, flush=True)

    # -- helpers ---------------------------------------------------------------------------
    def release_done(self, wait: bool = False) -> None:
        """Give back the slots whose device work is done (all of them: ``wait``)."""
        while self.in_flight and (wait or self.in_flight[0][0].query()):
            event, slot = self.in_flight.popleft()
            if wait:
                event.synchronize()
            self.source.release(slot)

    def outcomes(self, finished: Sequence[SlideState]) -> Iterator[tuple[int, Any]]:
        while True:
            try:
                number, exc = self.unprepared.get_nowait()
            except queue.Empty:
                break
            if number < 0:
                raise exc
            self.bar.update(self.sizes[number])
            yield number, exc
        for state in finished:
            yield state.number, state.error if state.failed else state.outcome

    def finish_attrs(self, state: SlideState) -> dict[str, Any]:
        """A finished slide's attributes and summary (the writer thread)."""
        seconds, prepared = state.seconds, state.prepared
        state.outcome = {"slide": str(prepared.job.slide), "out": str(prepared.job.out), "tiles": prepared.n,
                         "seconds": seconds, "tiles_per_s": prepared.n / max(seconds, 1e-9),
                         "embed_seconds": state.embed_seconds}
        decoding = state.decoding or SlideDecode()
        return {"extract_seconds": seconds, "embed_seconds": state.embed_seconds,
                # the CPU threads of the forward passes: a one-thread job (extract.threads 1,
                # jobs side by side) embeds at a lower tiles/s than one with every core
                "torch_threads": torch.get_num_threads(), **self.timing.shares(), "reading_workers": self.workers,
                "forward_batch": self.steps.size or self.batch_size, "tile_ring": self.ring.describe(),
                # where its native tiles were decoded: against the natives under the tiles, the
                # decode amplification
                **decoding.attrs(self.decoding.describe(), self.decoding.where == "gpu", state.decoded)}


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
