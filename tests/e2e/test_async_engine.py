"""AsyncEngine threading contract, with a scripted fake Engine (no model, runs in milliseconds)."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from anycore.config import EngineConfig
from anycore.outputs import StepOutput
from anycore.sampling_params import SamplingParams
from anycore.server.async_engine import AsyncEngine, EngineOverloaded


class FakeEngine:
    """Emits token 7 once per step for every live request until its max_tokens."""

    def __init__(self) -> None:
        self.live: dict[str, list[int]] = {}  # rid -> [generated, max_tokens]
        self.aborted: list[str] = []
        self.steps = 0
        self.thread_ids: set[int] = set()
        self.kv = SimpleNamespace(num_slots=100, num_used=0, radix=None)
        self.scheduler = SimpleNamespace(waiting=[], running=[])

    def add_request(self, ids, params, request_id=None):
        self.thread_ids.add(threading.get_ident())
        if ids == [666]:
            raise ValueError("cursed prompt")
        self.live[request_id] = [0, params.max_tokens]
        return request_id

    def abort(self, rid):
        self.thread_ids.add(threading.get_ident())
        self.aborted.append(rid)
        self.live.pop(rid, None)
        self.kv.num_used = len(self.live)

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
            outs.append(StepOutput(rid, [7], "x", done, "length" if done else None, num_output_tokens=state[0]))
            if done:
                del self.live[rid]
        self.kv.num_used = len(self.live)
        return outs


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
        group = ae.add_group([("a", [1, 2], SamplingParams(max_tokens=3)), ("b", [3], SamplingParams(max_tokens=1))])
        outs = [o async for o in group]
        group.close()
        return outs

    outs, fake = run(body)
    assert sorted((o.request_id, o.num_output_tokens) for o in outs) == [("a", 1), ("a", 2), ("a", 3), ("b", 1)]
    assert len(fake.thread_ids) == 1 and threading.get_ident() not in fake.thread_ids


def test_idle_engine_does_not_spin_and_close_aborts():
    async def body(ae, fake):
        group = ae.add_group([("long", [1], SamplingParams(max_tokens=10_000))])
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
    assert stats.kv_slots_used == 0


def test_overload_and_add_errors():
    async def body(ae, fake):
        g1 = ae.add_group([("a", [1], SamplingParams(max_tokens=50)), ("b", [1], SamplingParams(max_tokens=50))])
        with pytest.raises(EngineOverloaded):
            ae.add_group([("c", [1], SamplingParams(max_tokens=1))])
        g1.close()
        bad = ae.add_group([("d", [666], SamplingParams(max_tokens=1))])
        outs = [o async for o in bad]
        bad.close()
        return outs

    outs, _ = run(body, max_queued=2)
    assert len(outs) == 1 and outs[0].finished and outs[0].error == "cursed prompt"


def test_shutdown_ends_in_flight_streams():
    async def body(ae, fake):
        group = ae.add_group([("a", [1], SamplingParams(max_tokens=100_000))])
        await group.__anext__()
        await ae.shutdown()
        rest = [o async for o in group]
        return rest, ae.state

    (rest, state), fake = run(body)
    assert rest[-1].finished and "shutting down" in (rest[-1].error or "")
    assert state == "stopped" and not fake.live
