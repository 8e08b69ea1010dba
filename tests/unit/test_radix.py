"""Radix prefix cache: match/insert/split/evict/lock accounting, checked against invariants."""

from __future__ import annotations

import random

from anycore.cache.radix import RadixCache
from anycore.cache.slot_allocator import SlotAllocator


def make(num_slots: int = 1000):
    alloc = SlotAllocator(num_slots)
    return alloc, RadixCache(alloc.free)


def insert_new(alloc, radix, tokens):
    slots = alloc.allocate(len(tokens))
    dup = radix.insert(tokens, slots)
    alloc.free(slots[:dup])  # we own the duplicates
    return slots


def test_match_empty_and_exact():
    alloc, radix = make()
    assert radix.match_prefix([1, 2, 3]) == ([], radix.root)
    slots = insert_new(alloc, radix, [1, 2, 3, 4])
    got, node = radix.match_prefix([1, 2, 3, 4, 5])
    assert got == slots
    assert node.key == (1, 2, 3, 4)
    radix.check_integrity()


def test_partial_match_splits_node():
    alloc, radix = make()
    slots = insert_new(alloc, radix, [1, 2, 3, 4])
    got, node = radix.match_prefix([1, 2, 9])
    assert got == slots[:2]
    assert node.key == (1, 2) and list(node.children[3].key) == [3, 4]
    radix.check_integrity()


def test_insert_reports_duplicates_and_branches():
    alloc, radix = make()
    a = insert_new(alloc, radix, [1, 2, 3, 4])
    b_slots = alloc.allocate(4)
    dup = radix.insert([1, 2, 7, 8], b_slots)
    assert dup == 2
    alloc.free(b_slots[:2])
    got, _ = radix.match_prefix([1, 2, 7, 8])
    assert got == a[:2] + b_slots[2:]
    assert radix.total_size == 6
    radix.check_integrity()


def test_lock_protects_from_eviction_and_accounting():
    alloc, radix = make()
    insert_new(alloc, radix, [1, 2, 3])
    insert_new(alloc, radix, [5, 6])
    _, node = radix.match_prefix([1, 2, 3])
    radix.lock(node)
    assert radix.protected_size == 3 and radix.evictable_size == 2
    radix.check_integrity()
    freed = radix.evict(100)
    assert freed == 2  # only the unlocked branch
    assert radix.match_prefix([1, 2, 3])[0] != []
    radix.unlock(node)
    assert radix.protected_size == 0 and radix.evictable_size == 3
    assert radix.evict(100) == 3
    assert radix.total_size == 0 and alloc.num_free == 1000
    radix.check_integrity()


def test_evict_is_lru_and_exposes_parents():
    alloc, radix = make()
    insert_new(alloc, radix, [1, 2, 3])
    insert_new(alloc, radix, [1, 2, 4])  # split: (1,2) -> {(3), (4)}
    insert_new(alloc, radix, [9, 9])
    radix.match_prefix([1, 2, 4])  # touch: now the most recent
    assert radix.evict(1) == 1  # the least recently used leaf is the (3) branch
    assert len(radix.match_prefix([1, 2, 3])[0]) == 2
    assert len(radix.match_prefix([9, 9])[0]) == 2
    radix.check_integrity()
    total = radix.total_size
    radix.evict(total)
    assert radix.total_size == 0
    radix.check_integrity()


def test_hit_rate_counters():
    alloc, radix = make()
    insert_new(alloc, radix, [1, 2, 3, 4])
    radix.match_prefix([1, 2, 3, 4, 5, 6, 7, 8])
    assert radix.queried_tokens == 8 and radix.hit_tokens == 4
    assert radix.hit_rate == 0.5


def test_random_operations_keep_invariants():
    rng = random.Random(0)
    alloc, radix = make(5000)
    locked = []
    for _ in range(400):
        op = rng.random()
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
        if op < 0.5 and alloc.num_free >= len(tokens):
            insert_new(alloc, radix, tokens)
        elif op < 0.7:
            _, node = radix.match_prefix(tokens)
            radix.lock(node)
            locked.append(node)
        elif op < 0.85 and locked:
            radix.unlock(locked.pop(rng.randrange(len(locked))))
        else:
            radix.evict(rng.randrange(1, 10))
        radix.check_integrity()
        assert alloc.num_free + radix.total_size == 5000  # no slot lost or duplicated
    for node in locked:
        radix.unlock(node)
    radix.evict(10**6)
    assert alloc.num_free == 5000
