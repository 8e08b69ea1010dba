"""Per-request sampling parameters (vLLM-compatible names), validated on construction.

An out-of-range value raises InvalidParameter (a ValueError) naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from anycore.engine.grammar import StructuredOutput
from anycore.errors import InvalidParameter

_INT64 = 1 << 63


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    # None: up to the context length; 0: no generation (the request ends after its prompt is
    # prefilled, finish reason 'length': for prompt_logprobs / echo scoring)
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top alternatives per sampled token (0: just the sampled one)
    # vLLM's prompt_logprobs: None off; k: each prompt token's own logprob plus the top-k
    # alternatives at its position (the first prompt token has none: None in its place)
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # token id -> value added to its logit before sampling (OpenAI's [-100, 100]); the ids are
    # checked against the vocabulary by the InputProcessor
    logit_bias: dict[int, float] | None = None
    # a grammar the output must match (JSON schema, any JSON, regex, choices, EBNF)
    structured_output: StructuredOutput | None = None
    # False: this request never decodes speculatively, even when the engine speculates
    # (EngineConfig.speculative_algorithm); True: it may, when the engine's policy says it pays
    speculative: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        def bad(name: str, why: str) -> InvalidParameter:
            return InvalidParameter(f"invalid sampling parameter {name}={getattr(self, name)!r}: {why}", param=name)

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", "must be an integer >= 1")
        if self.temperature < 0.0 or self.temperature > 100.0:
            raise bad("temperature", "must be in [0, 100]")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", "must be 0 or -1 (disabled) or a positive integer")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "must be in [0, 1]")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise bad("repetition_penalty", "must be in (0, 10]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "must be in [-2, 2]")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "must be in [-2, 2]")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 0):
            raise bad("max_tokens", "must be an integer >= 0")
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            raise bad("min_tokens", "must be in [0, max_tokens]")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise bad("logprobs", "must be in [0, 20]")
        if self.prompt_logprobs is not None and (not isinstance(self.prompt_logprobs, int)
                                                 or not 0 <= self.prompt_logprobs <= 20):
            raise bad("prompt_logprobs", "must be in [0, 20]")
        if any(not isinstance(s, str) or not s for s in self.stop):  # type: ignore[union-attr]
            raise bad("stop", "stop strings must be non-empty strings")
        if self.seed is not None and (not isinstance(self.seed, int) or not -_INT64 <= self.seed < _INT64):
            raise bad("seed", "must be an integer that fits in a signed 64-bit integer")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise bad("logit_bias", "must map token ids to values")
            for tid, value in self.logit_bias.items():
                if not isinstance(tid, int) or isinstance(tid, bool):
                    raise bad("logit_bias", f"token id {tid!r} is not an integer")
                if (not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
                        or not -100.0 <= value <= 100.0):
                    raise bad("logit_bias", f"the value for token {tid} must be a number in [-100, 100]")
        if self.structured_output is not None and not isinstance(self.structured_output, StructuredOutput):
            raise bad("structured_output", "must be a StructuredOutput")
