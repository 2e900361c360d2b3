"""The features files of a job, written by one thread beside the embedding loop.

The loop hands over each batch's embeddings as they leave the device (a pinned host buffer
and the CUDA event after its copy, or a CPU tensor) and never waits for a write: the thread
waits for the copy, checks that every embedding is finite, writes the rows, and publishes a
slide's file (temporary name, renamed) once its last batch is in. Every HDF5 write of the
job is made here, in one thread.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from pathtwt.errors import NumericsError
from pathtwt.io.h5 import FeaturesWriter


@dataclass
class SlideState:
    """One slide of a job while its batches come in."""

    prepared: Any  # pathtwt.features.jobs.PreparedSlide
    number: int
    left: int  # batches not yet embedded (or dropped, once the slide failed)
    # the job's wall time spent on this slide's batches (waiting for each, then embedding
    # it): summed over a job's slides, the job's wall time, however its slides overlap
    seconds: float = 0.0
    embed_seconds: float = 0.0
    decoded: int = 0  # native tiles the readers decoded for it (the CPU path)
    decoding: Any = None  # device_tiles.SlideDecode: where the GPU path decoded its native tiles
    error: Exception | None = None
    writer: FeaturesWriter | None = None
    outcome: Any = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error


class FeaturesSink:
    """A writer thread; :meth:`done` gives the slides it has finished, in the order they finished."""

    def __init__(self, finish_attrs: Callable[[SlideState], dict[str, Any]]) -> None:
        self.finish_attrs = finish_attrs
        self._queue: queue.Queue = queue.Queue(maxsize=64)
        self._done: queue.Queue = queue.Queue()
        self._fatal: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pathtwt-features-writer", daemon=True)
        self._thread.start()

    # -- the loop's side ------------------------------------------------------------------
    def write(self, state: SlideState, start: int, features: Any, ready: Any = None, release: Any = None,
              timing: Any = None) -> None:
        """Rows ``start``... of ``state``'s file: ``features`` (a CPU tensor or array),
        valid once ``ready`` (a CUDA event) has passed; ``release()`` after the write hands
        the host buffer back; ``timing`` (start, end CUDA events) adds to embed_seconds."""
        self._put(("write", state, start, features, ready, release, timing))

    def finish(self, state: SlideState) -> None:
        self._put(("finish", state))

    def done(self) -> list[SlideState]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        self._raise()
        return out

    def close(self) -> list[SlideState]:
        """Wait for every queued write; the slides finished since the last :meth:`done`."""
        self._put(None)
        self._thread.join()
        return self.done()

    def abandon(self, states: list[SlideState]) -> None:
        """The job stopped: every slide still open is closed unpublished (its temporary
        file removed), after the writes already queued."""
        if self._thread.is_alive():
            self._queue.put(("abandon", states))
            self._queue.put(None)
            self._thread.join()
        for state in states:  # the thread stopped early (a full disk): close what it left open
            _abort(state, state.error or RuntimeError("the job stopped"))

    def _put(self, item: Any) -> None:
        while True:
            self._raise()
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def _raise(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if item[0] == "write":
                    self._write(*item[1:])
                elif item[0] == "finish":
                    self._finish(item[1])
                else:
                    for state in item[1]:
                        _abort(state, state.error or RuntimeError("the job stopped"))
            except BaseException as exc:  # noqa: BLE001 - a full disk, say: the job stops, in the loop's thread
                self._fatal = exc  # raised there; its cleanup (abandon) closes the open files unpublished
                return

    def _write(self, state: SlideState, start: int, features: Any, ready: Any, release: Any, timing: Any) -> None:
        try:
            if ready is not None:
                ready.synchronize()
            if timing is not None:
                state.embed_seconds += timing[0].elapsed_time(timing[1]) / 1000.0
            if state.failed:
                return
            rows = np.asarray(features.numpy() if hasattr(features, "numpy") else features, dtype=np.float32)
            finite = np.isfinite(rows).all(axis=1)
            if not finite.all():
                x, y = state.prepared.xy[start + int(np.flatnonzero(~finite)[0])]
                state.fail(NumericsError(
                    f"{state.prepared.job.slide}: NaN/inf features (first at tile x={x}, y={y}) with precision "
                    f"{state.prepared.attrs.get('precision', '')}; retry with --precision fp32 or check the weights"))
                return
            if state.writer is None:
                state.writer = FeaturesWriter(state.prepared.job.out, n_tiles=state.prepared.n,
                                              dim=state.prepared.attrs["embedding_dim"], attrs=state.prepared.attrs)
                state.writer.__enter__()
                state.writer.coords[...] = state.prepared.xy
            state.writer.features[start:start + len(rows)] = rows
        finally:
            if release is not None:
                release()

    def _finish(self, state: SlideState) -> None:
        if not state.failed:
            if state.writer is None:  # a slide without tiles: an empty, valid file
                state.writer = FeaturesWriter(state.prepared.job.out, n_tiles=0,
                                              dim=state.prepared.attrs["embedding_dim"], attrs=state.prepared.attrs)
                state.writer.__enter__()
            state.writer.h5.attrs.update(self.finish_attrs(state))
            writer, state.writer = state.writer, None
            writer.__exit__(None, None, None)
        else:
            _abort(state, state.error)
        self._done.put(state)


def _abort(state: SlideState, exc: BaseException | None) -> None:
    """Close a slide's temporary file without publishing it."""
    writer, state.writer = state.writer, None
    if writer is not None:
        try:
            writer.__exit__(type(exc), exc, None)
        except Exception:  # noqa: BLE001 - the file is unpublished either way; the first error is the one said
            pass
