"""A real small file system for tests (helpers, not tests): a tmpfs mounted in the test's
folder, filled to leave a chosen number of bytes free, emptied again, or made read-only.
Mounting needs root; :func:`mount_small_disk` skips the test, saying why, where it is not
permitted."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


class SmallDisk:
    """A tmpfs at ``root``; outputs go under :attr:`out`, the filler beside it."""

    def __init__(self, root: Path):
        self.root = root
        self.out = root / "out"
        self._filler = root / "filler"

    def free(self) -> int:
        stats = os.statvfs(self.root)
        return stats.f_bavail * stats.f_frsize

    def leave(self, n_bytes: int) -> "SmallDisk":
        """Fill the disk so that about ``n_bytes`` stay free (to a page)."""
        self.empty()
        fill = self.free() - n_bytes
        assert fill > 0, f"the disk has only {self.free()} bytes free"
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, fill)
        finally:
            os.close(fd)
        return self

    def empty(self) -> "SmallDisk":
        """Remove the filler: the space is free again."""
        self._filler.unlink(missing_ok=True)
        return self

    def read_only(self, on: bool = True) -> "SmallDisk":
        _mount(["-o", f"remount,{'ro' if on else 'rw'}", str(self.root)])
        return self


def _mount(args: list[str]) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


def mount_small_disk(root: Path, size: str):
    """Mount a tmpfs of ``size`` (e.g. "16m") at ``root``; a generator for a fixture, which
    unmounts it at teardown."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    root.mkdir(parents=True, exist_ok=True)
    try:
        _mount(["-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(root)])
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {getattr(exc, 'stderr', None) or exc}")
    try:
        disk = SmallDisk(root)
        disk.out.mkdir()
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
