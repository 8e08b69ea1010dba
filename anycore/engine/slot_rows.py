"""Each running request's KV slots as a numpy row, kept up to date incrementally.

The attention kernels read a request's slots from ``slot_table`` ([batch, max_len] int64), which
the runner builds every step. Converting ``request.slots`` (a Python list) in full each time
costs O(context) per request per step (~45 us per 1000 tokens here, more than the rest of a
batch-1 step's bookkeeping at 4k tokens); here only the slots added since the last step are
converted.

Invariant relied on: the scheduler and the KV manager only ever append to a request's slot list
in place, or replace the list object (prefix caching, preemption, release). A row is reused only
while it was built from the very list object the request holds now (an identity check, with a
reference kept so the object cannot be recycled) and that list is not shorter.
"""

from __future__ import annotations

import numpy as np

from anycore.scheduler.request import Request


class _Row:
    __slots__ = ("source", "array", "count")

    def __init__(self, source: list[int]) -> None:
        self.source = source  # the list this row mirrors (kept alive: see the module invariant)
        self.array = np.empty(max(64, 2 * len(source)), dtype=np.int64)
        self.count = 0

    def sync(self) -> np.ndarray:
        """The row with every slot of ``source`` (appends converted, capacity doubled)."""
        n = len(self.source)
        if n > self.count:
            if n > len(self.array):
                grown = np.empty(2 * n, dtype=np.int64)
                grown[: self.count] = self.array[: self.count]
                self.array = grown
            self.array[self.count : n] = self.source[self.count : n]
            self.count = n
        return self.array


class SlotRows:
    def __init__(self) -> None:
        self._rows: dict[str, _Row] = {}

    def row(self, request: Request) -> np.ndarray:
        """``request.slots`` as int64 (at least ``len(request.slots)`` valid entries)."""
        r = self._rows.get(request.request_id)
        if r is None or r.source is not request.slots or len(r.source) < r.count:
            r = self._rows[request.request_id] = _Row(request.slots)
        return r.sync()

    def __len__(self) -> int:
        return len(self._rows)

    def retain(self, request_ids: set[str]) -> None:
        """Forgets rows of requests outside ``request_ids`` (finished, aborted, preempted)."""
        for rid in [rid for rid in self._rows if rid not in request_ids]:
            del self._rows[rid]
