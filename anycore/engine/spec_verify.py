"""The runner's half of a speculative verify step: logits at every verified position, then the
lossless acceptance rule per request (anycore/spec/verify.py; trees: anycore/spec/tree.py).

A verify row's distribution is processed as the sampler would process a one-token step of that
request (logit bias, temperature, top-k/top-p/min-p): only requests whose processing does not
depend on the tokens before (``Request.can_speculate``) are given drafts, so the k + 1 rows of
one request share one SamplingBatch row, repeated.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from anycore.engine.prompt_logprobs import VerifySpan
from anycore.engine.sampler import SamplingBatch, _filter, apply_penalties, argmax_rows
from anycore.spec.tree import verify_tree_greedy, verify_tree_sampled
from anycore.spec.verify import verify_greedy, verify_sampled


def verify_drafts(spans: list[VerifySpan], hidden: torch.Tensor,
                  compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, list[int]]:
    """The tokens each verifying request emits (1 .. k + 1), from the kept ``hidden`` rows."""
    rows = torch.cat([torch.arange(v.first_row, v.first_row + v.count) for v in spans])
    return verify_logits(spans, compute_logits(hidden[rows]).float())


def verify_logits(spans: list[VerifySpan], logits: torch.Tensor) -> dict[str, list[int]]:
    """The same from the verified rows' logits, the spans' rows one after another."""
    out: dict[str, list[int]] = {}
    at = 0
    for v in spans:
        req = v.scheduled.request
        block = logits[at : at + v.count]
        at += v.count
        draft = v.scheduled.draft_tokens
        if v.scheduled.draft_parents is not None:  # a tree: its accepted path goes back to the scheduler
            batch = SamplingBatch.from_requests([req] * v.count)
            block = apply_penalties(block, batch)
            if req.params.temperature == 0.0:
                tokens, path = verify_tree_greedy(argmax_rows(block).tolist(), draft)  # type: ignore[arg-type]
            else:
                probs = _filter(block / req.params.temperature, batch).softmax(dim=-1)
                tokens, path = verify_tree_sampled(probs, draft, req.generator)  # type: ignore[arg-type]
            out[req.request_id], v.scheduled.tree_path = tokens, path
            continue
        if req.plain_greedy:
            out[req.request_id] = verify_greedy(argmax_rows(block).tolist(), draft)
            continue
        batch = SamplingBatch.from_requests([req] * v.count)
        block = apply_penalties(block, batch)
        if req.params.temperature == 0.0:
            out[req.request_id] = verify_greedy(argmax_rows(block).tolist(), draft)
            continue
        probs = _filter(block / req.params.temperature, batch).softmax(dim=-1)
        out[req.request_id] = verify_sampled(probs, draft, req.generator)
    return out
