"""The batch-1 decode team gives bit-identical results to the op-by-op path.

csrc/common/decode_team.cpp runs a one-token bf16 decode step through every layer in one OpenMP
team, each thread taking chunks of every GEMV's rows (bf16 or W8A8) and its share of the KV
heads. Whatever the thread count (even, odd, more threads than KV heads: split-K attention with
a merge), tokens, logprobs and the KV pool must equal the op-by-op path's exactly, for every
Llama-family variant, dense and W8A8.
"""

from __future__ import annotations

import pytest
import torch

from anycore import LLM, SamplingParams
from tests.models.test_tiny_models import _configs, write_checkpoint
from tests.native_support import skip_unless_native, team_ops


@pytest.fixture
def restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _decode(model_dir: str, threads: int, quantization: str | None):
    llm = LLM(model=model_dir, dtype="bfloat16", kv_cache_gb=0.01, threads=threads, quantization=quantization)
    if llm.engine.ops.decoder_stack is None:
        pytest.skip("no fused decoder stack here (extension unavailable or some op not native)")
    skip_unless_native(llm.engine, team_ops(quantization), "the decode team")
    # 300 prompt tokens: past 4 key blocks per split, so 3 threads over 2 KV heads split the keys
    prompt = [3 + i % 250 for i in range(300)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=2)
    before = torch.ops.anycore.decode_team_steps()
    out = [llm.generate([p], params)[0] for p in (prompt, [7, 8, 9])]  # every decode step is batch 1
    steps = torch.ops.anycore.decode_team_steps() - before
    pool = llm.engine.kv_pool
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in out], pool.k.clone(), pool.v.clone(), steps


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("quantization", [None, "w8a8_int8"])
@pytest.mark.parametrize("name", sorted(_configs()))
def test_decode_team_is_bit_identical(tmp_path, tokenizer, monkeypatch, restore_threads, name, quantization, threads):
    write_checkpoint(tmp_path, name, tokenizer)
    monkeypatch.setenv("ANYCORE_DECODE_TEAM", "0")
    off, k_off, v_off, off_steps = _decode(str(tmp_path), threads, quantization)
    monkeypatch.delenv("ANYCORE_DECODE_TEAM")
    on, k_on, v_on, on_steps = _decode(str(tmp_path), threads, quantization)
    assert off_steps == 0 and on_steps > 0  # each run really took its path
    assert on == off
    assert torch.equal(k_on, k_off) and torch.equal(v_on, v_off)
