"""A tensor-parallel rank that dies or hangs fails the engine loudly and promptly, never a hang."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from anycore import LLM
from anycore.distributed.group import RankFailure
from tests.models.test_tensor_parallel import GREEDY, PROMPTS, write_checkpoint


@pytest.fixture
def tp2(tmp_path):
    write_checkpoint(tmp_path, "llama-untied")
    llm = LLM(model=str(tmp_path), dtype="float32", kv_cache_gb=0.01, tensor_parallel_size=2, dist_timeout=5)
    yield llm
    llm.close()


def test_dead_worker_fails_the_engine(tp2, caplog):
    group = tp2.engine.parallel.group
    failed = threading.Event()
    group.on_failure(lambda message: failed.set())
    tp2.generate(PROMPTS[0], GREEDY)  # serving
    _, proc = tp2.engine.parallel.workers[0]
    proc.kill()
    assert failed.wait(60), "the watchdog did not notice the dead rank"
    assert "rank 1" in group.failure and "exited with code -9" in group.failure
    assert any("the engine cannot serve" in r.message for r in caplog.records)
    with pytest.raises(RankFailure, match="rank 1"):
        tp2.generate(PROMPTS[0], GREEDY)


def test_hung_worker_times_out(tp2):
    """A rank that stops answering (SIGSTOP) makes the next step's collective time out
    (dist_timeout=5 s) and raise, instead of blocking forever."""
    _, proc = tp2.engine.parallel.workers[0]
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(RankFailure, match="a rank died or hung"):
            tp2.generate(PROMPTS[1], GREEDY)
        assert tp2.engine.parallel.group.failure is not None
    finally:
        os.kill(proc.pid, signal.SIGCONT)
