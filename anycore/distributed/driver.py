"""Rank 0 of a tensor-parallel engine: starts the local worker ranks, watches them, and drives
every step (the scheduler, the sampler and the server run here only).

``TensorParallel.start`` is called by the Engine before it loads the model; ``DriverModel``
stands in for the model in the runner: each forward and each logits call first broadcasts the
command the workers mirror (distributed/worker.py), then runs rank 0's share.

Under TP > 1 every rank runs the decoder layers op by op: the native decoder stack (one call for
all layers) has no collectives inside, so it is bypassed (``DriverModel.op_by_op_reason``).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import torch
from torch import nn

from anycore.config import EngineConfig
from anycore.distributed.group import ParallelGroup, Placement, apply_placement, placement
from anycore.distributed.shm import mode_for
from anycore.distributed.worker import WorkerSpec, batch_arrays
from anycore.layers.forward_batch import ForwardBatch

log = logging.getLogger("anycore")

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # (so a worker imports this checkout)


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_local_ranks(config: EngineConfig, addr: str, first_rank: int, local_world: int,
                      skip_first: bool) -> list[tuple[Placement, subprocess.Popen]]:
    """Starts this host's ranks ``first_rank ..`` as processes (all but the first when
    ``skip_first``: it is this process); returns their placements and processes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env.setdefault("ANYCORE_LOG_LEVEL", logging.getLevelName(logging.getLogger().getEffectiveLevel()))
    cfg = dataclasses.asdict(config)
    procs = []
    for local in range(1 if skip_first else 0, local_world):
        p = placement(first_rank + local, local, local_world, config.threads)
        spec = WorkerSpec(cfg, first_rank + local, config.tensor_parallel_size, addr, p, os.getpid())
        procs.append((p, subprocess.Popen([sys.executable, "-m", "anycore.distributed.worker", spec.to_json()],
                                          env=env)))
    return procs


class TensorParallel:
    """Rank 0's side of the group: its placement, its workers, their watchdog."""

    def __init__(self, config: EngineConfig) -> None:
        world, nnodes = config.tensor_parallel_size, config.nnodes
        local_world = world // nnodes
        addr = config.dist_init_addr or f"127.0.0.1:{free_loopback_port()}"
        self.placements: list[Placement] = [placement(0, 0, local_world, config.threads)]
        self._saved_affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self._saved_threads = torch.get_num_threads()
        self.workers = spawn_local_ranks(config, addr, 0, local_world, skip_first=True)
        self.placements += [p for p, _ in self.workers]
        apply_placement(self.placements[0])
        for p in self.placements:
            log.info("tensor parallel %s", p.describe())
        if nnodes > 1:
            log.info("tensor parallel: %d nodes x %d ranks; waiting for the other nodes at %s", nnodes,
                     local_world, addr)
        self._closed = False
        try:
            self.group = ParallelGroup(0, world, addr, config.dist_timeout,
                                       mode_for(config.dist_all_reduce, config.nnodes))
        except Exception:
            self._kill_workers()
            raise
        atexit.register(self.close)  # (a script that never closes its LLM still stops its workers cleanly)
        for pl, proc in self.workers:
            threading.Thread(target=self._watch, args=(pl, proc), name=f"anycore-tp-watch-{pl.rank}",
                             daemon=True).start()

    def init_workers(self, num_slots: int, max_len: int) -> None:
        self.group.broadcast(("init", {"num_slots": num_slots, "max_len": max_len}))

    def wait_ready(self) -> None:
        """Returns once every rank has loaded its shard (raises RankFailure if one died)."""
        self.group.barrier()

    def _watch(self, pl: Placement, proc: subprocess.Popen) -> None:
        """Fails the group the moment a local worker exits (a thread blocked in its wait)."""
        code = proc.wait()
        if not self._closed:
            self.group.fail(f"tensor-parallel rank {pl.rank} (pid {proc.pid}) exited with code {code}")

    def describe(self) -> str:
        return "; ".join(p.describe() for p in self.placements)

    def close(self) -> None:
        """Stops the workers (a stop command; killed if they do not exit) and leaves the group."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self.group.failure is None:
            try:
                self.group.broadcast(("stop", None))
            except Exception:  # noqa: BLE001 - a failed group: the workers are killed below
                pass
        for _, p in self.workers:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.group.close()  # (after a failure too: the next engine in this process needs a new group)
        if self._saved_affinity is not None:
            os.sched_setaffinity(0, self._saved_affinity)
        torch.set_num_threads(self._saved_threads)

    def _kill_workers(self) -> None:
        self._closed = True
        for _, p in self.workers:
            p.kill()


class DriverModel:
    """The model as rank 0's runner sees it: every forward and logits call is broadcast to the
    workers first (they mirror it on their shards); everything else is the model's."""

    op_by_op_reason = ("tensor parallel: the ranks run the layers op by op (the native decoder stack has no "
                       "collectives inside)")

    def __init__(self, model: nn.Module, group: ParallelGroup) -> None:
        self.model = model
        self.group = group

    def __call__(self, batch: ForwardBatch, layers=None) -> torch.Tensor:
        self.group.broadcast(("forward", batch_arrays(batch)))
        return self.model(batch, None)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self.group.broadcast(("logits", hidden))
        return self.model.compute_logits(hidden)

    def native_layers(self):
        return None

    def __getattr__(self, name: str):
        return getattr(self.model, name)
