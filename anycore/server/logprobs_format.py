"""Logprobs as the HTTP answers spell them: the legacy completions object and vLLM's
``prompt_logprobs`` list.

Choices where OpenAI's text leaves room, following vLLM:
- /v1/completions ``top_logprobs[i]`` holds the ``logprobs`` likeliest tokens *and* the sampled
  (or echoed prompt) token, so up to logprobs + 1 entries; ``logprobs=0`` gives just the token
  itself (OpenAI: "the API will always return the logprob of the sampled token").
- With ``echo``, the object covers the prompt tokens first; the first prompt token has nothing
  before it: its ``token_logprobs`` and ``top_logprobs`` entries are null.
- ``prompt_logprobs`` (vLLM's field): one entry per prompt token, null first, then
  ``{token_id: {"logprob", "rank", "decoded_token"}}`` with the prompt token itself first and
  then the top-k (keys are strings, as JSON has them).
- A logprob of -inf (a token with zero probability) is written as -9999.0, as vLLM does, since
  JSON has no infinity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from anycore.scheduler.request import TokenLogprob

TokenText = Callable[[int], str]
# one position of the legacy object: the token id and its logprob entry (None: the first
# prompt token, which has no logprob)
Position = tuple[int, TokenLogprob | None]


def finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0


def prompt_positions(prompt_ids: Sequence[int], prompt_logprobs: Sequence[TokenLogprob | None]) -> list[Position]:
    return list(zip(prompt_ids, prompt_logprobs))


def output_positions(logprobs: Sequence[TokenLogprob]) -> list[Position]:
    return [(t.token_id, t) for t in logprobs]


def completion_logprobs(token_text: TokenText, positions: Sequence[Position], num_top: int,
                        offset: int = 0) -> dict[str, Any]:
    """The legacy ``{tokens, token_logprobs, top_logprobs, text_offset}`` object; ``offset`` is
    the text offset of the first position (a stream continues where its last chunk ended)."""
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for token_id, lp in positions:
        text = token_text(token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if lp is None:
            token_lps.append(None)
            tops.append(None)
            continue
        token_lps.append(finite(lp.logprob))
        top = {token_text(i): finite(v) for i, v in lp.top[:num_top]}
        top.setdefault(text, finite(lp.logprob))
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def text_length(obj: dict[str, Any]) -> int:
    """Characters the tokens of a legacy logprobs object span (where the next chunk's offsets start)."""
    return sum(len(t) for t in obj["tokens"])


def vllm_prompt_logprobs(token_text: TokenText, prompt_logprobs: Sequence[TokenLogprob | None],
                         num_top: int) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: per prompt token, the token itself then its top ``num_top``."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for lp in prompt_logprobs:
        if lp is None:
            out.append(None)
            continue
        entry = {str(lp.token_id): {"logprob": finite(lp.logprob), "rank": lp.rank,
                                    "decoded_token": token_text(lp.token_id)}}
        for rank, (tid, v) in enumerate(lp.top[:num_top], start=1):
            entry.setdefault(str(tid), {"logprob": finite(v), "rank": rank, "decoded_token": token_text(tid)})
        out.append(entry)
    return out
