"""engine/prompt_logprobs.py without a model: which rows get logits, the reduction, the merge."""

from __future__ import annotations

import torch

from anycore.engine.prompt_logprobs import (
    gather_prompt_logprobs,
    logits_layout,
    merge_prompt_logprobs,
    reduce_rows,
)
from anycore.sampling_params import SamplingParams
from anycore.scheduler.request import Request, TokenLogprob
from anycore.scheduler.scheduler import ScheduledRequest


def request(rid: str, n: int, prompt_logprobs: int | None) -> Request:
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=2, prompt_logprobs=prompt_logprobs))


def test_layout_keeps_every_row_of_prompt_logprob_chunks_and_the_last_of_the_others():
    plain, lp, decode = request("a", 3, None), request("b", 6, 1), request("c", 2, None)
    sched = [ScheduledRequest(plain, 0, 3, True), ScheduledRequest(lp, 2, 4, True), ScheduledRequest(decode, 1, 1, True)]
    layout = logits_layout(sched)
    assert layout.indices.tolist() == [2, 3, 4, 5, 6, 7]
    assert layout.sample_rows.tolist() == [0, 4, 5]  # a's row, b's last row, c's row
    assert [(s.request.request_id, s.first_row, s.start, s.count) for s in layout.spans] == [("b", 1, 2, 4)]
    assert logits_layout(sched[:1] + sched[2:]) is None  # nobody wants prompt logprobs: the usual rows


def test_gather_predicts_the_next_prompt_token_and_skips_the_last_position():
    torch.manual_seed(0)
    req = request("b", 5, 2)
    layout = logits_layout([ScheduledRequest(req, 0, 5, True)])
    hidden = torch.randn(5, 11)
    (first, entries), = gather_prompt_logprobs(layout, hidden, lambda h: h * 2).values()
    assert first == 0 and entries[0] is None and len(entries) == 5  # positions 0..3 predict tokens 1..4
    want = (hidden[:4] * 2).log_softmax(-1)
    for p, e in enumerate(entries[1:]):
        assert e.token_id == req.prompt_token_ids[p + 1]
        assert abs(e.logprob - want[p, e.token_id].item()) < 1e-6
        assert e.rank == int((want[p] > want[p, e.token_id]).sum()) + 1
        assert [t for t, _ in e.top] == want[p].topk(2).indices.tolist()
    # a later chunk starts at its first position + 1
    later = logits_layout([ScheduledRequest(req, 2, 3, True)])
    (first, entries), = gather_prompt_logprobs(later, hidden[2:], lambda h: h).values()
    assert first == 3 and len(entries) == 2


def test_reduce_rows_ranks_and_minus_inf():
    logprobs = torch.tensor([[0.0, float("-inf"), -1.0], [-3.0, -0.1, -2.0]])
    out = reduce_rows(logprobs, torch.tensor([1, 2]), 1)
    assert out[0].logprob == float("-inf") and out[0].rank == 3 and out[0].top == [(0, 0.0)]
    assert out[1].rank == 2 and out[1].top[0][0] == 1


def test_merge_skips_what_a_recomputed_chunk_repeats():
    req = request("b", 5, 0)
    entry = [TokenLogprob(i, -float(i), [], 1) for i in range(5)]
    merge_prompt_logprobs(req, (0, [None, entry[1], entry[2]]))
    merge_prompt_logprobs(req, (0, [None, entry[1]]))  # after a preemption: the same again
    merge_prompt_logprobs(req, (2, [entry[2], entry[3], entry[4]]))
    assert req.prompt_logprobs == [None, entry[1], entry[2], entry[3], entry[4]] and not req.needs_prompt_logprobs
