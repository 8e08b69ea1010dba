"""KV slot bookkeeping for requests: prefix matching, allocation with eviction, release.

Pure Python over token ids and slot ids (no tensors), so the scheduler is testable without a
model. Ownership invariant: every slot is exactly one of: free, owned by the radix tree, or
owned by one request (``request.slots`` beyond the part shared with the tree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anycore.cache.radix import RadixCache
from anycore.cache.slot_allocator import SlotAllocator

if TYPE_CHECKING:
    from anycore.scheduler.request import Request


class KVCacheManager:
    def __init__(self, num_slots: int, enable_prefix_caching: bool = True) -> None:
        self.allocator = SlotAllocator(num_slots)
        self.radix = RadixCache(self.allocator.free) if enable_prefix_caching else None

    @property
    def num_slots(self) -> int:
        return self.allocator.num_slots

    @property
    def num_available(self) -> int:
        """Slots obtainable now: free ones plus those evictable from the prefix cache."""
        return self.allocator.num_free + (self.radix.evictable_size if self.radix else 0)

    @property
    def num_used(self) -> int:
        return self.num_slots - self.allocator.num_free

    def prefix_match_len(self, request: Request) -> int:
        """Length of the cached prefix usable by ``request`` (no side effects, no counters)."""
        if self.radix is None or request.needs_prompt_logprobs:
            return 0
        slots, _ = self.radix.match_prefix(request.all_token_ids[: request.num_tokens - 1], count=False)
        return len(slots)

    def match(self, request: Request) -> int:
        """Attaches the longest cached prefix to a request with no KV yet; returns its length.
        At least one token is left to compute, so the step still yields logits.

        A request still collecting prompt logprobs matches nothing: a cached token's KV is
        reusable but its logits (the next prompt token's logprob) were never kept, so every
        prompt token it lacks a logprob for must run through its own forward pass. (It still
        publishes its prompt for others once computed.)"""
        assert not request.slots and request.num_computed_tokens == 0
        if self.radix is None or request.needs_prompt_logprobs:
            return 0
        slots, node = self.radix.match_prefix(request.all_token_ids[: request.num_tokens - 1])
        self.radix.lock(node)
        request.cache_node = node
        request.slots = slots
        request.num_computed_tokens = len(slots)
        request.num_cached_tokens = len(slots)
        return len(slots)

    def allocate(self, n: int) -> list[int] | None:
        """``n`` free slots, evicting unlocked prefix-cache leaves if needed; None if impossible."""
        short = n - self.allocator.num_free
        if short > 0 and self.radix is not None:
            self.radix.evict(short)
        return self.allocator.allocate(n)

    def cache_prefix(self, request: Request) -> None:
        """Publishes the request's computed tokens in the prefix cache and re-points the request
        at the tree's slots (freeing its duplicates), so concurrent requests can share them."""
        if self.radix is None:
            return
        k = request.num_computed_tokens
        tokens = request.all_token_ids[:k]
        self.radix.insert(tokens, request.slots[:k])
        tree_slots, node = self.radix.match_prefix(tokens, count=False)
        mine = request.slots
        duplicates = [s for s, t in zip(mine[:k], tree_slots) if s != t]
        if duplicates:
            self.allocator.free(duplicates)
        request.slots = tree_slots + mine[k:]
        self.radix.lock(node)
        if request.cache_node is not None:
            self.radix.unlock(request.cache_node)
        request.cache_node = node

    def release(self, request: Request) -> None:
        """Gives up all of a request's KV (finish, abort, preemption). Computed tokens stay in
        the prefix cache (unlocked, evictable) when caching is on."""
        if self.radix is not None and request.num_computed_tokens > 0:
            self.cache_prefix(request)
        k = request.num_computed_tokens if self.radix is not None else 0
        if len(request.slots) > k:
            self.allocator.free(request.slots[k:])
        if request.cache_node is not None:
            assert self.radix is not None
            self.radix.unlock(request.cache_node)
        request.cache_node = None
        request.slots = []
