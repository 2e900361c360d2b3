"""Outputs that cannot be written: a full disk, a full quota, a read-only folder.

Every writer goes through :func:`pathtwt.io.atomic.atomic_output`, which turns such a
failure into one :class:`~pathtwt.errors.OutputError` line naming the file, the space it
needed (where known) and the space free, and what to do; the command line's top-level
handler does the same for a write outside it (a folder made by a command). Libraries
report a full disk in their own words: an ``OSError`` with ``errno`` 28 (Python, pandas,
PIL), a message with ``errno = 28`` (HDF5) or ``os error 28`` (safetensors), or no errno
at all (``torch.save``: ``unexpected pos``; ``numpy.save``: ``N requested and M
written``). So a failure without an errno is classified by writing a little more to the
temporary file it left (:func:`probe_room`): a full file system or quota refuses that too.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path
from typing import NoReturn

from pathtwt.errors import OutputError

# errno -> (what happened, what to do)
NO_ROOM: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on the device",
                   "free space there or write the results to another disk, then run the command again"),
    errno.EDQUOT: ("disk quota exceeded",
                   "free some of your quota (`quota -s`, `lfs quota -u $USER DIR`) or write the results elsewhere, "
                   "then run the command again"),
    errno.EROFS: ("the folder is on a read-only file system",
                  "write the results to a writable folder (or remount it read-write), then run the command again"),
    errno.EACCES: ("no permission to write there",
                   "make the folder writable for you or write the results elsewhere, then run the command again"),
    errno.EPERM: ("the file system does not permit the write",
                  "write the results to another folder, then run the command again"),
}
# the two that say the folder itself refuses writes (any write in it fails, not only a large one)
REFUSED_FOLDER = (errno.EROFS, errno.EACCES, errno.EPERM)
_ERRNO_IN_TEXT = re.compile(r"(?:errno\s*=\s*|os error\s+|\[Errno\s+)(\d+)", re.IGNORECASE)
# bytes written to a failed output's temporary file to tell a full disk from another failure
PROBE_BYTES = 1 << 16


def no_room_errno(exc: BaseException) -> int | None:
    """The errno of :data:`NO_ROOM` behind ``exc`` (its own, one in its message or in the
    exceptions it was raised from), else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        code = getattr(exc, "errno", None) if isinstance(exc, OSError) else None
        if code is None:
            found = _ERRNO_IN_TEXT.search(str(exc))
            code = int(found.group(1)) if found else None
        if code in NO_ROOM:
            return code
        exc = exc.__cause__ or exc.__context__
    return None


def probe_room(path: str | os.PathLike) -> int | None:
    """Append :data:`PROBE_BYTES` zeros to ``path`` (a temporary file about to be removed):
    the errno of :data:`NO_ROOM` when that fails too (the disk or quota is full), else None."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError as exc:
        return exc.errno if exc.errno in NO_ROOM else None
    try:
        written = 0
        while written < PROBE_BYTES:
            written += os.write(fd, bytes(PROBE_BYTES - written))
        os.fsync(fd)  # network and quota-checked file systems may refuse only here
    except OSError as exc:
        return exc.errno if exc.errno in NO_ROOM else None
    finally:
        os.close(fd)
    return None


def existing_folder(path: str | os.PathLike) -> Path:
    """The nearest folder of ``path`` that exists (where free space can be measured)."""
    folder = Path(os.path.abspath(path))
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    return folder


def mount_point(path: str | os.PathLike) -> Path:
    folder = existing_folder(path)
    while not os.path.ismount(folder) and folder != folder.parent:
        folder = folder.parent
    return folder


def free_bytes(path: str | os.PathLike) -> int | None:
    try:
        return shutil.disk_usage(existing_folder(path)).free
    except OSError:
        return None


def size_text(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def space_text(path: str | os.PathLike, code: int, needed: int | None = None, written: int | None = None) -> str:
    """What is known about the space: needed, written before the failure, free (nothing
    for a folder that refuses every write, where space is not the matter)."""
    if code in REFUSED_FOLDER:
        return ""
    parts = []
    if needed:
        parts.append(f"needs at least {size_text(needed)}")
    elif written:
        parts.append(f"{size_text(written)} written when it failed")
    free = free_bytes(path)
    if free is not None:
        parts.append(f"{size_text(free)} free on {mount_point(path)}")
    return "; ".join(parts)


def raise_output_error(path: str | os.PathLike, code: int, *, needed: int | None = None,
                       written: int | None = None) -> NoReturn:
    """Raise the one-line error for ``path``, which could not be written for ``code`` (an
    errno of :data:`NO_ROOM`)."""
    what, todo = NO_ROOM[code]
    space = space_text(path, code, needed, written)
    raise OutputError(f"{path}: cannot write it: {what}{f' ({space})' if space else ''}; {todo} "
                      "(finished outputs are kept)") from None


def check_room(path: str | os.PathLike, needed: int) -> None:
    """Refuse, before anything is written, an output of ``needed`` bytes where the file
    system has less free (a quota is not seen here; its failure is caught when it comes)."""
    free = free_bytes(path)
    if free is not None and free < needed:
        raise_output_error(path, errno.ENOSPC, needed=needed)


def raise_for_os_error(exc: OSError) -> None:
    """For the command line's top-level handler: raise the one line for ``exc``, an error
    met outside :func:`~pathtwt.io.atomic.atomic_output` (a folder made by a command), when
    it is one of :data:`NO_ROOM`; return otherwise. A permission error there may come from
    reading as well as writing, so its line says both."""
    code = no_room_errno(exc)
    where = exc.filename if exc.filename is not None else "an output"
    if code in (errno.EACCES, errno.EPERM):
        raise OutputError(f"{where}: permission denied ({exc.strerror}); make it readable (an input) or writable "
                          "(an output) for you, or use another path") from None
    if code is not None:
        raise_output_error(where, code)
