"""The shared-memory all-reduce's segment layout and its torch-native implementation.

``shm_all_reduce(x, segment, rank, world, timeout_s)`` sums ``x`` (fp32 or bf16, contiguous)
over the ``world`` ranks of one host in place, through ``segment`` (a uint8 tensor over a
shared-memory mapping every rank holds; anycore/distributed/shm.py makes it). The native op
(csrc/common/shm_all_reduce.cpp) and this file share the layout and the protocol described
there: a slot per rank, an arrive and a depart generation per rank, the slots summed in rank
order with fp32 accumulation, so both give every rank the same bits.

The torch-native implementation publishes its flags with plain stores after the data copy,
which orders them only on a CPU that keeps stores in order (x86-64's TSO); ``torch_native_safe``
says whether this host is one. Elsewhere the group uses the native op or gloo (distributed/shm.py).
"""

from __future__ import annotations

import os
import platform
import time

import torch

LINE = 64
RANK_LINES = 128  # arrive line (generation, pid) + depart line
ALIGN = 4096


def header_bytes(world: int) -> int:
    return -(-(LINE + world * RANK_LINES) // ALIGN) * ALIGN


def segment_bytes(world: int, slot_bytes: int) -> int:
    return header_bytes(world) + world * slot_bytes


def arrive_word(rank: int) -> int:  # int64 index into the segment viewed as int64
    return (LINE + rank * RANK_LINES) // 8


def pid_word(rank: int) -> int:
    return arrive_word(rank) + 1


def depart_word(rank: int) -> int:
    return (LINE + rank * RANK_LINES + LINE) // 8


ABORT_WORD = 0


def torch_native_safe() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def _gone(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _wait_all(words: torch.Tensor, which, gen: int, rank: int, world: int, timeout_s: float) -> None:
    start = time.monotonic()
    for j in range(world):
        spins = 0
        while int(words[which(j)]) < gen:
            spins += 1
            if spins < 64:
                continue
            os.sched_yield()
            if int(words[ABORT_WORD]) != 0:
                raise RuntimeError(f"shm all-reduce on rank {rank}: the group was aborted")
            if _gone(int(words[pid_word(j)])):
                raise RuntimeError(f"shm all-reduce on rank {rank}: rank {j} (pid {int(words[pid_word(j)])}) is gone")
            if time.monotonic() - start >= timeout_s:
                raise RuntimeError(f"shm all-reduce on rank {rank}: rank {j} did not arrive within {timeout_s} s (hung)")


def shm_all_reduce(x: torch.Tensor, segment: torch.Tensor, rank: int, world: int, timeout_s: float) -> None:
    """Sums ``x`` over the ranks in place (the protocol of csrc/common/shm_all_reduce.cpp)."""
    if x.dtype not in (torch.float32, torch.bfloat16) or not x.is_contiguous():
        raise ValueError("shm_all_reduce: x must be contiguous float32 or bfloat16")
    header = header_bytes(world)
    slot = (segment.numel() - header) // world // LINE * LINE
    words = segment[:header].view(torch.int64)
    flat = x.view(-1)
    chunk = slot // x.element_size()
    slots = [segment[header + r * slot: header + r * slot + chunk * x.element_size()].view(x.dtype) for r in range(world)]
    for off in range(0, flat.numel(), chunk):
        n = min(chunk, flat.numel() - off)
        gen = int(words[arrive_word(rank)]) + 1
        slots[rank][:n].copy_(flat[off: off + n])
        words[arrive_word(rank)] = gen
        _wait_all(words, arrive_word, gen, rank, world, timeout_s)
        acc = slots[0][:n].to(torch.float32, copy=True)  # ( fp32 accumulation in rank order, as the native op)
        for r in range(1, world):
            acc += slots[r][:n].float()
        flat[off: off + n].copy_(acc)
        words[depart_word(rank)] = gen
        _wait_all(words, depart_word, gen, rank, world, timeout_s)
