"""An entry's record: its kind, key, format and the inputs the key was derived from, plus
how it was made (host, time, pathtwt version, and names a reader knows it by: a slide's id,
a backbone and variant). Only ``inputs`` make the key; ``made`` is provenance.

A record is checked before its entry is used: the inputs must give the key it is stored
under, or the entry was moved by hand or corrupted and is refused in one line."""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
from pathlib import Path
from typing import Any, Mapping

from pathtwt.errors import StoreError
from pathtwt.io.store.keys import FORMATS, canonical, entry_key


def new_record(kind: str, inputs: Mapping[str, Any], names: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The record of an entry of ``kind`` made from ``inputs`` (its key computed here)."""
    from pathtwt import __version__

    return {
        "kind": kind, "key": entry_key(kind, inputs), "format": FORMATS[kind],
        "inputs": json.loads(canonical(inputs)),
        "made": {"host": socket.gethostname(), "pid": os.getpid(), "pathtwt": __version__,
                 "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **dict(names or {})},
    }


def read_record(path: str | os.PathLike) -> dict[str, Any]:
    """The record at ``path``; StoreError (one line) when it cannot be read as one."""
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StoreError(f"{path}: store record missing; the entry is not complete: delete it "
                         "(pathtwt store gc) and run the workflow again") from None
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path}: unreadable store record ({exc}); delete the entry and run the workflow again") from None
    if not isinstance(record, dict) or not {"kind", "key", "inputs"} <= set(record):
        raise StoreError(f"{path}: not a store record (no kind, key and inputs); delete the entry and run the "
                         "workflow again")
    return record


def check_record(path: str | os.PathLike, record: Mapping[str, Any], *, kind: str, key: str) -> None:
    """Refuse (StoreError, one line naming ``path``) a record that is not of ``kind`` or whose
    inputs do not give ``key``, the key the entry is stored under."""
    if record.get("kind") != kind:
        raise StoreError(f"{path}: a {record.get('kind')} record where a {kind} entry is expected; the store was "
                         "changed by hand: delete the entry and run the workflow again")
    derived = entry_key(kind, record["inputs"])
    if derived != key or record.get("key") != key:
        raise StoreError(f"{path}: its recorded inputs give key {derived}, not {key} (moved by hand or corrupted); "
                         "delete the entry (pathtwt store gc removes it) and run the workflow again")


def read_checked(path: str | os.PathLike, *, kind: str, key: str) -> dict[str, Any]:
    """The record at ``path``, checked against ``kind`` and ``key``."""
    record = read_record(path)
    check_record(path, record, kind=kind, key=key)
    return record
