"""The default model (SmolLM2-135M GGUF) in fp32 against transformers on the same weights."""

from __future__ import annotations

import pytest
import torch

from anycore import SamplingParams
from anycore.scheduler.request import Request
from anycore.scheduler.scheduler import ScheduledRequest, SchedulerOutput
from tests.models.hf_oracle import hf_greedy

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived",
    "List three primary colours:",
]
CHAT = [{"role": "user", "content": "Explain in one sentence why the sky is blue."}]
NEW_TOKENS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def prompt_ids(llm_fp32):
    ids = [llm_fp32.tokenizer.encode(p) for p in PROMPTS]
    ids.append(llm_fp32.apply_chat_template(CHAT))
    return ids


@pytest.fixture(scope="module")
def expected(hf_model, prompt_ids):
    return [hf_greedy(hf_model, ids, NEW_TOKENS) for ids in prompt_ids]


def test_logits_match_transformers(llm_fp32, hf_model, prompt_ids):
    engine = llm_fp32.engine
    ids = prompt_ids[2]
    req = Request("logits", ids, SamplingParams())
    req.slots = engine.kv.allocate(len(ids))
    try:
        ours = engine.runner.prompt_logits(SchedulerOutput([ScheduledRequest(req, 0, len(ids), True)]))
    finally:
        engine.kv.allocator.free(req.slots)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0]
    # fp32 on both sides; differences come only from summation order in the BLAS kernels
    assert torch.allclose(ours, ref, atol=1e-3, rtol=0), (ours - ref).abs().max()


def test_greedy_matches_transformers_token_for_token(llm_fp32, prompt_ids, expected):
    outs = llm_fp32.generate([list(p) for p in prompt_ids], GREEDY)
    for out, ref in zip(outs, expected):
        assert len(out.token_ids) == NEW_TOKENS
        assert out.token_ids == ref


def test_each_prompt_alone_equals_batched(llm_fp32, prompt_ids, expected):
    for ids, ref in zip(prompt_ids[:2], expected[:2]):
        assert llm_fp32.generate([list(ids)], GREEDY)[0].token_ids == ref


def test_chunked_prefill_gives_same_tokens(llm_fp32, prompt_ids, expected):
    sched = llm_fp32.engine.scheduler
    saved = sched.max_num_batched_tokens
    sched.max_num_batched_tokens = 5  # prompts are prefilled 5 tokens (minus decodes) per step
    try:
        outs = llm_fp32.generate([list(p) for p in prompt_ids], GREEDY)
    finally:
        sched.max_num_batched_tokens = saved
    assert [o.token_ids for o in outs] == expected


def test_prefix_cache_hit_gives_same_tokens(llm_fp32, prompt_ids, expected):
    radix = llm_fp32.engine.kv.radix
    ids, ref = prompt_ids[-1], expected[-1]
    llm_fp32.generate([list(ids)], GREEDY)  # warm the cache with this prompt
    hits_before = radix.hit_tokens
    out = llm_fp32.generate([list(ids)], GREEDY)[0]
    assert radix.hit_tokens - hits_before >= len(ids) - 1
    assert out.token_ids == ref
    radix.check_integrity()


def test_chat_api_and_text(llm_fp32, expected):
    out = llm_fp32.chat(CHAT, GREEDY)[0]
    assert out.token_ids == expected[-1]
    assert out.text == llm_fp32.tokenizer.decode(expected[-1], skip_special_tokens=True)


def test_eos_stops_generation(llm_fp32):
    out = llm_fp32.chat([{"role": "user", "content": "Say hi."}], SamplingParams(temperature=0, max_tokens=200))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids[-1] in llm_fp32.engine.eos_token_ids
    assert "<|im_end|>" not in out.text


def test_kv_slots_all_returned_after_generation(llm_fp32):
    kv = llm_fp32.engine.kv
    llm_fp32.generate(["a b c d e f g"], SamplingParams(temperature=0, max_tokens=4))
    # every used slot now belongs to the prefix cache, none leaked to a finished request
    assert kv.num_used == kv.radix.total_size
    assert kv.radix.protected_size == 0
