"""The tensor-parallel group's shared-memory all-reduce for ranks on one host: the segment and
the choice between it and gloo.

One POSIX shared-memory segment per group (``/dev/shm/anycore-ar-<uid>-<port>-<hash of the
rendezvous address>``, so two engines never share one): local rank 0 creates it, the others
open it after a barrier, and rank 0 unlinks the name once every rank has it mapped (a crash
leaves nothing behind; the mapping lives until each rank closes it). Each rank writes its pid
into its line, which the op checks to notice a dead peer (anycore/kernels/shm_all_reduce.py has
the layout).

``choose`` runs on every rank with the same collective calls, so all ranks agree: shm when the
mode allows it, every rank reports the same host, and every rank has an implementation (the
native op, or the torch-native one on x86-64); else gloo (``--dist-all-reduce shm`` then fails).
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from anycore.kernels import shm_all_reduce as layout

log = logging.getLogger("anycore")

SHM_DIR = "/dev/shm"
SLOT_BYTES = 4 << 20  # per rank; a bigger tensor is reduced in slot-sized chunks


def native_op() -> Callable | None:
    """``torch.ops.anycore.shm_all_reduce`` when the extension has it, else None."""
    from anycore.kernels.build import load_extension

    ext = load_extension()
    if not ext.available:
        return None
    op = getattr(torch.ops.anycore, "shm_all_reduce", None)
    return None if op is None else op.default


def implementation() -> tuple[str, Callable] | None:
    """(name, op) of the shm all-reduce this host can run, or None (then gloo)."""
    if not os.access(SHM_DIR, os.W_OK):  # (a container without /dev/shm)
        return None
    op = native_op()
    if op is not None:
        return "native", op
    if layout.torch_native_safe():
        return "torch-native", layout.shm_all_reduce
    return None


def mode_for(all_reduce: str, nnodes: int) -> str:
    """The mode a rank passes to ``choose``: ``auto`` over several declared nodes is gloo (nodes
    started by hand are separate hosts, even when a test runs them on one)."""
    return "gloo" if all_reduce == "auto" and nnodes > 1 else all_reduce


def segment_name(addr: str) -> str:
    digest = hashlib.sha1(addr.encode()).hexdigest()[:10]
    port = addr.rpartition(":")[2]
    return f"anycore-ar-{os.getuid()}-{port}-{digest}"


@dataclass
class ShmAllReduce:
    """This rank's mapping of the group's segment and the op that reduces through it."""

    rank: int
    world: int
    timeout_s: float
    impl_name: str
    op: Callable
    _map: mmap.mmap
    segment: torch.Tensor

    def __call__(self, t: torch.Tensor) -> None:
        self.op(t, self.segment, self.rank, self.world, self.timeout_s)

    def abort(self) -> None:
        """Tells every rank waiting in the op to stop (the group failed)."""
        self.segment[:8].view(torch.int64)[layout.ABORT_WORD] = 1

    def describe(self) -> str:
        return f"shm ({self.impl_name}, {self.world} ranks, {(self.segment.numel() >> 20)} MiB segment)"

    def close(self) -> None:
        self.segment = torch.empty(0, dtype=torch.uint8)  # (drops the view before the map closes)
        try:
            self._map.close()
        except BufferError:  # a caller still holds a view: the mapping goes with the process
            pass


def _open(path: str, create: bool, size: int) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    if create and os.path.exists(path):  # a stale segment of a killed engine on the same address
        os.unlink(path)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def choose(mode: str, rank: int, world: int, addr: str, timeout_s: float) -> ShmAllReduce | None:
    """Collective on the default group: the shm all-reduce for this group, or None for gloo."""
    impl = implementation() if mode != "gloo" else None
    mine = (socket.gethostname(), impl is not None)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    one_host = all(h == everyone[0][0] for h, _ in everyone)
    if world == 1:
        return None
    if mode == "gloo" or not one_host or not all(ok for _, ok in everyone):
        if mode == "shm":
            why = "the ranks are on several hosts" if not one_host else "a rank has no shm implementation"
            raise RuntimeError(f"--dist-all-reduce shm: {why}")
        return None
    assert impl is not None
    size = layout.segment_bytes(world, SLOT_BYTES)
    path = os.path.join(SHM_DIR, segment_name(addr))
    if rank == 0:
        m = _open(path, True, size)
    dist.barrier()
    if rank != 0:
        m = _open(path, False, size)
    seg = torch.frombuffer(m, dtype=torch.uint8)
    seg[: layout.header_bytes(world)].view(torch.int64)[layout.pid_word(rank)] = os.getpid()
    dist.barrier()  # every rank mapped it and wrote its pid
    if rank == 0:
        os.unlink(path)
    return ShmAllReduce(rank, world, timeout_s, impl[0], impl[1], m, seg)
