"""Token usage of one HTTP request, counted as its outputs stream in (for the final usage chunk
and for ``stream_options.continuous_usage_stats``, which puts the running counts on every chunk)."""

from __future__ import annotations

from typing import Any

from anycore.outputs import StepOutput


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


class UsageCounter:
    """Running counts over a request's choices: output tokens per choice, cached prompt tokens
    per prompt (the latest sample of that prompt to report; choice i is prompt i // n)."""

    def __init__(self, prompt_tokens: int, n: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.n = n
        self._completion: dict[int, int] = {}
        self._cached: dict[int, int] = {}

    def add(self, out: StepOutput) -> None:
        self._completion[out.index] = out.num_output_tokens
        self._cached[out.index // self.n] = out.num_cached_tokens

    @property
    def completion_tokens(self) -> int:
        return sum(self._completion.values())

    def as_dict(self) -> dict[str, Any]:
        return usage_dict(self.prompt_tokens, self.completion_tokens, sum(self._cached.values()))
