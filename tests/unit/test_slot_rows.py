"""SlotRows mirrors each request's slot list as int64, converting only what was appended."""

from __future__ import annotations

import numpy as np

from anycore.engine.slot_rows import SlotRows
from anycore.sampling_params import SamplingParams
from anycore.scheduler.request import Request


def _req(rid: str, slots: list[int]) -> Request:
    r = Request(rid, [1, 2, 3], SamplingParams())
    r.slots = slots
    return r


def test_appends_in_place_are_picked_up_and_growth_keeps_values():
    rows, r = SlotRows(), _req("a", [5, 6, 7])
    assert rows.row(r)[:3].tolist() == [5, 6, 7]
    first = rows.row(r)
    r.slots.extend(range(100, 300))  # past the initial capacity
    row = rows.row(r)
    assert row[:203].tolist() == r.slots
    r.slots.append(9)
    assert rows.row(r)[203] == 9
    assert first[:3].tolist() == [5, 6, 7]  # an earlier view is never rewritten below its length


def test_a_replaced_or_shrunk_list_is_converted_again():
    rows, r = SlotRows(), _req("a", [1, 2, 3, 4])
    rows.row(r)
    r.slots = [9, 8] + r.slots[2:]  # prefix caching re-points the request at the tree's slots
    assert rows.row(r)[:4].tolist() == [9, 8, 3, 4]
    del r.slots[1:]  # the same list object, shorter
    assert rows.row(r)[:1].tolist() == [9]
    r.slots.extend([7, 7])
    assert rows.row(r)[:3].tolist() == [9, 7, 7]


def test_retain_forgets_other_requests():
    rows = SlotRows()
    a, b = _req("a", [1]), _req("b", [2])
    rows.row(a), rows.row(b)
    rows.retain({"b"})
    assert len(rows) == 1
    assert isinstance(rows.row(b), np.ndarray) and rows.row(a)[0] == 1 and len(rows) == 2
