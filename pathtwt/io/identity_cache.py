"""A value computed from a file's bytes (a slide's fingerprint, a weights file's sha256),
kept in a JSON file by the file's identity, so a plan of ten thousand slides or 1-4 GB of
weights reads each file once, not at every plan.

A kept value is reused while the file's device, inode, size, modification and change times
are those recorded: a file rewritten or replaced under the same name changes its change
time, which no tool can set back. Two writers at once each write a whole file by rename:
one's additions may be lost, never a file half written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pathtwt.errors import PathtwtError


def file_identity(path: str | os.PathLike) -> list[int]:
    """The file's device, inode, size, modification and change times (ns)."""
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class IdentityCache:
    """Values by name (a path, or a file name within ``scope``) in the JSON file ``file``
    (None: nothing kept), read when first asked for and written back by :meth:`save` when
    something was added. A file kept for another ``scope`` is ignored."""

    def __init__(self, file: str | os.PathLike | None, scope: str = ""):
        self.file = Path(file) if file is not None else None
        self.scope = scope
        self._entries: dict[str, list] | None = None
        self._changed = False

    def value(self, name: str, identity: list[int]) -> Any | None:
        """The value kept for ``name`` while its file still has ``identity``; else None."""
        kept = self._load().get(name)
        return kept[5] if kept is not None and kept[:5] == identity else None

    def previous(self, name: str) -> Any | None:
        """The value kept for ``name`` whatever its identity (None: never kept)."""
        kept = self._load().get(name)
        return kept[5] if kept is not None else None

    def put(self, name: str, identity: list[int], value: Any) -> None:
        self._load()[name] = identity + [value]
        self._changed = True

    def save(self) -> None:
        """Write the file back if something was added (a cache that cannot be written only
        costs the next plan its reads)."""
        if self.file is None or not self._changed:
            return
        from pathtwt.io.atomic import write_json_atomic

        try:
            write_json_atomic(self.file, {"scope": self.scope, "files": self._load()})
        except (OSError, PathtwtError):
            pass
        self._changed = False

    def _load(self) -> dict[str, list]:
        if self._entries is None:
            self._entries = {}
            if self.file is not None:
                try:
                    data = json.loads(self.file.read_text(encoding="utf-8"))
                    if data.get("scope") == self.scope:
                        self._entries = dict(data.get("files") or {})
                except (OSError, ValueError, AttributeError, TypeError):
                    pass  # not kept yet (or unreadable): the files are read again
        return self._entries
