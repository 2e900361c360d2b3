"""Host tensors that the ranks of one node share: one copy per node, filled together.

A distillation under torchrun runs a rank per GPU, several to a node, and each used to
compute and hold its own copy of the teacher-target cache (up to
``cache_limit_bytes``, 4 GiB). Here the node's first rank creates one anonymous
shared-memory file (``memfd_create``), the node's other ranks open it through
``/proc/<pid>/fd/<n>`` and map it, and each rank of the node fills its share of the chunks
(:meth:`NodeTensors.mine`), so the node computes and holds the cache once. The file has
no name: the memory is returned when the last rank unmaps it, however the job ends, and
nothing is left in ``/dev/shm``.

Ranks find their node peers, and then the node's file, by gathering every rank's host
name, boot id and PID namespace (``/proc/self/ns/pid``: ranks in containers of their own,
as apptainer ``--pid`` or ``--containall`` makes them, see other processes under the same
numbers), and then the leader's pid, file descriptor and the file's inode
(:func:`pathtwt.compress.ranks.gather_json`), not from launcher variables, so torchrun
and srun alike work. Before it maps ``/proc/<pid>/fd/<n>``, a rank checks that the path
resolves to the project's memfd, by its name and its inode: mapping another process's file
with ``shared=True`` would extend it and write into it (torch's MapAllocator). Where a rank
cannot open its node's file, or it is not that file, every rank keeps its own copy, said
once in the log. A single process keeps a plain host tensor.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from dataclasses import dataclass
from typing import Sequence

import torch

log = logging.getLogger(__name__)


@dataclass
class NodeTensors:
    """Host tensors of the given shapes; ``sharers`` ranks fill them, this one chunks
    ``c`` with ``c % sharers == share``."""

    tensors: list[torch.Tensor]
    share: int = 0
    sharers: int = 1

    def mine(self, chunk: int) -> bool:
        return chunk % self.sharers == self.share

    def filled(self) -> None:
        """Wait until every rank has written its chunks (every rank calls it)."""
        from pathtwt.compress import ranks

        ranks.barrier()


MEMFD_NAME = "pathtwt-teacher-targets"


def _node_id() -> str:
    """The ranks that share memory share all of this: the host, its boot and the PID
    namespace in which ``/proc/<pid>`` means the same process."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = ""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}/{boot}/{namespace}"


def _offer(fd: int | None) -> tuple[int, int | None, int | None]:
    """What the node's leader tells its peers: its pid, the memfd's descriptor and inode."""
    return os.getpid(), fd, None if fd is None else os.fstat(fd).st_ino


def _map(pid: int, fd: int, inode: int, total: int, dtype: torch.dtype) -> torch.Tensor:
    """Map the leader's memfd, after checking that its path resolves to that very file
    (the memfd's name, the inode the leader gave): OSError otherwise, nothing touched."""
    path = f"/proc/{pid}/fd/{fd}"
    target = os.readlink(path)
    if not target.startswith(f"/memfd:{MEMFD_NAME}") or os.stat(path).st_ino != inode:
        raise OSError(f"{path} resolves to {target!r}, not the node's shared memory")
    return torch.from_file(path, shared=True, size=total, dtype=dtype)


def node_tensors(shapes: Sequence[Sequence[int]], dtype: torch.dtype = torch.float32) -> NodeTensors:
    """Host tensors of ``shapes``, one copy per node when several ranks share it (see the
    module doc); every rank calls it."""
    from pathtwt.compress import ranks
    from pathtwt.errors import first_line

    if ranks.world_size() == 1:
        return NodeTensors([torch.empty(tuple(s), dtype=dtype) for s in shapes])
    me = ranks.rank()
    node = _node_id()
    peers = [r for r, theirs in enumerate(ranks.gather_json(node)) if theirs == node]
    leader = peers[0]
    counts = [math.prod(s) for s in shapes]
    total = max(1, sum(counts))
    fd = None
    if me == leader and len(peers) > 1:
        fd = os.memfd_create(MEMFD_NAME)
        os.ftruncate(fd, total * torch.empty((), dtype=dtype).element_size())
    offers = ranks.gather_json(_offer(fd))
    flat, reason = None, ""
    if len(peers) > 1:
        try:
            flat = _map(*offers[leader], total, dtype)
        except (OSError, RuntimeError) as exc:
            reason = f"rank {me} cannot map rank {leader}'s shared memory ({first_line(exc)})"
    mapped = ranks.gather_json(reason)
    if fd is not None:
        os.close(fd)  # the ranks' mappings keep the memory
    failed = [r for r in mapped if r]
    if flat is None or failed:
        if failed and me == 0:
            log.warning("teacher targets: one copy per rank, not per node: %s", failed[0])
        return NodeTensors([torch.empty(tuple(s), dtype=dtype) for s in shapes])
    views, start = [], 0
    for shape, count in zip(shapes, counts):
        views.append(flat[start : start + count].view(tuple(shape)))
        start += count
    return NodeTensors(views, share=peers.index(me), sharers=len(peers))
