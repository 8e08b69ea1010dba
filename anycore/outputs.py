"""What the engine hands back: per-step deltas (streaming) and whole results (offline API)."""

from __future__ import annotations

from dataclasses import dataclass, field

from anycore.errors import AnycoreError
from anycore.scheduler.request import TokenLogprob


@dataclass
class StepOutput:
    """One request's progress in one engine step (the unit the server streams)."""

    request_id: str
    new_token_ids: list[int]
    delta_text: str
    finished: bool
    finish_reason: str | None
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    # the whole prompt's logprobs (SamplingParams.prompt_logprobs), once: in the request's first
    # output after its prompt is computed; [0] is None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    index: int = 0  # choice index in the request's group (EngineRequest.index)
    error: AnycoreError | None = None  # set on a request failed outside the model (then finished)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's queues and KV pool (``Engine.stats()``); counters are totals
    since start."""

    num_waiting: int = 0
    num_running: int = 0
    kv_slots_total: int = 0
    kv_slots_used: int = 0  # includes slots owned only by the prefix cache
    kv_slots_cached: int = 0  # evictable prefix-cache slots (reusable, not held by any request)
    # sliding-window layers' pool (anycore/cache/swa.py): its tokens and those in use; 0: none
    kv_window_slots_total: int = 0
    kv_window_slots_used: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    num_preemptions: int = 0
    # speculative decoding: verify steps, draft tokens proposed in them, and those accepted
    spec_verify_steps: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0

    @property
    def spec_acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens (0 before any verify step)."""
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else 0.0

    @property
    def spec_acceptance_length(self) -> float:
        """Mean tokens a verify step emitted (accepted drafts + the target's own token)."""
        return 1.0 + self.spec_accepted_tokens / self.spec_verify_steps if self.spec_verify_steps else 0.0

    @property
    def kv_slots_held(self) -> int:
        """Slots pinned by live requests (or locked prefixes); 0 when nothing is in flight."""
        return self.kv_slots_used - self.kv_slots_cached


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None = None


@dataclass
class RequestOutput:
    """A finished request (vLLM shape: ``.outputs[i]`` for each of the n samples)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    # SamplingParams.prompt_logprobs (vLLM's shape: one entry per prompt token, None first)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served (to the first sample)
    finished: bool = True

    # conveniences for the common n == 1 case
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        return self.outputs[0].logprobs
