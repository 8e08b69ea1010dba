"""AsyncEngine threading contract, with a scripted fake Engine (no model, runs in milliseconds)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from anycore.config import EngineConfig
from anycore.engine.input_processor import EngineRequest
from anycore.errors import InvalidRequest, NotReady, Overloaded, ShuttingDown
from anycore.outputs import EngineStats, StepOutput
from anycore.sampling_params import SamplingParams
from anycore.server.async_engine import AsyncEngine


class FakeEngine:
    """Emits token 7 once per step for every live request until its max_tokens."""

    def __init__(self) -> None:
        self.live: dict[str, list[int]] = {}  # rid -> [generated, max_tokens, index]
        self.aborted: list[str] = []
        self.steps = 0
        self.thread_ids: set[int] = set()

    def add_request(self, ids, params, request_id=None, index=0):
        self.thread_ids.add(threading.get_ident())
        if ids == [666]:
            raise ValueError("cursed prompt")  # as the scheduler's KV-capacity check raises
        self.live[request_id] = [0, params.max_tokens, index]
        return request_id

    def request_ids(self):
        return list(self.live)

    def stats(self):
        return EngineStats(num_running=len(self.live), kv_slots_total=100, kv_slots_used=len(self.live))

    def abort(self, rid):
        self.thread_ids.add(threading.get_ident())
        self.aborted.append(rid)
        self.live.pop(rid, None)

    def has_unfinished(self):
        return bool(self.live)

    def step(self):
        self.thread_ids.add(threading.get_ident())
        self.steps += 1
        time.sleep(0.002)
        outs = []
        for rid, state in list(self.live.items()):
            state[0] += 1
            done = state[0] >= state[1]
            outs.append(StepOutput(rid, [7], "x", done, "length" if done else None, num_output_tokens=state[0],
                                   index=state[2]))
            if done:
                del self.live[rid]
        return outs


def reqs(*specs: tuple[str, list[int], int]) -> list[EngineRequest]:
    """(id, prompt ids, max_tokens) each; the choice index is the position."""
    return [EngineRequest(rid, ids, SamplingParams(max_tokens=m), i) for i, (rid, ids, m) in enumerate(specs)]


def run(coro_fn, max_queued=None):
    fake = FakeEngine()

    async def main():
        ready = asyncio.Event()
        ae = AsyncEngine(EngineConfig(), max_queued_requests=max_queued, engine_factory=lambda c: fake)
        ae.start(asyncio.get_running_loop(), on_ready=ready.set)
        await asyncio.wait_for(ready.wait(), 10)
        try:
            return await coro_fn(ae, fake)
        finally:
            await ae.shutdown()

    return asyncio.run(main()), fake


def test_outputs_reach_the_group_and_engine_runs_on_one_thread():
    async def body(ae, fake):
        group = ae.add_group(reqs(("a", [1, 2], 3), ("b", [3], 1)))
        outs = [o async for o in group]
        group.close()
        return outs

    outs, fake = run(body)
    assert sorted((o.request_id, o.index, o.num_output_tokens) for o in outs) == [
        ("a", 0, 1), ("a", 0, 2), ("a", 0, 3), ("b", 1, 1)]
    assert len(fake.thread_ids) == 1 and threading.get_ident() not in fake.thread_ids


def test_idle_engine_does_not_spin_and_close_aborts():
    async def body(ae, fake):
        group = ae.add_group(reqs(("long", [1], 10_000)))
        await group.__anext__()
        await group.__anext__()
        group.close()
        for _ in range(500):
            if not fake.live:
                break
            await asyncio.sleep(0.01)
        steps = fake.steps
        await asyncio.sleep(0.3)
        return steps, fake.steps, ae.stats

    (before, after, stats), fake = run(body)
    assert fake.aborted == ["long"] and not fake.live
    assert after == before  # asleep on the condition, not stepping
    assert stats.kv_slots_used == 0 and stats.num_running == 0


def test_overload_and_add_errors():
    async def body(ae, fake):
        g1 = ae.add_group(reqs(("a", [1], 50), ("b", [1], 50)))
        with pytest.raises(Overloaded) as overloaded:
            ae.add_group(reqs(("c", [1], 1)))
        queued = ae.num_queued
        g1.close()
        with pytest.raises(InvalidRequest, match="duplicate"):
            ae.add_group(reqs(("x", [1], 1), ("x", [1], 1)))
        bad = ae.add_group(reqs(("d", [666], 1)))
        outs = [o async for o in bad]
        bad.close()
        return outs, overloaded.value, queued, ae.num_queued

    (outs, overloaded, queued, queued_after), _ = run(body, max_queued=2)
    assert overloaded.status == 429 and overloaded.code == "server_overloaded"
    assert queued == 2 and queued_after == 0  # closed groups and answered requests leave the queue
    assert len(outs) == 1 and outs[0].finished
    assert isinstance(outs[0].error, InvalidRequest) and str(outs[0].error) == "cursed prompt"
    assert outs[0].error.status == 400


def test_shutdown_ends_in_flight_streams():
    async def body(ae, fake):
        group = ae.add_group(reqs(("a", [1], 100_000)))
        await group.__anext__()
        await ae.shutdown()
        rest = [o async for o in group]
        with pytest.raises(NotReady):
            ae.add_group(reqs(("late", [1], 1)))
        return rest, ae.state

    (rest, state), fake = run(body)
    assert rest[-1].finished and isinstance(rest[-1].error, ShuttingDown) and rest[-1].error.status == 503
    assert state == "stopped" and not fake.live
