"""Where each entry of a store lies, and whether it is there (published).

Whether an entry is there is read from folder listings, one listing per folder and kept
for the life of the :class:`Store` object (a plan reads ``tiles/`` once, not once per
slide): a file entry is there when its record and its files are (``tiles/{T}.json`` and
the coords and thumbnail: one deleted by hand makes the entry again), a slide's features
when its file is (``features/{E}/{T}.h5``), a folder entry when its folder holds its record.
Names starting with "." are never entries (temporary files, locks, entries being built).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pathtwt.errors import StoreError

STORE_FORMAT = "pathtwt-store/1"
MARKER = "STORE.json"
RECORD = "entry.json"  # a folder entry's record
KINDS = ("tiles", "calibration", "discovery", "models", "features")


@dataclass(frozen=True)
class TilesEntry:
    coords: Path
    thumbnail: Path
    record: Path


@dataclass(frozen=True)
class FileEntry:
    file: Path
    record: Path


class Store:
    """The store at ``root`` (relative roots are taken from the working directory)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self._listings: dict[Path, frozenset[str]] = {}

    # where an entry of each kind lies below the store's folder (folders up from its path)
    _DEPTH = {"tiles": 2, "calibration": 2, "discovery": 2, "model": 2, "extractor": 3, "features-set": 4}

    @classmethod
    def of_entry(cls, kind: str, entry: str | os.PathLike) -> "Store":
        """The store an entry of ``kind`` lies in (an extractor's entry: a slide's features file)."""
        return cls(Path(entry).parents[cls._DEPTH[kind] - 1])

    # ---- where ------------------------------------------------------------------------

    def tiles(self, key: str) -> TilesEntry:
        folder = self.root / "tiles"
        return TilesEntry(folder / f"{key}.coords.h5", folder / f"{key}.thumbnail.png", folder / f"{key}.json")

    def calibration(self, key: str) -> FileEntry:
        folder = self.root / "calibration"
        return FileEntry(folder / f"{key}.h5", folder / f"{key}.json")

    def discovery(self, key: str) -> Path:
        return self.root / "discovery" / key

    def model(self, key: str) -> Path:
        return self.root / "models" / key

    def extractor(self, key: str) -> Path:
        return self.root / "features" / key

    def features(self, extractor: str, tiles: str) -> Path:
        return self.extractor(extractor) / f"{tiles}.h5"

    def features_set(self, extractor: str, key: str) -> Path:
        return self.extractor(extractor) / "sets" / f"{key}.json"

    @staticmethod
    def building(folder: Path) -> Path:
        """Where a folder entry is built before it is renamed into place (kept between
        attempts, so a job that resumes, e.g. a distillation from its checkpoint, finds its
        files again)."""
        return folder.parent / f".{folder.name}.build"

    @property
    def locks(self) -> Path:
        return self.root / ".locks"

    # ---- whether it is there ----------------------------------------------------------

    def listing(self, folder: Path) -> frozenset[str]:
        """The names in ``folder`` (none when it does not exist), read once."""
        if folder not in self._listings:
            try:
                with os.scandir(folder) as it:
                    self._listings[folder] = frozenset(e.name for e in it if not e.name.startswith("."))
            except (FileNotFoundError, NotADirectoryError):
                self._listings[folder] = frozenset()
        return self._listings[folder]

    def has_tiles(self, key: str) -> bool:
        names = self.listing(self.root / "tiles")
        return {f"{key}.json", f"{key}.coords.h5", f"{key}.thumbnail.png"} <= names

    def has_calibration(self, key: str) -> bool:
        return {f"{key}.json", f"{key}.h5"} <= self.listing(self.root / "calibration")

    def has_folder_entry(self, folder: Path) -> bool:
        return folder.name in self.listing(folder.parent) and (folder / RECORD).is_file()

    def has_features(self, extractor: str, tiles: str) -> bool:
        return f"{tiles}.h5" in self.listing(self.extractor(extractor))

    def has_features_set(self, extractor: str, key: str) -> bool:
        return f"{key}.json" in self.listing(self.extractor(extractor) / "sets")

    def has(self, name: str) -> bool:
        """Whether the entry named ``name`` (``tiles/T``, ``calibration/C``, ``discovery/D``,
        ``models/M``, ``features/E/T``, ``features/E/sets/S``) is there."""
        kind, _, rest = name.partition("/")
        if kind == "tiles":
            return self.has_tiles(rest)
        if kind == "calibration":
            return self.has_calibration(rest)
        if kind in ("discovery", "models"):
            return self.has_folder_entry(self.root / kind / rest)
        extractor, _, rest = rest.partition("/")
        if rest.startswith("sets/"):
            return self.has_features_set(extractor, rest[len("sets/"):])
        return self.has_features(extractor, rest)

    # ---- the folder itself --------------------------------------------------------------

    def ensure(self) -> None:
        """Make the store folder (and its marker) if it is not there; StoreError in one line
        when it cannot be written."""
        from pathtwt.io.atomic import write_json_atomic

        marker = self.root / MARKER
        if marker.is_file():
            self.check_marker()
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            write_json_atomic(marker, {"format": STORE_FORMAT})
        except OSError as exc:
            raise StoreError(f"{self.root}: the store folder cannot be written ({exc.strerror}); make it writable, "
                             "or name another folder with the config's store: key") from None

    def check_marker(self) -> None:
        marker = self.root / MARKER
        try:
            found = json.loads(marker.read_text(encoding="utf-8")).get("format")
        except (OSError, ValueError, AttributeError):
            found = None
        if found != STORE_FORMAT:
            raise StoreError(f"{marker}: not a pathtwt store of format {STORE_FORMAT} (found {found!r}); name another "
                             "folder with the config's store: key")

    def writable(self) -> str | None:
        """Why nothing can be made in the store (one line), or None when it can."""
        target = self.root
        while not target.exists() and target != target.parent:
            target = target.parent
        if not os.access(target, os.W_OK | os.X_OK):
            return (f"{self.root}: the store folder is not writable (by uid {os.getuid()}); make it writable, or name "
                    "a folder you can write with the config's store: key")
        return None
