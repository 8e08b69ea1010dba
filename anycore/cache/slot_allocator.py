"""O(1) free list over KV slot ids (one slot holds one token's K and V in every layer)."""

from __future__ import annotations


class SlotAllocator:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free: list[int] = list(range(num_slots - 1, -1, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        """``n`` slot ids, or None (nothing taken) when fewer are free."""
        if n > len(self._free):
            return None
        if n == 0:
            return []
        taken = self._free[:-n - 1:-1]  # the order n single pops would give (ascending when fresh)
        del self._free[-n:]
        return taken

    def free(self, slots: list[int]) -> None:
        self._free.extend(slots)
