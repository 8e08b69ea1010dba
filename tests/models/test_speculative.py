"""Speculative decoding end to end on tiny random-weight checkpoints: greedy output identical
with and without it (n-gram drafts, and drafts that are partly right so every acceptance length
and rollback occurs), mixed batches, seeded sampling reproducible, no KV slot leaked."""

from __future__ import annotations

import pytest

from anycore import LLM, SamplingParams
from anycore.scheduler.request import Request
from anycore.spec.policy import SpecState, SpeculativeConfig, Speculator
from tests.models.test_tiny_models import write_checkpoint

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [[5, 17, 33, 99, 4, 250, 7, 5, 17, 33], [9, 9, 9], list(range(10, 60)) * 2, [40, 41, 42, 40, 41]]


class PartlyRightDrafts(Speculator):
    """Drafts the known greedy continuation with one token spoiled at a varying place, so
    verify steps accept 0..k tokens (and all k when the spoiled place falls beyond the draft)."""

    def __init__(self, reference: dict[tuple[int, ...], list[int]], k: int = 4) -> None:
        super().__init__(SpeculativeConfig(num_tokens=k))
        self.reference = reference
        self.calls = 0

    def propose(self, req: Request, limit: int, batch_size: int) -> list[int]:
        if limit <= 0 or not req.can_speculate:
            return []
        ref = self.reference.get(tuple(req.prompt_token_ids))
        if ref is None:
            return []
        # ref[i] is output token i; the draft continues after the last known token
        done = req.num_output_tokens
        draft = ref[done : done + min(self.config.num_tokens, limit)]
        self.calls += 1
        spoil = self.calls % (self.config.num_tokens + 2)
        if spoil < len(draft):
            draft[spoil] = (draft[spoil] + 1) % 256
        req.spec_state = req.spec_state or SpecState()
        return draft


def assert_no_slot_leaked(llm: LLM) -> None:
    kv = llm.engine.kv
    assert kv.radix.protected_size == 0
    assert kv.num_used == kv.radix.total_size
    kv.radix.check_integrity()


@pytest.fixture(scope="module", params=["llama-untied-llama3-rope", "qwen3-qk-norm"])
def tiny(request, tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp(request.param)
    write_checkpoint(folder, request.param, tokenizer)
    base = LLM(model=str(folder), dtype="float32", kv_cache_gb=0.01)
    spec = LLM(model=str(folder), dtype="float32", kv_cache_gb=0.01, speculative_algorithm="ngram",
               ngram_prompt_lookup_min=1)
    return base, spec


def test_ngram_greedy_output_is_identical(tiny):
    base, spec = tiny
    expected = [o.token_ids for o in base.generate(PROMPTS, GREEDY)]
    for prompt, want in zip(PROMPTS, expected):  # alone (one request decoding)
        assert spec.generate([prompt], GREEDY)[0].token_ids == want
    assert [o.token_ids for o in spec.generate(PROMPTS, GREEDY)] == expected  # batched
    stats = spec.engine.stats()
    assert stats.spec_verify_steps > 0 and stats.spec_draft_tokens > 0
    assert_no_slot_leaked(spec)


def test_partly_right_drafts_give_identical_output_and_every_acceptance_length(tiny):
    base, spec = tiny
    expected = [o.token_ids for o in base.generate(PROMPTS, GREEDY)]
    oracle = PartlyRightDrafts({tuple(p): e for p, e in zip(PROMPTS, expected)})
    original = spec.engine.scheduler.speculator
    spec.engine.scheduler.speculator = oracle
    try:
        for prompt, want in zip(PROMPTS, expected):
            assert spec.generate([prompt], GREEDY)[0].token_ids == want
        assert [o.token_ids for o in spec.generate(PROMPTS, GREEDY)] == expected
        # with a stop token inside an accepted draft, and a max_tokens cut
        stop_at = expected[0][5]
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[stop_at])
        got = spec.generate([PROMPTS[0]], params)[0]
        assert got.token_ids == expected[0][: expected[0].index(stop_at) + 1] and got.finish_reason == "stop"
        short = SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)
        assert spec.generate([PROMPTS[2]], short)[0].token_ids == expected[2][:7]
    finally:
        spec.engine.scheduler.speculator = original
    t = oracle.totals
    assert t.num_verify_steps > 0 and 0 < t.num_accepted_tokens < t.num_draft_tokens
    assert_no_slot_leaked(spec)


def test_seeded_sampling_with_speculation_is_reproducible(tiny):
    _, spec = tiny
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, ignore_eos=True, seed=11)
    first = [o.token_ids for o in spec.generate(PROMPTS, params)]
    second = [o.token_ids for o in spec.generate(PROMPTS, params)]
    assert first == second
    alone = spec.generate([PROMPTS[2]], params)[0].token_ids
    assert alone == first[2]  # a seeded request's tokens do not depend on the batch
    assert_no_slot_leaked(spec)


def test_a_request_may_opt_out(tiny):
    _, spec = tiny
    before = spec.engine.stats().spec_verify_steps
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, speculative=False)
    spec.generate(PROMPTS, params)
    assert spec.engine.stats().spec_verify_steps == before


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("draft-target")
    write_checkpoint(folder, "llama-untied-llama3-rope", tokenizer)
    return folder, LLM(model=str(folder), dtype="float32", kv_cache_gb=0.01)


@pytest.mark.parametrize("draft", [dict(speculative_model="same"), dict(speculative_draft_layers=1)])
def test_draft_model_greedy_output_is_identical(tiny_llama, draft):
    folder, base = tiny_llama
    if draft.get("speculative_model") == "same":  # the target as its own draft: every draft right
        draft = dict(speculative_model=str(folder))
    spec = LLM(model=str(folder), dtype="float32", kv_cache_gb=0.01, speculative_algorithm="draft", **draft)
    expected = [o.token_ids for o in base.generate(PROMPTS, GREEDY)]
    for prompt, want in zip(PROMPTS, expected):
        assert spec.generate([prompt], GREEDY)[0].token_ids == want
    assert [o.token_ids for o in spec.generate(PROMPTS, GREEDY)] == expected
    stats = spec.engine.stats()
    assert stats.spec_verify_steps > 0
    if "speculative_model" in draft:
        assert stats.spec_acceptance_rate > 0.9
    assert_no_slot_leaked(spec)
    assert spec.engine.speculator.num_slots_held == 0  # the draft model's KV given back too


def test_verify_steps_beside_a_request_collecting_prompt_logprobs(tiny):
    """One step holds a verify span and a prompt-logprobs span: both get their own rows."""
    base, spec = tiny
    lp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=2)
    late = list(range(100, 140))
    want_tokens = base.generate([PROMPTS[2]], GREEDY)[0].token_ids
    want_lp = base.generate([late], lp)[0]
    eng = spec.engine
    original = eng.scheduler.speculator
    eng.scheduler.speculator = PartlyRightDrafts({tuple(PROMPTS[2]): want_tokens})
    eng.add_request(PROMPTS[2], GREEDY, request_id="spec")
    while not any(r.num_output_tokens for r in eng._requests.values()):
        eng.step()
    mixed = []
    execute = eng.runner.execute

    def spy(out):
        mixed.append(any(x.draft_tokens for x in out.scheduled)
                     and any(x.request.needs_prompt_logprobs for x in out.scheduled))
        return execute(out)

    eng.runner.execute = spy
    eng.add_request(late, lp, request_id="lp")
    tokens: dict[str, list[int]] = {"spec": [], "lp": []}
    prompt_lps = None
    tokens["spec"] = list(eng._requests["spec"].output_token_ids)
    while eng.has_unfinished():
        for o in eng.step():
            tokens[o.request_id] += o.new_token_ids
            if o.prompt_logprobs is not None:
                prompt_lps = o.prompt_logprobs
    del eng.runner.execute
    eng.scheduler.speculator = original
    assert tokens["spec"] == want_tokens and tokens["lp"] == want_lp.token_ids
    assert mixed[0]  # the prompt-logprobs prefill ran in a verify step
    got = [(e.token_id, round(e.logprob, 4)) for e in prompt_lps[1:]]
    assert got == [(e.token_id, round(e.logprob, 4)) for e in want_lp.prompt_logprobs[1:]]
    assert_no_slot_leaked(spec)


def test_logit_bias_and_temperature_rows_are_processed_like_the_sampler(tiny):
    """Greedy with a logit bias (verified rows get the bias too) gives the same tokens; the
    bias must change the output for this to test anything."""
    base, spec = tiny
    plain = base.generate([PROMPTS[2]], GREEDY)[0].token_ids
    biased = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logit_bias={plain[3]: -100.0})
    expected = base.generate([PROMPTS[2]], biased)[0].token_ids
    assert expected != plain
    oracle = PartlyRightDrafts({tuple(PROMPTS[2]): expected})
    original = spec.engine.scheduler.speculator
    spec.engine.scheduler.speculator = oracle
    try:
        assert spec.generate([PROMPTS[2]], biased)[0].token_ids == expected
    finally:
        spec.engine.scheduler.speculator = original
    assert oracle.totals.num_accepted_tokens > 0
