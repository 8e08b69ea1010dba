"""Radix tree over token ids whose nodes own KV slots: longest-prefix reuse across requests.

Invariants (checked by ``check_integrity``):
- every node's ``key`` (token ids) and ``slots`` have equal length; children are keyed by the
  first token of their key, and no two children share it;
- ``lock_ref`` of a node = number of live requests whose matched prefix passes through it;
  a locked node and its ancestors are never evicted;
- ``evictable_size`` + ``protected_size`` = number of slots the tree owns, where a slot is
  protected iff its node has lock_ref > 0.
Only leaves are evicted, least recently used first; evicting a leaf may expose its parent.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence

_clock = itertools.count()


class RadixNode:
    __slots__ = ("key", "slots", "children", "parent", "lock_ref", "last_access")

    def __init__(self, key: tuple[int, ...] = (), slots: list[int] | None = None, parent: RadixNode | None = None):
        self.key = key
        self.slots: list[int] = slots or []
        self.children: dict[int, RadixNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = next(_clock)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class RadixCache:
    def __init__(self, free_slots: Callable[[list[int]], None]) -> None:
        self._free_slots = free_slots
        self.root = RadixNode()
        self.root.lock_ref = 1  # the root is never evicted
        self.evictable_size = 0
        self.protected_size = 0
        # hit-rate counters: tokens asked for vs tokens served from the cache
        self.queried_tokens = 0
        self.hit_tokens = 0

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def match_prefix(self, tokens: Sequence[int], count: bool = True) -> tuple[list[int], RadixNode]:
        """Slots of the longest cached prefix of ``tokens`` and the node where it ends."""
        node, slots, pos = self.root, [], 0
        now = next(_clock)
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _common_prefix(child.key, tokens[pos:])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            slots.extend(child.slots)
            node, pos = child, pos + n
        if count:
            self.queried_tokens += len(tokens)
            self.hit_tokens += len(slots)
        return slots, node

    def insert(self, tokens: Sequence[int], slots: list[int]) -> int:
        """Adds ``tokens`` whose KV is at ``slots``. Returns how many leading tokens were already
        cached: the caller still owns those duplicate slots (``slots[:n]``) and must free them
        unless they are the very slots the tree holds."""
        assert len(tokens) == len(slots)
        node, pos = self.root, 0
        now = next(_clock)
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                leaf = RadixNode(tuple(tokens[pos:]), list(slots[pos:]), node)
                node.children[tokens[pos]] = leaf
                self.evictable_size += len(leaf.slots)
                return pos
            n = _common_prefix(child.key, tokens[pos:])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            node, pos = child, pos + n
        return pos

    def _split(self, child: RadixNode, n: int) -> RadixNode:
        """Splits ``child`` so its first ``n`` tokens become a new parent node; returns it."""
        parent = child.parent
        assert parent is not None
        head = RadixNode(child.key[:n], child.slots[:n], parent)
        head.lock_ref = child.lock_ref
        head.last_access = child.last_access
        head.children = {child.key[n]: child}
        parent.children[child.key[0]] = head
        child.key = child.key[n:]
        child.slots = child.slots[n:]
        child.parent = head
        return head

    def lock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.slots)
                self.protected_size += len(node.slots)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable_size += len(node.slots)
                self.protected_size -= len(node.slots)
            node.lock_ref -= 1
            assert node.lock_ref >= 0, "radix lock underflow"
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_slots: int) -> int:
        """Frees at least ``num_slots`` slots from unlocked leaves (LRU first) if possible;
        returns how many were freed."""
        heap = [(n.last_access, id(n), n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_slots and heap:
            _, _, leaf = heapq.heappop(heap)
            self._free_slots(leaf.slots)
            freed += len(leaf.slots)
            self.evictable_size -= len(leaf.slots)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    def _leaves(self) -> list[RadixNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                out.append(node)
        return out

    def all_slots(self) -> list[int]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.extend(node.slots)
            stack.extend(node.children.values())
        return out

    def check_integrity(self) -> None:
        """Raises AssertionError when an invariant of the tree is broken."""
        evictable = protected = 0
        stack = [self.root]
        while stack:
            node = stack.pop()
            assert len(node.key) == len(node.slots), "key/slot length mismatch"
            if node is not self.root:
                assert node.key, "empty non-root node"
                assert node.lock_ref >= 0
                if node.lock_ref > 0:
                    protected += len(node.slots)
                else:
                    evictable += len(node.slots)
                assert node.parent is not None and node.parent.children.get(node.key[0]) is node, "broken parent link"
                if node.parent is not self.root:
                    assert node.parent.lock_ref >= node.lock_ref, "child locked more than its parent"
            for first, child in node.children.items():
                assert child.key[0] == first, "child keyed by the wrong token"
                stack.append(child)
        assert evictable == self.evictable_size, f"evictable {evictable} != counter {self.evictable_size}"
        assert protected == self.protected_size, f"protected {protected} != counter {self.protected_size}"
        slots = self.all_slots()
        assert len(slots) == len(set(slots)), "a slot is owned twice"
