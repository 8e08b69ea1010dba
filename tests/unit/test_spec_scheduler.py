"""Speculative verify steps in the scheduler, without a model: drafts planned inside the token
budget, tokens kept one by one through the same stop rules, rejected positions' slots given
back, the prefix cache consistent, back-off."""

from __future__ import annotations

from anycore.cache.manager import KVCacheManager
from anycore.sampling_params import SamplingParams
from anycore.scheduler.request import Request
from anycore.scheduler.scheduler import Scheduler
from anycore.spec.policy import SpeculativeConfig, Speculator
from tests.unit.test_scheduler import check_slots


def req(rid: str, prompt: list[int], max_tokens: int = 32, **kw) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0, **kw))


def sched(num_slots=1000, budget=64, seqs=8, **spec) -> Scheduler:
    spec.setdefault("num_tokens", 4)
    return Scheduler(KVCacheManager(num_slots), budget, seqs, speculator=Speculator(SpeculativeConfig(**spec)))


# a prompt whose n-gram lookup proposes: ... 1 2 3 -> draft 4 5 6 7 (k = 4)
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]


def target_says(out, tokens_by_request):
    """Plays the target model: each sampling request emits the given tokens, cut as a verifier
    would (the target's tokens up to and including the first that differs from the draft)."""
    sampled = {}
    for s in out.scheduled:
        if not s.sample:
            continue
        target = tokens_by_request[s.request.request_id]
        emitted = []
        for i, t in enumerate(target[: 1 + len(s.draft_tokens)]):
            emitted.append(t)
            if i == len(s.draft_tokens) or t != s.draft_tokens[i]:
                break
        sampled[s.request.request_id] = emitted
    return sampled


def test_verify_step_keeps_accepted_tokens_and_gives_back_rejected_slots():
    s = sched()
    r = req("a", PROMPT)
    s.add(r)
    s.update(s.schedule(), {"a": [4]})  # prefill; the first token continues the repeat
    check_slots(s)
    out = s.schedule()
    (v,) = out.scheduled
    assert v.draft_tokens == [5, 6, 7, 8] and v.num_new_tokens == 5 and v.start == 12
    assert len(r.slots) == 13 + 4
    # the target agrees on 5 and 6, then says 0: 5, 6 accepted, 0 is its own token
    s.update(out, target_says(out, {"a": [5, 6, 0, 9, 9]}))
    assert r.output_token_ids == [4, 5, 6, 0]
    assert r.num_computed_tokens == r.num_tokens - 1 == 15
    assert len(r.slots) == r.num_computed_tokens  # positions 15, 16 (drafts 7, 8) released
    check_slots(s)
    assert s.speculator.totals.num_draft_tokens == 4 and s.speculator.totals.num_accepted_tokens == 2


def test_all_accepted_gives_the_bonus_token():
    s = sched()
    r = req("a", PROMPT)
    s.add(r)
    s.update(s.schedule(), {"a": [4]})
    out = s.schedule()
    s.update(out, target_says(out, {"a": [5, 6, 7, 8, 42]}))
    assert r.output_token_ids == [4, 5, 6, 7, 8, 42]
    assert len(r.slots) == r.num_computed_tokens == r.num_tokens - 1
    check_slots(s)


def test_a_stop_inside_the_accepted_tokens_ends_there_and_frees_everything():
    s = sched()
    r = req("a", PROMPT, stop_token_ids=[6])
    s.add(r)
    s.update(s.schedule(), {"a": [4]})
    out = s.schedule()
    s.update(out, target_says(out, {"a": [5, 6, 7, 8, 42]}))
    assert r.output_token_ids == [4, 5, 6] and r.finish_reason == "stop"
    check_slots(s)
    kv = s.kv
    assert kv.radix.protected_size == 0 and kv.num_used == kv.radix.total_size  # nothing leaked
    kv.radix.check_integrity()
    # the cache holds exactly the computed tokens: the prompt and the outputs before the stop
    slots, _ = kv.radix.match_prefix(PROMPT + [4, 5, 6], count=False)
    assert len(slots) == len(PROMPT) + 2


def test_draft_length_respects_max_tokens_and_the_budget():
    s = sched(budget=3)
    r = req("a", PROMPT, max_tokens=4)
    s.add(r)
    s.update(s.schedule(), {"a": [4]})  # (3-token chunks: the prompt takes 4 steps)
    while not r.output_token_ids:
        s.update(s.schedule(), {"a": [4]})
    out = s.schedule()
    assert out.scheduled[0].draft_tokens == [5, 6]  # budget 3 = 1 + 2 drafts
    s.update(out, target_says(out, {"a": [5, 6, 7]}))
    assert r.output_token_ids == [4, 5, 6, 7] and r.finish_reason == "length"
    check_slots(s)
    s2 = sched()
    r2 = req("b", PROMPT, max_tokens=3)
    s2.add(r2)
    s2.update(s2.schedule(), {"b": [4]})
    assert s2.schedule().scheduled[0].draft_tokens == [5]  # 1 output so far: room for 1 + 1


def test_mixed_batch_speculating_and_plain_requests_share_the_budget():
    s = sched(budget=8)
    a, b = req("a", PROMPT), req("b", [50, 51, 52, 53])  # b's context never repeats
    s.add(a)
    s.add(b)
    s.update(s.schedule(), {"a": [4]})  # (8 tokens: a's prompt chunk only)
    out = s.schedule()
    s.update(out, target_says(out, {"a": [4], "b": [60]}))
    out = s.schedule()
    kinds = {x.request.request_id: (x.num_new_tokens, x.draft_tokens) for x in out.scheduled}
    assert kinds == {"a": (5, [5, 6, 7, 8]), "b": (1, [])}
    assert out.num_batched_tokens <= 8
    s.update(out, target_says(out, {"a": [5, 9, 9, 9, 9], "b": [61]}))
    assert a.output_token_ids[-2:] == [5, 9] and b.output_token_ids[-1] == 61
    check_slots(s)


def test_no_drafts_in_a_batch_larger_than_the_knob_unless_seeded_sampling():
    s = sched(max_batch=1)
    a = req("a", PROMPT)
    c = Request("c", PROMPT[::-1] + PROMPT[::-1], SamplingParams(max_tokens=32, temperature=0.8, seed=3))
    s.add(a)
    s.add(c)
    out = s.schedule()
    s.update(out, target_says(out, {"a": [4], "c": [9]}))
    out = s.schedule()
    drafts = {x.request.request_id: x.draft_tokens for x in out.scheduled}
    assert drafts["a"] == [] and drafts["c"] != []  # 2 running > 1; the seeded sampler's choice is its own


def test_requests_that_cannot_speculate_get_no_draft():
    for kw in (dict(logprobs=1), dict(repetition_penalty=1.2), dict(speculative=False), dict(min_tokens=5)):
        s = sched()
        r = req("a", PROMPT, **kw)
        s.add(r)
        s.update(s.schedule(), {"a": [4]})
        assert s.schedule().scheduled[0].draft_tokens == [], kw


def test_low_acceptance_backs_off_then_retries():
    s = sched(min_acceptance=0.5, ngram_min=1)
    r = req("a", PROMPT * 4, max_tokens=500)
    s.add(r)
    s.update(s.schedule(), {"a": [4]})
    drafted = []
    for _ in range(30):
        out = s.schedule()
        (x,) = out.scheduled
        drafted.append(bool(x.draft_tokens))
        # the target always disagrees with the draft; its tokens (1..9) always recur
        tok = 1 + x.draft_tokens[0] % 9 if x.draft_tokens else 5
        s.update(out, {"a": [tok]})
        check_slots(s)
    assert drafted[:2] == [True, True]  # 1.0 -> 0.7 -> 0.49 < 0.5: backs off
    assert not all(drafted[2:6])
    assert sum(drafted) < 15  # the back-off grows while acceptance stays at 0
    assert any(drafted[6:])  # but it retries


def test_a_draft_wins_over_the_native_greedy_decode_without_one_the_native_call():
    s = sched()
    r = req("a", PROMPT)
    s.add(r)
    s.update(s.schedule(4), {"a": [4]})
    out = s.schedule(4)
    assert not out.scheduled[0].greedy_native and out.scheduled[0].draft_tokens == [5, 6, 7, 8]
    s.update(out, target_says(out, {"a": [77]}))  # rejected at once: context ends ... 4 77
    out = s.schedule(4)
    assert out.scheduled[0].greedy_native and not out.scheduled[0].draft_tokens  # no n-gram recurs
    check_slots(s)


def test_preemption_and_rollback_keep_the_pool_consistent():
    s = sched(num_slots=40, budget=16)
    reqs = [req(f"r{i}", PROMPT, max_tokens=20) for i in range(3)]
    for r in reqs:
        s.add(r)
    for step in range(40):
        out = s.schedule()
        if out.is_empty:
            break
        target = {x.request.request_id: [5 + step % 3] * 5 for x in out.scheduled if x.sample}
        s.update(out, target_says(out, target))
        check_slots(s)
    assert not s.has_unfinished()
    assert s.kv.radix.protected_size == 0 and s.kv.num_used == s.kv.radix.total_size
