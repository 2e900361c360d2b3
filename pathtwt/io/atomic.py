"""Atomic output files: every file a stage produces is written under a temporary name
in the destination folder, flushed to disk, then renamed. A killed job therefore never
leaves a file that looks finished (Snakemake and the next stage only ever see complete
files), and a failed job leaves nothing behind.

The temporary name says who writes it: ``.NAME.tmp-HOST-PID-XXXX.SUFFIX``. A job killed
with SIGKILL (or by a node failure) cannot delete its temporary file, so the next
writer of the same output removes the temporaries of NAME whose process, on this host,
is gone; those of live processes and of other hosts (a shared cluster filesystem) are
left alone. A full disk, a full quota or a read-only folder is one line naming the file
(:mod:`pathtwt.io.write_errors`), and leaves nothing behind."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import socket
import tempfile
from pathlib import Path
from typing import Any, Iterator

from pathtwt.errors import PathtwtError
from pathtwt.io.write_errors import check_room, no_room_errno, probe_room, raise_output_error


def _fsync_dir(directory: Path) -> None:
    # The rename itself must reach the disk, or a crash can resurrect the old name.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (e.g. certain network mounts) refuse fsync on dirs
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, suffix: str | None = None, *, needed: int | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success fsync it and rename it to
    ``path``; on any exception delete it and re-raise.

    ``suffix`` defaults to the final suffix so that libraries that look at the file
    extension (PIL, numpy) behave the same on the temporary file. Folder scans must
    ignore names that start with "." (the temporary files).

    A full disk, a full quota or a read-only folder, met anywhere from making the folder
    to the rename, is raised as one :class:`~pathtwt.errors.OutputError` line naming
    ``path`` (:mod:`pathtwt.io.write_errors`); ``needed``, the least the output takes where
    the writer knows it, is checked against the free space first and named in that line.
    """
    final = Path(path)
    if final.is_dir():
        raise PathtwtError(f"{final}: is a folder; give the path of the file to write")
    try:
        tmp = _temporary(final, suffix, needed)
    except OSError as exc:
        code = no_room_errno(exc)
        if code is None:
            raise
        raise_output_error(final, code, needed=needed)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    except BaseException as exc:
        # a library's own words for a full disk (or none: torch.save, numpy.save) are
        # classified while the temporary file still holds its space
        code = None
        if isinstance(exc, Exception) and not isinstance(exc, PathtwtError):
            code = no_room_errno(exc) or probe_room(tmp)
        written = _allocated(tmp)
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if code is None:
            raise
        raise_output_error(final, code, needed=needed, written=written)


def _temporary(final: Path, suffix: str | None, needed: int | None) -> Path:
    """A new empty temporary file for ``final``, in its folder (made if missing)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(final)
    if needed:
        check_room(final, needed)
    # Hidden name (leading dot) so folder scans for "*.h5" never pick it up.
    fd, tmp_name = tempfile.mkstemp(
        prefix=f"{_tmp_prefix(final)}{os.getpid()}-", suffix=final.suffix if suffix is None else suffix, dir=final.parent
    )
    os.close(fd)
    tmp = Path(tmp_name)
    # mkstemp creates 0600; published results must get the ordinary umask-derived mode so
    # that colleagues on a shared cluster filesystem can read them.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    return tmp


def _allocated(path: Path) -> int | None:
    """Bytes the file occupies on disk (HDF5 leaves holes), or None when it is gone."""
    try:
        return path.stat().st_blocks * 512
    except OSError:
        return None


def _host() -> str:
    # a file-name-safe host name: temporaries on a shared filesystem say which node wrote them
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"


def _tmp_prefix(final: Path) -> str:
    return f".{final.name}.tmp-{_host()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporaries of ``path`` left by processes of this host that are gone;
    return them."""
    final = Path(path)
    pattern = re.compile(re.escape(_tmp_prefix(final)) + r"(\d+)-")
    removed = []
    try:
        candidates = list(final.parent.glob(f".{glob.escape(final.name)}.tmp-*"))
    except OSError:
        return removed
    for tmp in candidates:
        found = pattern.match(tmp.name)
        if found and int(found.group(1)) != os.getpid() and not _alive(int(found.group(1))):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                tmp.unlink()
                removed.append(tmp)
    return removed


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_output(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    # numpy scalars and arrays, Paths: the usual residents of result dictionaries
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()
