"""The shared-memory all-reduce (csrc/common/shm_all_reduce.cpp, anycore/kernels/shm_all_reduce.py,
anycore/distributed/shm.py) between real processes: the native op and the torch-native one give
every rank the same bits, the fixed rank-order fp32 sum, and gloo's sum within fp tolerance, on
2 and 3 ranks, odd sizes and sizes over a slot (chunked), fp32 and bf16; a dead or hung peer
raises RankFailure instead of hanging."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import pytest
import torch

from anycore.distributed.driver import free_loopback_port

SIZES = (1, 7, 577, 3 * 1024 + 5)  # the last is over the tests' 4 KiB slot: several rounds
SLOT = 4096


def _data(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + n)
    return torch.randn(n, generator=g).to(dtype)


def _rank_main(rank: int, world: int, addr: str, out) -> None:
    import torch.distributed as dist

    from anycore.distributed import shm
    from anycore.distributed.group import ParallelGroup
    from anycore.kernels import shm_all_reduce as torch_native

    shm.SLOT_BYTES = SLOT
    torch.set_num_threads(1)
    group = ParallelGroup(rank, world, addr, 30.0, "shm")
    impls = {"torch-native": torch_native.shm_all_reduce}
    if shm.native_op() is not None:
        impls["native"] = shm.native_op()
    results = {"chosen": group.all_reduce_name()}
    for name, op in impls.items():  # (every rank has the same implementations: same order)
        group.shm.op = op
        for dtype in (torch.float32, torch.bfloat16):
            for n in SIZES:
                t = _data(rank, n, dtype)
                g = t.clone()
                group.all_reduce(t)
                dist.all_reduce(g, group=group.compute)
                # (as lists: a tensor in a queue is shared by a descriptor that dies with this process)
                results[(name, str(dtype), n)] = (t.float().tolist(), g.float().tolist())
    group.close()
    out.put((rank, results))


def _run(world: int, target, replies: int, timeout: float = 120.0) -> dict[int, dict]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    addr = f"127.0.0.1:{free_loopback_port()}"
    procs = [ctx.Process(target=target, args=(r, world, addr, out)) for r in range(world)]
    for p in procs:
        p.start()
    # reap each rank the moment it exits, as the engine's watchdog does (a zombie's pid still exists)
    for p in procs:
        threading.Thread(target=p.join, daemon=True).start()
    try:
        return dict(out.get(timeout=timeout) for _ in range(replies))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()


@pytest.mark.parametrize("world", [2, 3])
def test_matches_gloo_and_is_the_same_on_every_rank(world):
    got = _run(world, _rank_main, world)
    assert got[0]["chosen"].startswith("shm")
    keys = [k for k in got[0] if k != "chosen"]
    assert {k[0] for k in keys} >= {"torch-native"}
    for key in keys:
        name, dtype, n = key
        dt = getattr(torch, dtype.removeprefix("torch."))
        fixed = sum((_data(r, n, dt).float() for r in range(1, world)), _data(0, n, dt).float()).to(dt)
        for r in range(world):
            shm_sum, gloo_sum = (torch.tensor(v).to(dt) for v in got[r][key])
            assert got[r][key][0] == got[0][key][0], (key, r)  # bit-identical on every rank
            assert torch.equal(shm_sum, fixed), key  # the rank-order fp32 sum
            tol = 1e-6 if dt is torch.float32 else 2e-2
            torch.testing.assert_close(shm_sum.float(), gloo_sum.float(), rtol=tol, atol=tol)


def _failing_main(rank: int, world: int, addr: str, out) -> None:
    """Rank 1 dies (or, with ANYCORE_TEST_HANG, sleeps) after the segment is set up; rank 0's
    all-reduce must raise RankFailure."""
    from anycore.distributed.group import ParallelGroup, RankFailure

    group = ParallelGroup(rank, world, addr, float(os.environ.get("ANYCORE_TEST_TIMEOUT", "60")), "shm")
    if rank == 1:
        if os.environ.get("ANYCORE_TEST_HANG"):
            time.sleep(8)
        os._exit(0)
    try:
        group.all_reduce(torch.ones(100))
        out.put((0, {"raised": None}))
    except RankFailure as e:
        out.put((0, {"raised": str(e), "failure": group.failure}))


@pytest.mark.parametrize("hang", [False, True], ids=["dead", "hung"])
def test_a_dead_or_hung_peer_raises(monkeypatch, hang):
    monkeypatch.setenv("ANYCORE_TEST_TIMEOUT", "2" if hang else "600")
    if hang:
        monkeypatch.setenv("ANYCORE_TEST_HANG", "1")
    got = _run(2, _failing_main, 1, timeout=60)[0]  # (never the op's 600 s)
    assert got["raised"] is not None, "the all-reduce returned without its peer"
    assert got["failure"] is not None and "a rank died or hung" in got["failure"]
    assert ("did not arrive within" in got["raised"]) if hang else ("rank 1" in got["raised"] and "gone" in got["raised"])
