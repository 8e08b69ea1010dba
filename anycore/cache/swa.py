"""Sliding-window KV slots: the second pool that sliding-attention layers read and write.

A model with sliding-window layers (Gemma 3: 5 of every 6) keeps two KV pools. The *full* pool
(global layers) is indexed by the slot ids the allocator, the requests and the radix tree deal
in, one per position for the sequence's whole life. The *window* pool (sliding layers) is indexed
by window slots, and a full slot has a window slot only while some holder may still attend to
that position from a sliding layer: ``window_of[full slot]`` is the window slot, or -1.

Holders, each counted once in ``refs[full slot]`` (the window slot is freed when it drops to 0):
- a request holds positions ``lo .. len(slots) - 1`` of its slot list, where ``lo`` grows to
  ``num_computed_tokens - window + 1``: the next query (at ``num_computed_tokens``) and all later
  ones see only keys after ``position - window``, so older positions are never read again;
- the prefix cache holds the last ``window`` positions of each sequence it was given (what a
  request resuming right there, or one token earlier, reads), droppable oldest first under
  pressure and dropped when the tree evicts those slots.

Invariants (``check``): ``window_of[s] >= 0`` iff ``refs[s] > 0``; no window slot is mapped
twice; mapped + free window slots = the pool. A prefix hit is usable only up to a length whose
preceding ``window - 1`` positions are all mapped (``usable_prefix``), so a hit never reads a
sliding layer's freed KV.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from anycore.cache.slot_allocator import SlotAllocator


class WindowSlots:
    def __init__(self, num_full_slots: int, num_window_slots: int, window: int) -> None:
        assert window >= 1
        self.window = window
        self.allocator = SlotAllocator(num_window_slots)
        self.window_of = np.full(num_full_slots, -1, dtype=np.int64)
        self.refs = np.zeros(num_full_slots, dtype=np.int32)
        # full slots the prefix cache holds a ref on, oldest first (a dict as an ordered set)
        self.tree_held: dict[int, None] = {}

    @property
    def num_slots(self) -> int:
        return self.allocator.num_slots

    @property
    def num_used(self) -> int:
        return self.allocator.num_slots - self.allocator.num_free

    def keep_from(self, num_computed: int) -> int:
        """First position a request that computed ``num_computed`` tokens may still read."""
        return max(0, num_computed - self.window + 1)

    def attach(self, full_slots: Sequence[int]) -> bool:
        """Gives each new full slot a window slot (one ref, its request's); False if short."""
        got = self.allocator.allocate(len(full_slots))
        if got is None:
            return False
        idx = np.asarray(full_slots, dtype=np.int64)
        assert not (self.refs[idx] > 0).any(), "a new full slot already has a window slot"
        self.window_of[idx] = got
        self.refs[idx] = 1
        return True

    def ref(self, full_slots: Sequence[int]) -> None:
        if not full_slots:
            return
        idx = np.asarray(full_slots, dtype=np.int64)
        assert (self.window_of[idx] >= 0).all(), "ref on a position whose window KV was freed"
        np.add.at(self.refs, idx, 1)

    def unref(self, full_slots: Sequence[int]) -> None:
        if not full_slots:
            return
        idx = np.asarray(full_slots, dtype=np.int64)
        np.add.at(self.refs, idx, -1)
        assert (self.refs[idx] >= 0).all(), "window ref underflow"
        dead = np.unique(idx[self.refs[idx] == 0])
        if len(dead):
            self.allocator.free(self.window_of[dead].tolist())
            self.window_of[dead] = -1

    def adopt(self, mine: int, tree: int) -> None:
        """A request re-pointed from its own slot ``mine`` to the tree's ``tree`` (same token,
        same position, so the same KV): its ref moves over, and if the tree's slot had lost its
        window KV, ``mine``'s window slot moves with it."""
        if self.window_of[tree] < 0:
            assert self.refs[mine] == 1 and self.refs[tree] == 0
            self.window_of[tree] = self.window_of[mine]
            self.refs[tree] = 1
            self.window_of[mine] = -1
            self.refs[mine] = 0
        else:
            self.refs[tree] += 1
            self.unref([mine])

    def usable_prefix(self, full_slots: Sequence[int]) -> int:
        """Longest ``n <= len(full_slots)`` whose positions ``n - window + 1 .. n - 1`` all hold
        window KV (what a request resuming at position ``n`` reads in sliding layers)."""
        n = len(full_slots)
        if n == 0:
            return 0
        missing = np.flatnonzero(self.window_of[np.asarray(full_slots, dtype=np.int64)] < 0)
        if len(missing) == 0:
            return n
        # the answer is n or a gap g (resuming at g recomputes g itself); either is usable iff the
        # gap before it lies at least ``window`` positions back (the first gap always is: all
        # before it is held)
        cand = np.append(missing, n)
        prev = np.concatenate(([-self.window], missing))
        return int(cand[cand - prev >= self.window][-1])

    def tree_hold(self, full_slots: Sequence[int]) -> None:
        """The tree takes a ref on each of these slots that still has window KV."""
        new = [s for s in full_slots if s not in self.tree_held and self.window_of[s] >= 0]
        self.ref(new)
        self.tree_held.update(dict.fromkeys(new))

    def tree_release(self, full_slots: Sequence[int]) -> None:
        """The tree gives up these slots (evicted): its refs on them go."""
        held = [s for s in full_slots if s in self.tree_held]
        for s in held:
            del self.tree_held[s]
        self.unref(held)

    def drop_tree_refs(self, want: int) -> None:
        """Drops the tree's refs oldest first until ``want`` window slots are free (or none left)."""
        while self.allocator.num_free < want and self.tree_held:
            s = next(iter(self.tree_held))
            del self.tree_held[s]
            self.unref([s])

    def check(self) -> None:
        mapped = self.window_of[self.window_of >= 0]
        assert ((self.window_of >= 0) == (self.refs > 0)).all(), "window slot without a holder, or the reverse"
        assert len(np.unique(mapped)) == len(mapped), "a window slot is mapped twice"
        assert len(mapped) == self.num_used, f"{len(mapped)} mapped window slots != {self.num_used} in use"
        assert all(self.window_of[s] >= 0 for s in self.tree_held), "tree ref on an unmapped slot"
