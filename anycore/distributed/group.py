"""One tensor-parallel group on ``torch.distributed`` (gloo): ranks, placement, partitions,
collectives that fail loudly.

Besides the default group (rendezvous and the shard-loaded barrier, with a start-up timeout),
two process groups over the same ranks:

- **compute**: the forward's all-reduces and the logits gather, with the engine's
  ``dist_timeout`` so a hung or dead peer raises instead of blocking forever;
- **control**: rank 0's command broadcasts (engine/worker protocol, distributed/worker.py).
  A worker waits there while the server is idle, so its timeout there is long (rank 0's is the
  engine's); a dead rank 0 still wakes it at once (gloo sees the closed connection).

Any collective error marks the group failed (``failure``, a sentence naming the cause) and
calls the listeners (the server's health turns 503); the group never recovers: a lost rank's
KV shard is gone.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from anycore.distributed import shm

log = logging.getLogger("anycore")

CONTROL_TIMEOUT = datetime.timedelta(days=30)  # an idle server: workers wait for the next command
# every rank up and its shard loaded (other nodes may be started by hand, a big model loads slowly)
START_TIMEOUT = datetime.timedelta(minutes=10)


class RankFailure(RuntimeError):
    """A rank of the tensor-parallel group died or stopped answering; the engine cannot serve."""


@dataclass(frozen=True)
class Placement:
    """Where one rank runs: its cores (sched_setaffinity) and torch threads."""

    rank: int
    local_rank: int
    cores: tuple[int, ...]
    threads: int

    def describe(self) -> str:
        cores = ",".join(map(str, self.cores)) if self.cores else "unbound"
        return f"rank {self.rank}: cores {cores}, {self.threads} threads"


def placement(rank: int, local_rank: int, local_world: int, threads: int | None) -> Placement:
    """Rank ``local_rank`` of the ``local_world`` ranks on this host gets the ``local_rank``-th
    contiguous share of this process's CPU set (a NUMA node is a contiguous core range on the
    servers this targets) and ``threads // local_world`` threads (default: its cores)."""
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cores: tuple[int, ...] = ()
    if len(available) >= local_world:
        share = len(available) // local_world
        cores = tuple(available[local_rank * share : (local_rank + 1) * share])
    n = threads // local_world if threads else len(cores) or (os.cpu_count() or 1) // local_world
    n = max(1, n)
    return Placement(rank, local_rank, cores, n)


def apply_placement(p: Placement) -> None:
    if p.cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, p.cores)
    torch.set_num_threads(p.threads)


def split_even(n: int, world: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous range of ``n`` items split as evenly as possible (the first
    ``n % world`` ranks take one more)."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def parse_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--dist-init-addr must be HOST:PORT, got {addr!r}")
    return host, int(port)


class ParallelGroup:
    """This process's membership in the tensor-parallel group (one per process: it owns the
    default ``torch.distributed`` group until ``close``)."""

    def __init__(self, rank: int, world: int, addr: str, timeout_s: float, all_reduce: str = "auto") -> None:
        host, port = parse_addr(addr)
        self.rank, self.world = rank, world
        self.failure: str | None = None
        self.shm: shm.ShmAllReduce | None = None
        self._listeners: list[Callable[[str], None]] = []
        self._lock = threading.Lock()
        # the default group only meets (rendezvous, the loaded barrier): start-up's long timeout
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank, world_size=world,
                                timeout=START_TIMEOUT)
        self.compute = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        # (the timeout is each process's own: rank 0 must not wait long on a hung worker, a
        # worker waits as long as the server idles)
        control_timeout = datetime.timedelta(seconds=timeout_s) if rank == 0 else CONTROL_TIMEOUT
        self.control = dist.new_group(backend="gloo", timeout=control_timeout)
        # the row-parallel all-reduce: shared memory when every rank is on this host (shm.py)
        self.shm = shm.choose(all_reduce, rank, world, addr, timeout_s)
        if rank == 0:
            log.info("tensor parallel all-reduce: %s", self.all_reduce_name())

    # ---- failure ------------------------------------------------------------------------------
    def on_failure(self, listener: Callable[[str], None]) -> None:
        """``listener(message)`` runs once when the group fails (at once if it has)."""
        with self._lock:
            failure = self.failure
            if failure is None:
                self._listeners.append(listener)
        if failure is not None:
            listener(failure)

    def fail(self, message: str) -> None:
        with self._lock:
            if self.failure is not None:
                return
            self.failure = message
            listeners, self._listeners = self._listeners, []
        if self.shm is not None:
            self.shm.abort()  # (the ranks waiting in the shm all-reduce stop at once)
        log.error("tensor parallel: %s; the engine cannot serve", message)
        for fn in listeners:
            fn(message)

    def _checked(self, what: str, fn: Callable[[], object]):
        if self.failure is not None:
            raise RankFailure(self.failure)
        try:
            return fn()
        except RuntimeError as e:  # gloo: a closed connection or a timeout
            self.fail(f"{what} failed on rank {self.rank} (a rank died or hung): {e}")
            raise RankFailure(self.failure) from e

    # ---- collectives ----------------------------------------------------------------------------
    def all_reduce_name(self) -> str:
        return self.shm.describe() if self.shm is not None else "gloo"

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sums ``t`` over the ranks in place (the row-parallel projections' partial outputs)."""
        if self.shm is not None and t.is_contiguous() and t.dtype in (torch.float32, torch.bfloat16):
            self._checked("shm all_reduce", lambda: self.shm(t))
        else:
            self._checked("all_reduce", lambda: dist.all_reduce(t, group=self.compute))
        return t

    def gather_columns(self, t: torch.Tensor, width: int) -> torch.Tensor | None:
        """Rank 0: every rank's ``t`` (``[rows, <= chunk]``, padded to the same chunk) side by
        side, cut to ``width`` columns; other ranks: None."""
        chunk = -(-width // self.world)
        if t.shape[1] < chunk:
            t = torch.nn.functional.pad(t, (0, chunk - t.shape[1]))
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world)] if self.rank == 0 else None
        self._checked("logits gather", lambda: dist.gather(t, parts, dst=0, group=self.compute))
        return torch.cat(parts, dim=1)[:, :width] if parts is not None else None

    def barrier(self) -> None:
        self._checked("barrier", lambda: dist.barrier())

    def broadcast(self, obj: object = None) -> object:
        """Rank 0 sends ``obj`` on the control group; the others return what it sent."""
        box = [obj]
        self._checked("command broadcast", lambda: dist.broadcast_object_list(box, src=0, group=self.control))
        return box[0]

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()
        if dist.is_initialized():
            dist.destroy_process_group()
