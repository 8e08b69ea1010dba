"""Sliding-window KV (anycore/cache/swa.py) through the KV manager and the scheduler, without a
model: the window pool holds at most a window plus one step per request, freed window slots are
reused, nothing leaks on finish, abort or preemption, prefix hits stop where the window KV before
them is gone, shared prefixes keep what another request still reads, and rejected drafts give
their window slots back."""

from __future__ import annotations

from anycore.cache.manager import KVCacheManager
from anycore.cache.swa import WindowSlots
from anycore.sampling_params import SamplingParams
from anycore.scheduler.request import Request
from anycore.scheduler.scheduler import Scheduler
from anycore.spec.policy import SpeculativeConfig, Speculator
from tests.unit.test_scheduler import check_slots, run_step
from tests.unit.test_spec_scheduler import PROMPT, target_says

W = 16  # the sliding window


def req(rid: str, prompt: list[int], max_tokens: int = 8) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))


def kv(num_slots=4000, window_slots=4000, caching=True) -> KVCacheManager:
    return KVCacheManager(num_slots, caching, window=W, num_window_slots=window_slots)


def held_window(r: Request, m: KVCacheManager) -> list[int]:
    """Positions of ``r`` whose slot has window KV."""
    return [i for i, s in enumerate(r.slots) if m.swa.window_of[s] >= 0]


def check(s: Scheduler) -> None:
    check_slots(s)
    s.kv.check_integrity()
    for r in s.running:  # every position a later query reads still has window KV
        lo = max(0, r.num_computed_tokens - W + 1)
        assert all(s.kv.swa.window_of[x] >= 0 for x in r.slots[lo:])


def test_a_long_request_holds_only_its_window_and_gives_the_rest_back():
    budget = 8
    for caching in (False, True):
        m = kv(caching=caching)
        s = Scheduler(m, budget, 4)
        r = req("a", list(range(200)), max_tokens=100)
        s.add(r)
        peak = 0
        while s.has_unfinished():
            run_step(s)
            if s.running:
                check(s)
            peak = max(peak, m.swa.num_used)
            # the request's own window plus at most the tree's copy of the prompt's last window
            assert m.swa.num_used <= (W - 1 + budget) + (W if caching else 0)
            if s.running:
                assert len(held_window(r, m)) <= W - 1 + budget + (W if caching else 0)
                if not caching and r.num_computed_tokens >= W:  # between steps: exactly the window
                    assert m.swa.num_used == W - 1
        assert peak == W - 1 + (W if caching else 0)
        assert len(r.output_token_ids) == 100
        m.check_integrity()
        if caching:  # only the prefix cache's hold on the tail of what it caches stays
            assert m.swa.num_used == len(m.swa.tree_held) <= 2 * W
            assert m.num_used == 299
        else:
            assert m.swa.num_used == 0 and m.num_used == 0


def test_freed_window_slots_are_reused_so_a_small_window_pool_serves_long_requests():
    # a window pool of 3 windows serves a 600-token sequence: without freeing it would run out
    m = kv(num_slots=1000, window_slots=3 * W, caching=False)
    s = Scheduler(m, 8, 4)
    r = req("a", list(range(500)), max_tokens=100)
    s.add(r)
    while s.has_unfinished():
        out = run_step(s)
        assert not out.preempted
    assert len(r.output_token_ids) == 100 and s.num_preemptions == 0
    assert m.swa.num_used == 0 and m.swa.allocator.num_free == 3 * W
    m.check_integrity()


def test_window_pool_short_means_preemption_and_then_no_leak():
    m = kv(num_slots=1000, window_slots=2 * W + 8, caching=True)
    s = Scheduler(m, 8, 4)
    rs = [req(f"r{i}", [1000 * i + j for j in range(60)], max_tokens=30) for i in range(3)]
    for r in rs:
        s.add(r)
    while s.has_unfinished():
        run_step(s)
        check(s)
    assert all(len(r.output_token_ids) == 30 for r in rs)
    assert s.num_preemptions > 0  # three requests' windows do not fit at once
    m.check_integrity()
    assert m.swa.num_used == len(m.swa.tree_held)
    assert m.radix.protected_size == 0


def test_abort_mid_prefill_and_mid_decode_leaks_nothing():
    for caching in (False, True):
        m = kv(caching=caching)
        s = Scheduler(m, 8, 4)
        a, b = req("a", list(range(100)), 50), req("b", list(range(500, 540)), 50)
        s.add(a)
        s.add(b)
        for _ in range(12):  # a is decoding, b still prefilling? (a: 100 tokens in 8-token steps)
            run_step(s)
        s.finish(b, "abort")
        for _ in range(5):
            run_step(s)
        s.finish(a, "abort")
        assert not s.has_unfinished()
        m.check_integrity()
        assert m.swa.num_used == len(m.swa.tree_held)
        if not caching:
            assert m.num_used == 0 and m.swa.num_used == 0
        else:
            m.radix.evict(m.num_slots)  # everything cached goes: then nothing at all is held
            assert m.num_used == 0 and m.swa.num_used == 0 and not m.swa.tree_held
            m.check_integrity()


def test_prefix_hit_stops_where_the_window_kv_before_it_was_freed():
    m = kv()
    s = Scheduler(m, 8, 4)
    a = req("a", list(range(100)), max_tokens=40)
    s.add(a)
    while s.has_unfinished():
        run_step(s)
    # the tree caches 139 positions; it holds window KV for the last W of the prompt
    # (published when the prefill ended) and of the whole sequence (published at the finish)
    seq = a.all_token_ids[:139]
    a_slots = m.radix.match_prefix(seq, count=False)[0]
    assert len(a_slots) == 139 and set(m.swa.tree_held) <= set(a_slots)
    held = {i for i, x in enumerate(a_slots) if m.swa.window_of[x] >= 0}
    # (at the finish the request had already given up position 139 - W: W - 1 there)
    assert held == set(range(100 - W, 100)) | set(range(139 - W + 1, 139))

    # resuming right after the prompt or after the whole sequence: a full hit
    b = req("b", seq[:100] + [7777], max_tokens=4)
    assert m.prefix_match_len(b) == 100
    # the same prompt again matches one token less (its last one must run for logits): held too
    assert m.prefix_match_len(req("b2", seq[:100], max_tokens=4)) == 99
    c = req("c", seq + [7777], max_tokens=4)
    assert m.prefix_match_len(c) == 139
    # in between, the window before the resume point is gone: the hit falls back to the prompt
    d = req("d", seq[:120] + [7777], max_tokens=4)
    assert m.prefix_match_len(d) == 100
    # before the prompt's held tail: nothing before position 84 holds window KV
    e = req("e", seq[:60] + [7777], max_tokens=4)
    assert m.prefix_match_len(e) == 0
    hits = m.radix.hit_tokens
    s.add(d)
    run_step(s)
    assert m.radix.hit_tokens - hits == 100 and d.num_cached_tokens == 100
    check(s)
    while s.has_unfinished():
        run_step(s)
        check(s)
    m.check_integrity()


def test_a_request_ahead_on_a_shared_prefix_does_not_free_what_another_still_reads():
    m = kv()
    s = Scheduler(m, 64, 4)
    prompt = list(range(60))
    a = req("a", prompt, max_tokens=100)
    s.add(a)
    run_step(s)  # a's prompt computed and published
    b = req("b", prompt + [5000], max_tokens=20)
    s.add(b)
    run_step(s)  # b resumes at 60 on the shared prefix; a decodes on
    assert b.num_cached_tokens == 60
    m.swa.drop_tree_refs(m.swa.num_slots)  # (so only the requests' own holds keep b's window)
    assert not m.swa.tree_held
    for _ in range(60):  # a moves far past the shared prefix; b's window still covers its end
        run_step(s)
        check(s)  # (checks b's window too)
    assert b.is_finished and not a.is_finished
    while s.has_unfinished():
        run_step(s)
    m.check_integrity()


def test_a_duplicate_computed_beside_a_tree_slot_without_window_kv_moves_its_window_slot_over():
    m = kv()
    s = Scheduler(m, 64, 4)
    a = req("a", list(range(40)), max_tokens=1)
    s.add(a)
    while s.has_unfinished():
        run_step(s)
    m.swa.drop_tree_refs(m.swa.num_slots)  # the tree keeps the full KV only
    assert m.swa.num_used == 0
    b = req("b", list(range(40)) + [9, 9], max_tokens=3)
    s.add(b)
    run_step(s)
    assert b.num_cached_tokens == 0  # no window KV to resume with: recomputed
    check(s)  # b was re-pointed at the tree's slots and their window KV is b's
    assert all(m.swa.window_of[x] >= 0 for x in b.slots[max(0, b.num_computed_tokens - W + 1):])
    while s.has_unfinished():
        run_step(s)
    m.check_integrity()


def test_rejected_drafts_give_back_their_window_slots():
    m = kv(caching=False)
    s = Scheduler(m, 64, 8, speculator=Speculator(SpeculativeConfig(num_tokens=4)))
    r = req("a", PROMPT, max_tokens=32)
    s.add(r)
    s.update(s.schedule(), {"a": [4]})
    out = s.schedule()
    assert out.scheduled[0].draft_tokens == [5, 6, 7, 8]
    used = m.swa.num_used
    s.update(out, target_says(out, {"a": [5, 6, 0, 0, 0]}))  # 2 drafts accepted, 2 rejected
    assert len(r.slots) == r.num_computed_tokens
    assert m.swa.num_used == used - 2
    m.check_integrity()
    s.finish(r, "abort")
    assert m.swa.num_used == 0 and m.num_used == 0


def test_usable_prefix_rule():
    w = WindowSlots(20, 20, 4)
    slots = list(range(10))
    w.attach(slots)
    assert w.usable_prefix(slots) == 10
    w.unref([slots[7]])  # position 7 lost: resuming at 8, 9 or 10 would read it
    assert w.usable_prefix(slots) == 7
    w.unref([slots[5]])
    assert w.usable_prefix(slots) == 5
    w.unref(slots[:3])
    assert w.usable_prefix(slots) == 0  # 5 needs 2..4 (2 is gone); 3 and below need 0..2
    assert w.usable_prefix(slots[:3]) == 0 and w.usable_prefix([]) == 0
    w.check()
