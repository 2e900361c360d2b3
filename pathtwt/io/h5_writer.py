"""Writing HDF5 files that survive a full disk.

HDF5 that meets a failed write of its own (a full disk, a full quota) is left in a state
it does not recover from: it raises at close, then crashes with a segmentation fault when
the interpreter exits and it flushes its caches again (``pathtwt extract`` onto a full
disk died with exit status 139). So the writers here hand HDF5 a file object
(h5py's ``fileobj`` driver) whose writes never fail in HDF5's eyes: the first failure is
recorded, the bytes of that write and every later one are kept aside (small ones, the
file's structure, so HDF5 reads back what it wrote) or dropped (the data), and HDF5 closes
cleanly. :func:`writing_h5` then raises the recorded failure, which
:func:`pathtwt.io.atomic.atomic_output` turns into one line, deleting the file.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import h5py

from pathtwt.io.write_errors import no_room_errno, raise_output_error

# writes kept aside after a failure: each up to this size (HDF5's own structures; data
# chunks are larger and dropped, their bytes never read back before the file is deleted)
_KEPT_WRITE = 1 << 20
# and all together up to this much memory
_KEPT_TOTAL = 64 << 20


class GuardedFile:
    """The file under an HDF5 file being written: every write is completed (h5py's driver
    ignores a short write, which a filling disk makes) or, once one failed, set aside;
    :attr:`failed` holds the first failure."""

    def __init__(self, path: str | os.PathLike):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        self.pos = 0
        self.end = 0  # the end of the file as HDF5 sees it (writes set aside included)
        self.failed: OSError | None = None
        self._kept: list[tuple[int, bytes]] = []
        self._kept_bytes = 0

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.pos = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.end}[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, size: int = -1) -> bytes:
        size = self.end - self.pos if size < 0 else size
        data = bytearray(os.pread(self.fd, size, self.pos))
        data += bytes(size - len(data))  # past the end reads as zeros, as HDF5's own driver does
        for offset, kept in self._kept:  # in the order written: a later write wins
            lo, hi = max(offset, self.pos), min(offset + len(kept), self.pos + size)
            if lo < hi:
                data[lo - self.pos : hi - self.pos] = kept[lo - offset : hi - offset]
        self.pos += size
        return bytes(data)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        if self.failed is None:
            try:
                while done < len(view):
                    done += os.pwrite(self.fd, view[done:], self.pos + done)
            except OSError as exc:
                self.failed = exc
        if done < len(view) and len(view) - done <= _KEPT_WRITE and self._kept_bytes < _KEPT_TOTAL:
            self._kept.append((self.pos + done, bytes(view[done:])))
            self._kept_bytes += len(view) - done
        self.pos += len(view)
        self.end = max(self.end, self.pos)
        return len(view)

    def truncate(self, size: int | None = None) -> int:
        size = self.pos if size is None else size
        if self.failed is None:
            try:
                os.ftruncate(self.fd, size)
            except OSError as exc:
                self.failed = exc
        self.end = size
        return size

    def flush(self) -> None:
        pass  # every write went straight to the file; atomic_output fsyncs it

    def close(self) -> None:
        os.close(self.fd)


class CheckedDataset:
    """An HDF5 dataset whose writes raise the file's first failed write at once (rather
    than when the file closes), so a long extraction stops when the disk fills: as the
    one-line error naming ``path``, the file being written, and ``needed``, its size."""

    def __init__(self, dataset: h5py.Dataset, guard: GuardedFile, path: str | os.PathLike, needed: int | None = None):
        self._dataset, self._guard, self._path, self._needed = dataset, guard, path, needed

    def __setitem__(self, key: Any, value: Any) -> None:
        self._dataset[key] = value
        failed = self._guard.failed
        if failed is not None:
            code = no_room_errno(failed)
            if code is None:
                raise failed
            raise_output_error(self._path, code, needed=self._needed)

    def __getitem__(self, key: Any) -> Any:
        return self._dataset[key]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dataset, name)


@contextlib.contextmanager
def writing_h5(path: str | os.PathLike, **kwargs: Any) -> Iterator[h5py.File]:
    """A new HDF5 file at ``path`` (a temporary file of
    :func:`~pathtwt.io.atomic.atomic_output`), closed on leaving; a failed write is raised
    as its ``OSError`` once the file is closed. ``kwargs`` go to ``h5py.File``; the file's
    :class:`GuardedFile` is its ``guard`` attribute."""
    guard = GuardedFile(path)
    try:
        h5 = h5py.File(guard, "w", **kwargs)
    except BaseException:
        guard.close()
        raise
    h5.guard = guard
    try:
        yield h5
    finally:
        try:
            h5.close()
        finally:
            guard.close()
    if guard.failed is not None:
        raise guard.failed
