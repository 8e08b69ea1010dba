"""The start-up decode self-check times real decode steps and leaves the engine as it found it."""

from __future__ import annotations

import asyncio

import pytest

from anycore import LLM
from anycore.engine.self_check import SLOW_FRACTION, DecodeSelfCheck, decode_self_check
from anycore.sampling_params import SamplingParams
from anycore.server.async_engine import AsyncEngine
from tests.models.test_tiny_models import write_checkpoint


@pytest.fixture
def tiny_dir(tmp_path, tokenizer):
    write_checkpoint(tmp_path, "llama-untied-llama3-rope", tokenizer)
    return str(tmp_path)


def test_self_check_times_decode_steps_and_leaves_the_engine_idle(tiny_dir):
    llm = LLM(model=tiny_dir, dtype="bfloat16", kv_cache_gb=0.01, threads=2)
    engine = llm.engine
    before = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    check = decode_self_check(engine, tokens=6, probe=True)
    assert check.tokens == 6 and check.ms_per_token > 0 and check.threads >= 1
    assert check.weight_gb_s == pytest.approx(engine.weight_bytes / (check.ms_per_token / 1e3) / 1e9)
    assert check.probed_gb_s is None or check.probed_gb_s > 0
    assert "ms/token" in check.summary() and "GB/s of weights" in check.summary()
    # nothing left running or holding slots beyond the prefix cache; later requests are unchanged
    assert not engine.has_unfinished() and engine.request_ids() == []
    assert engine.kv.num_used == engine.stats().kv_slots_cached
    after = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert after[0].outputs[0].token_ids == before[0].outputs[0].token_ids
    with pytest.raises(RuntimeError, match="idle"):
        engine.add_request([1, 2], SamplingParams(max_tokens=2))
        decode_self_check(engine, tokens=2, probe=False)


def test_slow_verdict_follows_the_fraction_of_the_probe():
    def check(weight_gb_s, probed):
        return DecodeSelfCheck(ms_per_token=5.0, weight_gb_s=weight_gb_s, probed_gb_s=probed, probe_method="t",
                               threads=2, tokens=8)

    assert check(10.0, 10.0 / (SLOW_FRACTION * 0.9)).slow
    assert "SLOW" in check(1.0, 10.0).summary()
    assert not check(10.0, 10.0).slow and "SLOW" not in check(10.0, 10.0).summary()
    assert not check(1.0, None).slow and check(1.0, None).fraction is None  # no probe: no verdict
    assert check(20.0, 10.0).as_dict()["fraction"] == 2.0  # small models can beat DRAM (cache)


def test_async_engine_runs_the_check_before_it_is_ready(tiny_dir):
    from anycore.config import EngineConfig

    async def main():
        engine = AsyncEngine(EngineConfig(model=tiny_dir, dtype="bfloat16", kv_cache_gb=0.01, threads=2),
                             max_queued_requests=None, self_check=True)
        ready = asyncio.Event()
        engine.start(asyncio.get_running_loop(), on_ready=ready.set)
        await asyncio.wait_for(ready.wait(), 120)
        try:
            assert isinstance(engine.self_check, DecodeSelfCheck) and engine.self_check.tokens > 0
            assert engine.stats.num_running == 0 and engine.stats.num_waiting == 0
        finally:
            await engine.shutdown()

    asyncio.run(main())
