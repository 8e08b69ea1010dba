"""A request's state inside the engine: progress is a token count, not a phase."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from anycore.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # the top-N alternatives (token id, logprob), best first
    rank: int | None = None  # 1 + how many tokens were likelier (set for prompt logprobs)


@dataclass(eq=False)
class Request:
    """``num_computed_tokens`` chases ``num_tokens``: a prefill chunk, a decode step and a prefix
    cache hit are all just advances of that count. ``slots[i]`` holds the KV of token i."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    max_model_len: int = 1 << 30
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at admission
    slots: list[int] = field(default_factory=list)
    cache_node: Any = None  # locked radix node covering the shared prefix of ``slots``
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # prompt token i's logprob (params.prompt_logprobs); [0] is None (nothing precedes it).
    # Filled chunk by chunk during prefill; a recomputation after preemption skips what it has
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    prompt_logprobs_sent: bool = False  # handed out (with the first output after the prompt)
    generator: Any = None  # torch.Generator when params.seed is set
    num_preemptions: int = 0
    prefill_cached: bool = False  # prompt KV published to the prefix cache
    index: int = 0  # choice index in the caller's group (n samples x prompts), echoed in every output
    # the output's incremental detokenizer (engine/detokenizer.py): ``add(ids)`` and ``stopped``
    # when a stop string completed; fed by check_stop, token by token; None: no stop strings
    detokenizer: Any = None
    # the request's GrammarMatcher (engine/grammar.py) when its output must match a grammar: the
    # sampler masks with it, check_stop advances it past every kept token
    grammar: Any = None
    # speculative decoding's per-request history (anycore/spec/policy.py SpecState); None until
    # the request first decodes with speculation on
    spec_state: Any = None

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Prompt logprobs were asked for and some are still missing: every prompt token left
        must be computed by this request's own forward pass (no prefix-cache reuse)."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens

    @property
    def wants_output(self) -> bool:
        """False for max_tokens=0: the request only prefills its prompt (then ends, 'length')."""
        return self.params.max_tokens != 0

    @property
    def plain_greedy(self) -> bool:
        """Greedy, and nothing reads the logits beyond their argmax: no penalty, no logprobs, no
        EOS ban (before min_tokens), no logit bias, no grammar. Only such requests may take the
        multi-step native decode, which never goes through the sampler."""
        p = self.params
        return (p.temperature == 0.0 and p.logprobs is None and p.repetition_penalty == 1.0
                and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0 and self.num_output_tokens >= p.min_tokens
                and not p.logit_bias and self.grammar is None)

    @property
    def can_speculate(self) -> bool:
        """Each verified position's distribution depends only on its logits (so k + 1 rows can
        be sampled at once): no penalty (they depend on the tokens before), no logprobs (the
        rejected positions' would need care), no grammar (its mask depends on the tokens
        before), no EOS ban still pending (min_tokens). Temperature, top-k/p, min-p and logit
        bias are per-row and fine."""
        p = self.params
        return (p.logprobs is None and p.repetition_penalty == 1.0 and p.frequency_penalty == 0.0
                and p.presence_penalty == 0.0 and self.num_output_tokens >= p.min_tokens and self.grammar is None)

    def check_stop(self) -> str | None:
        """Finish reason after the newest token, or None to keep going: the token rules, then
        stop strings (the newest token goes to the detokenizer either way, so the text of a
        request stopped by a token includes what that token decodes to). A grammar advances
        past the token first; one at its end (a complete match only a stop token may follow, or
        a token it cannot take, which the sampler's mask rules out) ends the request with "stop"."""
        reason = self._token_stop()
        if self.grammar is not None:
            accepted = self.grammar.accept(self.output_token_ids[-1])
            if reason is None and (not accepted or self.grammar.at_end):
                reason = "stop"
        if self.detokenizer is not None:
            self.detokenizer.add(self.output_token_ids[-1:])
            if reason is None and self.detokenizer.stopped:
                reason = "stop"
        return reason

    def _token_stop(self) -> str | None:
        p = self.params
        last = self.output_token_ids[-1]
        if self.num_output_tokens > p.min_tokens:
            if not p.ignore_eos and last in self.eos_token_ids:
                return "stop"
            if last in p.stop_token_ids:
                return "stop"
        if p.max_tokens is not None and self.num_output_tokens >= p.max_tokens:
            return "length"
        if self.num_tokens >= self.max_model_len:
            return "length"
        return None
