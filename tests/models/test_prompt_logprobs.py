"""Prompt logprobs in the engine (SamplingParams.prompt_logprobs) and max_tokens=0, on the fp32
default model: the values equal a direct log_softmax of the model's logits on the same ids,
whether the prompt is prefilled in one chunk or many, and whatever the prefix cache holds."""

from __future__ import annotations

import math

import pytest

from anycore import SamplingParams
from anycore.scheduler.request import TokenLogprob

pytestmark = pytest.mark.slow

PROMPT = "The quick brown fox jumps over the lazy dog, and then it runs back into the forest to sleep."


def reference(llm, ids: list[int], k: int) -> list[TokenLogprob | None]:
    """log_softmax of the model's logits at every position, reduced as prompt logprobs are."""
    logprobs = llm.engine.next_token_logprobs(ids)
    out: list[TokenLogprob | None] = [None]
    for p in range(len(ids) - 1):
        row, target = logprobs[p], ids[p + 1]
        vals, idx = row.topk(k)
        out.append(TokenLogprob(target, row[target].item(), list(zip(idx.tolist(), vals.tolist())),
                                int((row > row[target]).sum()) + 1))
    return out


def assert_close(got: list[TokenLogprob | None], want: list[TokenLogprob | None], tol: float = 1e-4) -> None:
    assert len(got) == len(want) and got[0] is None and want[0] is None
    for g, w in zip(got[1:], want[1:]):
        assert g is not None and w is not None
        assert g.token_id == w.token_id and abs(g.logprob - w.logprob) < tol
        assert abs(g.rank - w.rank) <= 1  # (a near tie may order either way)
        assert len(g.top) == len(w.top)
        assert [t for t, _ in g.top][:1] == [t for t, _ in w.top][:1]
        assert all(abs(a - b) < tol for (_, a), (_, b) in zip(g.top, w.top))


def test_prompt_logprobs_equal_the_models_log_softmax(llm_fp32):
    ids = llm_fp32.tokenizer.encode(PROMPT)
    out = llm_fp32.generate([ids], SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=2))[0]
    assert_close(out.prompt_logprobs, reference(llm_fp32, ids, 2))
    # the prompt token's own logprob is always there; its rank is 1 exactly when it is the top-1
    for lp in out.prompt_logprobs[1:]:
        assert lp.logprob <= 0 and (lp.rank == 1) == (lp.top[0][0] == lp.token_id)
    plain = llm_fp32.generate([ids], SamplingParams(temperature=0, max_tokens=3))[0]
    assert out.token_ids == plain.token_ids and plain.prompt_logprobs is None


def test_chunked_prefill_gives_the_same_prompt_logprobs(llm_fp32, monkeypatch):
    ids = llm_fp32.tokenizer.encode(PROMPT)
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1)
    whole = llm_fp32.generate([ids], params)[0]
    monkeypatch.setattr(llm_fp32.engine.scheduler, "max_num_batched_tokens", 5)  # chunks of 5 tokens
    chunked = llm_fp32.generate([ids], params)[0]
    assert_close(chunked.prompt_logprobs, whole.prompt_logprobs)
    assert chunked.token_ids == whole.token_ids


def test_a_cached_prefix_is_recomputed_for_prompt_logprobs(llm_fp32):
    ids = llm_fp32.tokenizer.encode(PROMPT + " Again.")
    llm_fp32.generate([ids], SamplingParams(temperature=0, max_tokens=1))  # the prompt is now cached
    hit = llm_fp32.generate([ids], SamplingParams(temperature=0, max_tokens=1))[0]
    assert hit.num_cached_tokens > 0
    out = llm_fp32.generate([ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))[0]
    assert out.num_cached_tokens == 0  # (cached KV carries no logits)
    assert_close(out.prompt_logprobs, reference(llm_fp32, ids, 0))
    assert all(lp.top == [] for lp in out.prompt_logprobs[1:])


def test_max_tokens_zero_only_prefills(llm_fp32):
    ids = llm_fp32.tokenizer.encode(PROMPT)
    out = llm_fp32.generate([ids, ids[:1]], SamplingParams(max_tokens=0, prompt_logprobs=0))
    assert [o.finish_reason for o in out] == ["length", "length"]
    assert [o.token_ids for o in out] == [[], []] and [o.text for o in out] == ["", ""]
    assert len(out[0].prompt_logprobs) == len(ids) and out[1].prompt_logprobs == [None]
    # the sum of the prompt's logprobs is what score() gives
    total = sum(lp.logprob for lp in out[0].prompt_logprobs[1:])
    assert math.isclose(total, llm_fp32.engine.score(ids).sum().item(), rel_tol=1e-5)


def test_neighbours_and_samples_are_unaffected(llm_fp32):
    ids = llm_fp32.tokenizer.encode(PROMPT)
    other = "Numbers: one, two, three,"
    alone = llm_fp32.generate([other], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    mixed = llm_fp32.generate(
        [ids, other], [SamplingParams(n=2, temperature=0, max_tokens=4, prompt_logprobs=1),
                       SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)])
    assert mixed[1].token_ids == alone.token_ids and mixed[1].prompt_logprobs is None
    assert_close(mixed[0].prompt_logprobs, reference(llm_fp32, ids, 1))
    assert mixed[0].outputs[0].token_ids == mixed[0].outputs[1].token_ids



def test_prompt_logprobs_match_transformers(llm_fp32, hf_model):
    """The same values from an independent implementation (transformers on the same weights)."""
    import torch

    ids = llm_fp32.tokenizer.encode(PROMPT)
    out = llm_fp32.generate([ids], SamplingParams(max_tokens=0, prompt_logprobs=0))[0]
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    got = torch.tensor([lp.logprob for lp in out.prompt_logprobs[1:]])
    assert torch.allclose(got, want, atol=2e-3, rtol=0), (got - want).abs().max()


def test_preempted_requests_keep_their_prompt_logprobs(llm_fp32):
    """A KV pool too small for the batch (116 slots, 3 x 48 needed) preempts requests, which are
    recomputed from their first token; each prompt logprob is still there once, with the value
    an unhurried run gives."""
    from anycore import LLM

    small = LLM(dtype="float32", kv_cache_gb=0.005, max_num_batched_tokens=16, enable_prefix_caching=False)
    prompts = [f"{PROMPT} Story number {i}: once upon a time there was a small red boat on the sea." for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=1)
    tight = small.generate(prompts, params)
    assert small.engine.stats().num_preemptions > 0
    for got, want in zip(tight, llm_fp32.generate(prompts, params)):
        assert_close(got.prompt_logprobs, want.prompt_logprobs)
        assert got.token_ids == want.token_ids
