"""Prompt logprobs (``SamplingParams.prompt_logprobs``), computed during prefill.

A prefill chunk of a request that wants them gets logits for every one of its new tokens, not
only the last: the hidden state at position p predicts prompt token p + 1. Logits are taken in
row blocks (a 2048-token chunk over a 49k vocabulary would be 400 MB of fp32 at once), in
fp32, and reduced right away to the prompt token's logprob, its rank and the top-k.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from anycore.scheduler.request import Request, TokenLogprob
from anycore.scheduler.scheduler import ScheduledRequest

_BLOCK_ROWS = 256  # logits rows materialised at once

# what a step computed for one request: (the prompt index of the first entry, the entries)
PromptLogprobPiece = tuple[int, list[TokenLogprob | None]]


@dataclass
class _Span:
    request: Request
    first_row: int  # where this chunk's rows begin among the selected hidden rows
    start: int  # the chunk's first position
    count: int  # the chunk's tokens


@dataclass
class VerifySpan:
    """A speculative verify step's rows among the kept rows (engine/spec_verify.py)."""

    scheduled: ScheduledRequest
    first_row: int
    count: int  # 1 + len(draft)


@dataclass
class LogitsLayout:
    """Which flat-batch rows get logits when some request wants prompt logprobs or verifies a
    draft: all the new rows of those requests, the last row of the other sampling requests."""

    indices: torch.Tensor  # rows of the flat batch to keep (the model's ``logits_indices``)
    sample_rows: torch.Tensor  # among the kept rows: each sampling request's last row, in order
    spans: list[_Span] = field(default_factory=list)
    verify_spans: list[VerifySpan] = field(default_factory=list)
    # among the sampling requests: those without a draft (sampled one token as usual), in order
    plain_sample_rows: torch.Tensor | None = None


def logits_layout(scheduled: Sequence[ScheduledRequest]) -> LogitsLayout | None:
    """The layout for this step, or None when no scheduled request wants prompt logprobs or
    verifies a draft (then the runner keeps its usual one row per sampling request)."""
    if not any(s.request.needs_prompt_logprobs or s.draft_tokens for s in scheduled):
        return None
    indices: list[np.ndarray] = []
    sample_rows: list[int] = []
    plain: list[int] = []
    spans: list[_Span] = []
    verify: list[VerifySpan] = []
    row = kept = 0
    for s in scheduled:
        n = s.num_new_tokens
        if s.request.needs_prompt_logprobs or s.draft_tokens:
            if s.draft_tokens:
                verify.append(VerifySpan(s, kept, n))
            else:
                spans.append(_Span(s.request, kept, s.start, n))
            indices.append(np.arange(row, row + n, dtype=np.int64))
            kept += n
        elif s.sample:
            indices.append(np.array([row + n - 1], dtype=np.int64))
            kept += 1
        if s.sample:
            if not s.draft_tokens:
                plain.append(len(sample_rows))
            sample_rows.append(kept - 1)
        row += n
    return LogitsLayout(torch.from_numpy(np.concatenate(indices)), torch.tensor(sample_rows, dtype=torch.long), spans,
                        verify, torch.tensor(plain, dtype=torch.long))


def gather_prompt_logprobs(layout: LogitsLayout, hidden: torch.Tensor,
                           compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, PromptLogprobPiece]:
    """Each span's prompt logprobs from its (final-normed) hidden rows."""
    out: dict[str, PromptLogprobPiece] = {}
    for span in layout.spans:
        req = span.request
        k = req.params.prompt_logprobs or 0
        entries: list[TokenLogprob | None] = [None] if span.start == 0 else []
        # position p predicts token p + 1; the last prompt position predicts the first output
        n_targets = min(span.count, req.num_prompt_tokens - 1 - span.start)
        for b in range(0, max(n_targets, 0), _BLOCK_ROWS):
            e = min(b + _BLOCK_ROWS, n_targets)
            rows = hidden[span.first_row + b : span.first_row + e]
            logprobs = compute_logits(rows).float().log_softmax(dim=-1)
            targets = torch.tensor(req.all_token_ids[span.start + 1 + b : span.start + 1 + e], dtype=torch.long)
            entries += reduce_rows(logprobs, targets, k)
        out[req.request_id] = (0 if span.start == 0 else span.start + 1, entries)
    return out


def reduce_rows(logprobs: torch.Tensor, targets: torch.Tensor, k: int) -> list[TokenLogprob | None]:
    """Per row of ``[rows, vocab]`` logprobs: the target's logprob and rank, and the top-k."""
    chosen = logprobs.gather(1, targets[:, None])
    ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
    chosen_list = chosen[:, 0].tolist()
    if k > 0:
        top_vals, top_ids = logprobs.topk(k, dim=-1)
        tops = [list(zip(i, v)) for i, v in zip(top_ids.tolist(), top_vals.tolist())]
    else:
        tops = [[] for _ in chosen_list]
    return [TokenLogprob(t, lp, top, rank) for t, lp, top, rank in zip(targets.tolist(), chosen_list, tops, ranks)]


def merge_prompt_logprobs(req: Request, piece: PromptLogprobPiece) -> None:
    """Appends the entries ``req`` does not have yet (a chunk recomputed after a preemption
    repeats some)."""
    first, entries = piece
    for j, entry in enumerate(entries):
        if first + j == len(req.prompt_logprobs):
            req.prompt_logprobs.append(entry)
