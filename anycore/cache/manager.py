"""KV slot bookkeeping for requests: prefix matching, allocation with eviction, release.

Pure Python over token ids and slot ids (no tensors), so the scheduler is testable without a
model. Ownership invariant: every slot is exactly one of: free, owned by the radix tree, or
owned by one request (``request.slots`` beyond the part shared with the tree).

With sliding-window layers (``window``), each slot also has a window slot while its position can
still be read by a sliding layer (anycore/cache/swa.py): a request gives up the window KV of
positions behind its window after every step (``trim_window``), so those layers hold at most
``window - 1`` positions plus one step's new tokens per request, and a prefix hit stops where the
window KV before it is no longer held.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anycore.cache.radix import RadixCache
from anycore.cache.slot_allocator import SlotAllocator
from anycore.cache.swa import WindowSlots

if TYPE_CHECKING:
    from anycore.scheduler.request import Request


class KVCacheManager:
    def __init__(self, num_slots: int, enable_prefix_caching: bool = True, window: int | None = None,
                 num_window_slots: int = 0) -> None:
        """``window``: the longest sliding window of the model's sliding layers, whose KV lives in
        a pool of ``num_window_slots`` (None: one pool, every layer keeps every position)."""
        self.allocator = SlotAllocator(num_slots)
        self.swa = WindowSlots(num_slots, num_window_slots, window) if window else None
        self.radix = RadixCache(self._free_tree_slots) if enable_prefix_caching else None
        # request id -> first position whose window KV the request still holds (see swa.py)
        self._window_lo: dict[str, int] = {}

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

    def _free_tree_slots(self, slots: list[int]) -> None:
        if self.swa is not None:
            self.swa.tree_release(slots)
        self.allocator.free(slots)

    def _usable(self, slots: list[int]) -> int:
        return self.swa.usable_prefix(slots) if self.swa is not None else len(slots)

    def prefix_match_len(self, request: Request) -> int:
        """Length of the cached prefix usable by ``request`` (no side effects, no counters)."""
        if self.radix is None or request.needs_prompt_logprobs:
            return 0
        slots, _ = self.radix.match_prefix(request.all_token_ids[: request.num_tokens - 1], count=False)
        return self._usable(slots)

    def match(self, request: Request) -> int:
        """Attaches the longest cached prefix to a request with no KV yet; returns its length.
        At least one token is left to compute, so the step still yields logits.

        A request still collecting prompt logprobs matches nothing: a cached token's KV is
        reusable but its logits (the next prompt token's logprob) were never kept, so every
        prompt token it lacks a logprob for must run through its own forward pass. (It still
        publishes its prompt for others once computed.)

        With sliding layers the hit is cut to the longest prefix whose last ``window - 1``
        positions still hold window KV; the request then holds those positions' window KV."""
        assert not request.slots and request.num_computed_tokens == 0
        if self.radix is None or request.needs_prompt_logprobs:
            return 0
        tokens = request.all_token_ids[: request.num_tokens - 1]
        slots, node = self.radix.match_prefix(tokens, count=False)
        n = self._usable(slots)
        if n < len(slots):
            slots, node = self.radix.match_prefix(tokens[:n], count=False)
        self.radix.queried_tokens += len(tokens)
        self.radix.hit_tokens += n
        self.radix.lock(node)
        if self.swa is not None:
            lo = self.swa.keep_from(n)
            self.swa.ref(slots[lo:])
            self._window_lo[request.request_id] = lo
        request.cache_node = node
        request.slots = slots
        request.num_computed_tokens = n
        request.num_cached_tokens = n
        return n

    def allocate(self, n: int) -> list[int] | None:
        """``n`` free slots, evicting unlocked prefix-cache leaves if needed; None if impossible.
        With sliding layers each also gets a window slot (the prefix cache's window refs are
        dropped, then its leaves evicted, when that pool is short)."""
        short = n - self.allocator.num_free
        if short > 0 and self.radix is not None:
            self.radix.evict(short)
        if self.swa is not None and n > self.swa.allocator.num_free:
            self.swa.drop_tree_refs(n)
            while n > self.swa.allocator.num_free and self.radix is not None:
                if not self.radix.evict(n - self.swa.allocator.num_free):
                    break
            if n > self.swa.allocator.num_free:
                return None
        slots = self.allocator.allocate(n)
        if slots is not None and self.swa is not None:
            ok = self.swa.attach(slots)
            assert ok
        return slots

    def free(self, slots: list[int]) -> None:
        """Returns slots a caller allocated and never published (rolled-back drafts, scoring)."""
        if self.swa is not None:
            self.swa.unref(slots)
        self.allocator.free(slots)

    def trim_window(self, request: Request) -> None:
        """Gives up the window KV of the request's positions no later query can read (after each
        step; the positions' full-pool KV stays for the global layers)."""
        if self.swa is None:
            return
        rid = request.request_id
        lo = self._window_lo.get(rid, 0)
        new = self.swa.keep_from(request.num_computed_tokens)
        if new > lo:
            self.swa.unref(request.slots[lo:new])
            self._window_lo[rid] = new

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
        dup = [i for i, (s, t) in enumerate(zip(mine[:k], tree_slots)) if s != t]
        if self.swa is not None:
            lo = self._window_lo.get(request.request_id, 0)
            for i in dup:
                if i >= lo:  # (behind ``lo`` the request's own slot holds no window KV any more)
                    self.swa.adopt(mine[i], tree_slots[i])
            # (``window`` positions where still held, not ``window - 1``: a repeat of this very
            # prompt matches one token less, its last token must run for logits, so it resumes at
            # k - 1; at a prompt's end the request still holds them, its trim comes after this)
            self.swa.tree_hold(tree_slots[max(0, k - self.swa.window):k])
        if dup:
            self.allocator.free([mine[i] for i in dup])
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
        if self.swa is not None:
            self.swa.unref(request.slots[self._window_lo.pop(request.request_id, 0):])
        if len(request.slots) > k:
            self.allocator.free(request.slots[k:])
        if request.cache_node is not None:
            assert self.radix is not None
            self.radix.unlock(request.cache_node)
        request.cache_node = None
        request.slots = []

    def check_integrity(self) -> None:
        """Raises AssertionError when the tree's or the window pool's invariants are broken."""
        if self.radix is not None:
            self.radix.check_integrity()
        if self.swa is not None:
            self.swa.check()
            if self.radix is not None:
                owned = set(self.radix.all_slots())
                assert all(s in owned for s in self.swa.tree_held), "tree window ref on a slot the tree does not own"
