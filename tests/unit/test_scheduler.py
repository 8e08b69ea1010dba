"""Scheduler without a model: token budget, chunked prefill, prefix reuse, preemption."""

from __future__ import annotations

from anycore.cache.manager import KVCacheManager
from anycore.sampling_params import SamplingParams
from anycore.scheduler.request import Request
from anycore.scheduler.scheduler import Scheduler


def req(rid: str, n_prompt: int, max_tokens: int = 4, base: int = 0) -> Request:
    return Request(rid, [base + i for i in range(n_prompt)], SamplingParams(max_tokens=max_tokens, temperature=0))


def run_step(s: Scheduler, token: int = 7):
    out = s.schedule()
    sampled = {x.request.request_id: [token] for x in out.scheduled if x.sample}
    s.update(out, sampled)
    return out


def check_slots(s: Scheduler) -> None:
    """Every slot is free, in the tree, or owned by exactly one running request."""
    kv = s.kv
    owned = []
    for r in s.running:
        assert len(set(r.slots)) == len(r.slots)
        owned += r.slots
    tree = set(kv.radix.all_slots()) if kv.radix else set()
    private = [x for x in owned if x not in tree]
    assert len(private) == len(set(private))
    assert kv.allocator.num_free + len(tree) + len(set(private)) == kv.num_slots
    if kv.radix:
        kv.radix.check_integrity()


def test_budget_and_chunked_prefill():
    s = Scheduler(KVCacheManager(1000), max_num_batched_tokens=8, max_num_seqs=8)
    s.add(req("a", 20))
    out = s.schedule()
    assert [(x.start, x.num_new_tokens, x.sample) for x in out.scheduled] == [(0, 8, False)]
    s.update(out, {})
    out = run_step(s)
    assert [(x.start, x.num_new_tokens) for x in out.scheduled] == [(8, 8)]
    out = run_step(s)
    assert [(x.start, x.num_new_tokens, x.sample) for x in out.scheduled] == [(16, 4, True)]
    assert s.running[0].output_token_ids == [7]
    check_slots(s)


def test_new_requests_join_running_ones_each_step():
    s = Scheduler(KVCacheManager(1000), max_num_batched_tokens=16, max_num_seqs=8)
    s.add(req("a", 4, max_tokens=10))
    run_step(s)
    s.add(req("b", 30, base=100))
    out = run_step(s)
    # a decodes (1 token) and b's prefill takes the rest of the budget
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 1), ("b", 15)]
    check_slots(s)


def test_max_num_seqs_limits_admission():
    s = Scheduler(KVCacheManager(1000), max_num_batched_tokens=100, max_num_seqs=2)
    for i in range(3):
        s.add(req(f"r{i}", 4, base=10 * i))
    out = s.schedule()
    assert len(out.scheduled) == 2 and len(s.waiting) == 1


def test_requests_finish_and_release_kv():
    kv = KVCacheManager(100)
    s = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8)
    s.add(req("a", 5, max_tokens=3))
    for _ in range(3):
        run_step(s)
    assert not s.has_unfinished()
    assert kv.radix.protected_size == 0
    assert kv.num_used == kv.radix.total_size  # computed tokens stay cached, nothing leaked
    check_slots(s)


def test_prefix_hit_skips_computed_tokens():
    kv = KVCacheManager(200)
    s = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8)
    s.add(req("a", 20, max_tokens=1))
    run_step(s)
    b = req("b", 20, max_tokens=1)
    b.prompt_token_ids = b.all_token_ids = list(range(16)) + [99, 98, 97, 96]
    s.add(b)
    out = s.schedule()
    assert out.scheduled[0].start == 16 and out.scheduled[0].num_new_tokens == 4
    assert b.num_cached_tokens == 16


def test_identical_prompt_leaves_one_token_to_compute():
    kv = KVCacheManager(200)
    s = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8)
    s.add(req("a", 10, max_tokens=1))
    run_step(s)
    s.add(req("b", 10, max_tokens=1))
    out = s.schedule()
    assert (out.scheduled[0].start, out.scheduled[0].num_new_tokens) == (9, 1)


def test_concurrent_requests_share_published_prefix():
    kv = KVCacheManager(500)
    s = Scheduler(kv, max_num_batched_tokens=32, max_num_seqs=8)
    s.add(req("a", 40, max_tokens=5))
    run_step(s)  # a: 32 of 40 prompt tokens
    run_step(s)  # a: prompt done and published to the tree
    s.add(req("b", 40, max_tokens=5))
    out = s.schedule()
    b = [x for x in out.scheduled if x.request.request_id == "b"][0]
    assert b.start == 39
    check_slots(s)


def test_preemption_when_pool_exhausted_then_recompute():
    kv = KVCacheManager(24, enable_prefix_caching=False)
    s = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8)
    s.add(req("a", 10, max_tokens=8))
    s.add(req("b", 10, max_tokens=8, base=50))
    run_step(s)  # both prefilled: 20 slots used
    preempted = []
    for _ in range(40):
        out = run_step(s)
        preempted += [r.request_id for r in out.preempted]
        check_slots(s)
        if not s.has_unfinished():
            break
    assert preempted[0] == "b"  # the later request yields
    assert not s.has_unfinished()
    assert kv.allocator.num_free == 24
    assert s.num_preemptions >= 1


def test_preemption_keeps_outputs_and_prefix_cache():
    kv = KVCacheManager(30)
    s = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=8)
    a, b = req("a", 12, max_tokens=10), req("b", 12, max_tokens=10, base=50)
    s.add(a)
    s.add(b)
    for _ in range(60):
        run_step(s)
        check_slots(s)
        if not s.has_unfinished():
            break
    assert a.output_token_ids == [7] * 10 and b.output_token_ids == [7] * 10
    assert kv.radix.protected_size == 0


def test_lpm_policy_admits_longest_prefix_first():
    kv = KVCacheManager(500)
    s = Scheduler(kv, max_num_batched_tokens=64, max_num_seqs=1, policy="lpm")
    s.add(req("warm", 30, max_tokens=1))
    run_step(s)
    s.add(req("cold", 30, max_tokens=1, base=1000))
    s.add(req("hot", 30, max_tokens=1))
    out = s.schedule()
    assert out.scheduled[0].request.request_id == "hot"


def test_request_too_large_for_pool_is_rejected():
    s = Scheduler(KVCacheManager(10), max_num_batched_tokens=64, max_num_seqs=8)
    try:
        s.add(req("big", 11))
    except ValueError as e:
        assert "KV slots" in str(e)
    else:
        raise AssertionError("expected ValueError")


def test_abort_waiting_and_running():
    kv = KVCacheManager(100)
    s = Scheduler(kv, max_num_batched_tokens=8, max_num_seqs=8)
    a, b = req("a", 20), req("b", 5, base=40)
    s.add(a)
    s.add(b)
    run_step(s)  # a takes the whole budget; b waits
    s.finish(a, "abort")
    s.finish(b, "abort")
    assert not s.has_unfinished()
    assert kv.allocator.num_free + kv.radix.total_size == 100
    assert kv.radix.protected_size == 0


def _decoding(s: Scheduler, r: Request) -> Request:
    """``r`` admitted, prefilled and holding its first output token."""
    s.add(r)
    run_step(s)
    assert r.num_tokens - r.num_computed_tokens == 1
    return r


def _multi(s: Scheduler, max_steps: int):
    """The step ``schedule(max_steps)`` gives, as its one ScheduledRequest when it is a
    multi-step decode, else None."""
    out = s.schedule(max_steps)
    only = out.scheduled[0] if len(out.scheduled) == 1 else None
    return out, (only if only is not None and only.greedy_native else None)


def test_multi_step_decode_for_a_request_decoding_alone():
    s = Scheduler(KVCacheManager(100), max_num_batched_tokens=64, max_num_seqs=8)
    r = _decoding(s, req("a", 5, max_tokens=10))
    out, b = _multi(s, 4)
    assert (b.request, b.start, b.num_new_tokens, b.num_steps, b.sample) == (r, 5, 1, 4, True)
    assert len(r.slots) == 5 + 4
    progressed = s.update(out, {"a": [11, 12, 13, 14]})
    assert progressed == [(r, [11, 12, 13, 14])]
    assert r.num_computed_tokens == 9 and r.output_token_ids[-4:] == [11, 12, 13, 14] and not r.is_finished
    check_slots(s)
    # max_tokens caps it: 5 of 10 tokens out, so 4 + 1 are left
    out, b = _multi(s, 8)
    assert b.num_steps == 5
    s.update(out, {"a": [1, 2, 3, 4, 5]})
    assert r.is_finished and r.finish_reason == "length" and r.num_output_tokens == 10


def test_a_stop_inside_a_multi_step_decode_releases_the_slots_past_it():
    s = Scheduler(KVCacheManager(100), max_num_batched_tokens=64, max_num_seqs=8)
    r = _decoding(s, req("a", 5, max_tokens=10))
    r.params.stop_token_ids = [12]
    free_before = s.kv.allocator.num_free
    out, b = _multi(s, 4)
    progressed = s.update(out, {"a": [11, 12, 13, 14]})
    # the stop at the 2nd token: the tokens after it are dropped, KV of 2 of its 4 positions kept
    assert progressed == [(r, [11, 12])]
    assert r.is_finished and r.finish_reason == "stop" and r.num_computed_tokens == 7 and not s.running
    # the prompt's and the two kept tokens' KV are in the prefix cache; the other 2 slots are free
    assert len(set(s.kv.radix.all_slots())) == 7
    assert s.kv.allocator.num_free == free_before - 2
    check_slots(s)


def test_multi_step_decode_only_when_alone_decoding_and_plain_greedy():
    s = Scheduler(KVCacheManager(100), max_num_batched_tokens=64, max_num_seqs=8)
    assert s.schedule(4).is_empty  # nothing runs
    s.add(req("a", 5))
    out, b = _multi(s, 4)
    assert b is None and out.scheduled[0].num_new_tokens == 5  # waiting, not decoding: a prefill
    s.update(out, {"a": [7]})
    s.add(req("b", 5, base=50))
    out, b = _multi(s, 4)
    assert b is None  # somebody waits
    s.update(out, {x.request.request_id: [7] for x in out.scheduled if x.sample})
    out, b = _multi(s, 4)
    assert len(s.running) == 2 and b is None  # two run
    # sampling or logprobs read more than the argmax: one-token steps
    for params in (SamplingParams(temperature=0.7, max_tokens=9), SamplingParams(temperature=0, logprobs=1)):
        s1 = Scheduler(KVCacheManager(100), max_num_batched_tokens=64, max_num_seqs=8)
        r = Request("s", [1, 2, 3], params)
        _decoding(s1, r)
        assert _multi(s1, 4)[1] is None
    # the context length caps it: 6 tokens of an 8-token context, so 2 more at most
    s2 = Scheduler(KVCacheManager(100), max_num_batched_tokens=64, max_num_seqs=8)
    r = req("c", 5, max_tokens=100)
    r.max_model_len = 8
    _decoding(s2, r)
    assert _multi(s2, 4)[1].num_steps == 2
    # no slots for all its positions: an ordinary one-token step instead
    s3 = Scheduler(KVCacheManager(7, enable_prefix_caching=False), max_num_batched_tokens=64, max_num_seqs=8)
    _decoding(s3, req("d", 5, max_tokens=100))
    out, b = _multi(s3, 4)
    assert b is None and out.scheduled[0].num_steps == 1
    # max_steps 1: one token, still one native call (each token streamed as it is made); 0: never
    s4 = Scheduler(KVCacheManager(100), max_num_batched_tokens=64, max_num_seqs=8)
    _decoding(s4, req("e", 5, max_tokens=100))
    assert _multi(s4, 1)[1].num_steps == 1
    assert _multi(s4, 0)[1] is None


def test_a_request_wanting_prompt_logprobs_takes_no_prefix_hit():
    s = Scheduler(KVCacheManager(1000), max_num_batched_tokens=64, max_num_seqs=8)
    s.add(req("a", 10, max_tokens=1))
    run_step(s)  # a's prompt is published, a finishes
    lp = Request("b", list(range(10)), SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
    assert s.kv.prefix_match_len(lp) == 0
    s.add(lp)
    out = s.schedule()
    assert [(x.start, x.num_new_tokens) for x in out.scheduled] == [(0, 10)] and lp.num_cached_tokens == 0
    lp.prompt_logprobs = [None] * 10  # (what the runner would have gathered): now a hit is fine
    s.update(out, {"b": [7]})
    assert not lp.needs_prompt_logprobs
    check_slots(s)


def test_max_tokens_zero_finishes_after_the_prompt_without_sampling():
    s = Scheduler(KVCacheManager(1000), max_num_batched_tokens=4, max_num_seqs=8)
    r = req("a", 6, max_tokens=0)
    s.add(r)
    out = s.schedule()
    assert [x.sample for x in out.scheduled] == [False]
    assert s.update(out, {}) == [] and not r.is_finished
    out = s.schedule()
    assert [(x.start, x.num_new_tokens, x.sample) for x in out.scheduled] == [(4, 2, False)]
    assert s.update(out, {}) == [(r, [])]
    assert r.is_finished and r.finish_reason == "length" and r.output_token_ids == []
    assert not s.has_unfinished() and s.kv.allocator.num_free + s.kv.radix.evictable_size == 1000


def test_no_multi_step_decode_while_prompt_logprobs_are_missing():
    s = Scheduler(KVCacheManager(1000), max_num_batched_tokens=64, max_num_seqs=8)
    r = Request("a", list(range(5)), SamplingParams(max_tokens=8, temperature=0, prompt_logprobs=0))
    s.add(r)
    out = s.schedule(max_steps=4)
    s.update(out, {"a": [7]})  # (prompt logprobs not filled in: as if they were lost)
    assert not s.schedule(max_steps=4).scheduled[0].greedy_native


def test_a_prompt_sharing_a_prefix_being_prefilled_waits_for_it_instead_of_recomputing_it():
    s = Scheduler(KVCacheManager(1000), max_num_batched_tokens=128, max_num_seqs=8)
    shared = list(range(100, 300))  # 200 tokens: a chunk of 128, then 75 with room for more
    a = Request("a", shared + [1, 2, 3], SamplingParams(max_tokens=4, temperature=0))
    b = Request("b", shared + [4, 5], SamplingParams(max_tokens=4, temperature=0))
    other = req("c", 10, base=700)  # unrelated: not held back behind b
    s.add(a)
    run_step(s)  # a's first chunk
    s.add(b)
    s.add(other)
    out = run_step(s)
    assert [x.request.request_id for x in out.scheduled] == ["a", "c"] and list(s.waiting) == [b]
    while not a.prefill_cached:
        run_step(s)
    assert b in s.waiting  # held until a's prompt was published, then admitted with it cached
    run_step(s)
    assert b.status.name == "RUNNING" and b.num_cached_tokens >= len(shared)
    check_slots(s)


def test_no_holding_back_without_a_prefix_cache_or_for_a_short_shared_prefix():
    for cache, n_shared, held in ((False, 200, False), (True, 40, False), (True, 200, True)):
        s = Scheduler(KVCacheManager(1000, enable_prefix_caching=cache), max_num_batched_tokens=128,
                      max_num_seqs=8)
        shared = list(range(100, 100 + n_shared))
        # a's prompt: 250 tokens, so its second chunk leaves budget for b
        s.add(Request("a", shared + list(range(500, 750 - n_shared)), SamplingParams(max_tokens=4, temperature=0)))
        run_step(s)
        s.add(Request("b", shared + [1], SamplingParams(max_tokens=4, temperature=0)))
        run_step(s)
        assert bool(s.waiting) == held
