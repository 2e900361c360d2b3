"""Messages of the slide-reading libraries, kept instead of printed.

tifffile logs through the ``tifffile`` logger (e.g. "invalid offset to first page") and
tiffslide and tifffile raise Python warnings (e.g. about Hamamatsu metadata). Printed,
they land in the user's terminal between pathtwt's own lines with no slide named; here
they are collected per slide, logged on the ``pathtwt.readers`` logger at INFO level,
recorded in the coords file (``reader_notes``) and added to the error line when the
slide cannot be read.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Iterator

READER_LOGGERS = ("tifffile", "tiffslide", "openslide")
MAX_NOTES = 20  # a corrupt file can log once per tile: keep the first few

log = logging.getLogger("pathtwt.readers")


class _Collect(logging.Handler):
    def __init__(self, notes: list[str]):
        super().__init__(level=logging.DEBUG)
        self.notes = notes

    def emit(self, record: logging.LogRecord) -> None:
        add_note(self.notes, f"{record.name}: {record.getMessage()}")


def add_note(notes: list[str], text: str) -> None:
    text = " ".join(str(text).split())
    if text and text not in notes and len(notes) < MAX_NOTES:
        notes.append(text)
        log.info(text)


@contextlib.contextmanager
def capture_reader_messages(notes: list[str]) -> Iterator[list[str]]:
    """Inside the block, reader-library log records and Python warnings go to ``notes``
    (deduplicated, at most MAX_NOTES) instead of the terminal."""
    handler = _Collect(notes)
    loggers = [logging.getLogger(name) for name in READER_LOGGERS]
    saved = [(lg.propagate, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.propagate = False
        if lg.level == logging.NOTSET or lg.level > logging.WARNING:
            lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield notes
            finally:
                for w in caught:
                    add_note(notes, f"{w.category.__name__}: {w.message}")
    finally:
        for lg, (propagate, level) in zip(loggers, saved):
            lg.removeHandler(handler)
            lg.propagate = propagate
            lg.setLevel(level)
