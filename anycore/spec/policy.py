"""When a request speculates, and what it proposes: the engine-wide settings, each request's
acceptance history (back-off) and the totals ``Engine.stats()`` reports.

Speculation pays when verifying 1 + k tokens costs little more than one decode step (batch-1
decode of bf16 weights reads every weight once per step whatever the token count) and enough
drafts are accepted. How much more it costs is measured, not assumed (spec/step_cost.py): each
step's wall time is recorded by the rows it computed, and each request's k is the one with the
most expected tokens per second for its per-token acceptance and the batch it is in, 0 (a plain
step) when none pays. So speculation backs off (a) when the drafts are mostly rejected (also:
below ``min_acceptance``, an EWMA of the accepted fraction), (b) when verification is not
nearly free in this weight format (the Q4 block kernels are compute-bound), and (c) when the
batch is large enough that every verified row costs compute; above ``max_batch`` running
requests nobody speculates at all. A back-off lasts a growing number of steps; the request then
probes once with the configured k, which re-measures both its acceptance and the step's cost.

Reproducibility: a seeded sampling request's random draws depend on whether it speculated, so
its decision must not depend on other requests. It ignores the batch-size rule (its back-off
depends only on its own tokens; a step whose token budget or KV pool leaves no room for its draft
still changes it). Greedy requests give the same tokens either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from anycore.scheduler.request import Request
from anycore.spec.ngram import propose_ngram
from anycore.spec.step_cost import StepCosts

ALGORITHMS = ("ngram", "draft", "eagle", "eagle3", "mtp")
HEAD_ALGORITHMS = ("eagle", "eagle3", "mtp")  # a one-layer head over target features (spec/eagle.py)

_EWMA_WEIGHT = 0.3  # of the newest verify step in a request's acceptance average
_MAX_BACKOFF = 64  # steps
_TOKEN_DECAY = 0.7  # per verify step, of a request's per-token acceptance counts


@dataclass(frozen=True)
class SpeculativeConfig:
    algorithm: str = "ngram"
    num_tokens: int = 3  # draft tokens per verify step (k)
    ngram_max: int = 4
    ngram_min: int = 2
    max_batch: int = 4  # running requests above which nobody (but seeded samplers) speculates
    min_acceptance: float = 0.3  # accepted / proposed EWMA below which a request backs off
    # "draft": a checkpoint with the target's vocabulary, or the target's first N layers;
    # "eagle" / "eagle3": draft_model is the EAGLE head's folder (anycore/spec/eagle_head.py);
    # "mtp": no draft_model, the target checkpoint's own MTP layer is the head
    draft_model: str | None = None
    draft_layers: int | None = None
    # "eagle" / "eagle3" / "mtp": > 1 drafts a tree, each of num_tokens levels keeping the eagle_topk
    # likeliest nodes, each node expanded by its eagle_topk likeliest tokens (verified greedily
    # or, for sampled requests, by tree rejection sampling); 1: a chain
    eagle_topk: int = 1

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown speculative algorithm {self.algorithm!r}; use one of {list(ALGORITHMS)}")
        if self.num_tokens < 1:
            raise ValueError("num_speculative_tokens must be >= 1")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("need 1 <= ngram_prompt_lookup_min <= ngram_prompt_lookup_max")
        if self.max_batch < 1:
            raise ValueError("speculative_max_batch must be >= 1")
        if not 0.0 <= self.min_acceptance < 1.0:
            raise ValueError("speculative_min_acceptance must be in [0, 1)")
        if self.algorithm == "draft" and (self.draft_model is None) == (self.draft_layers is None):
            raise ValueError("speculative_algorithm 'draft' needs exactly one of speculative_model and "
                             "speculative_draft_layers")
        if self.eagle_topk < 1 or (self.eagle_topk > 1 and self.algorithm not in HEAD_ALGORITHMS):
            raise ValueError("speculative_eagle_topk must be >= 1, and > 1 only with an EAGLE or MTP algorithm")
        if self.algorithm.startswith("eagle"):  # (an EAGLE head's HF folder)
            if self.draft_model is None or self.draft_layers is not None:
                raise ValueError(f"speculative_algorithm {self.algorithm!r} needs speculative_model (the head's "
                                 "folder) and no speculative_draft_layers")
        elif self.algorithm == "mtp":
            if self.draft_model is not None or self.draft_layers is not None:
                raise ValueError("speculative_algorithm 'mtp' drafts with the target checkpoint's own MTP layers: "
                                 "drop speculative_model / speculative_draft_layers")
        elif self.algorithm != "draft" and (self.draft_model is not None or self.draft_layers is not None):
            raise ValueError("speculative_model / speculative_draft_layers need speculative_algorithm 'draft'")


@dataclass
class SpecState:
    """One request's speculation history."""

    acceptance: float = 1.0  # EWMA of accepted / proposed (optimistic start)
    skip: int = 0  # steps left before it proposes again (back-off)
    backoff: int = 0  # the length of the last back-off (doubles while speculation does not pay)
    probe: bool = True  # the next proposal drafts the configured k whatever the cost model says
    # decayed counts of draft tokens kept / tried (tried: each kept one and the first rejected);
    # their ratio is the per-token acceptance the cost model uses (optimistic start: 0.8)
    tokens_kept: float = 1.6
    tokens_tried: float = 2.0

    @property
    def token_acceptance(self) -> float:
        return self.tokens_kept / self.tokens_tried


@dataclass
class SpecTotals:
    num_verify_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


class Speculator:
    """The scheduler's proposer: ``propose`` while planning a step, ``observe`` in ``update``,
    ``release`` when a request leaves the running batch. This class drafts by prompt lookup;
    spec/draft_model.py drafts with a model."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.totals = SpecTotals()
        self.costs = StepCosts()

    def propose(self, req: Request, limit: int, batch_size: int) -> list[int]:
        """Draft tokens for a decoding request (at most ``limit``), or [] for a plain decode."""
        k = self._draft_len(req, limit, batch_size)
        if not k:
            return []
        c = self.config
        return propose_ngram(req.all_token_ids, k, c.ngram_max, c.ngram_min)

    def record_step(self, rows: int, seconds: float) -> None:
        """The engine's wall time of a decode-shaped step (no prefill chunk) of ``rows`` rows."""
        self.costs.record(rows, seconds)

    def _draft_len(self, req: Request, limit: int, batch_size: int, rows_per_token: int = 1) -> int:
        """How many tokens (a tree: levels of ``rows_per_token`` nodes) the request drafts this
        step (0: a plain decode; its back-off clock ticks then)."""
        c = self.config
        if limit <= 0 or not req.params.speculative or not req.can_speculate:
            return 0
        seeded_sampler = req.params.seed is not None and req.params.temperature > 0
        if batch_size > c.max_batch and not seeded_sampler:
            return 0
        state = req.spec_state
        if state is None:
            state = req.spec_state = SpecState()
        if state.skip > 0:
            state.skip -= 1
            return 0
        k = min(c.num_tokens, limit)
        # (a seeded sampler's draws depend on its drafts: no decision from wall times for it)
        if state.probe or seeded_sampler:
            state.probe = False
            return k
        k = self.costs.best_draft_len(batch_size, state.token_acceptance, k, rows_per_token)
        if k == 0:
            self._back_off(state)
        elif self.costs.measured:
            state.backoff = 0  # (speculation pays again: the next back-off starts short)
        return k

    @staticmethod
    def _back_off(state: SpecState) -> None:
        state.backoff = min(max(2 * state.backoff, 4), _MAX_BACKOFF)
        state.skip = state.backoff
        state.probe = True

    def release(self, req: Request) -> None:
        """``req`` finished or was preempted (a draft model frees its KV of it)."""

    def observe(self, req: Request, proposed: int, accepted: int) -> None:
        """A verify step of ``req`` accepted ``accepted`` of its ``proposed`` draft tokens."""
        t = self.totals
        t.num_verify_steps += 1
        t.num_draft_tokens += proposed
        t.num_accepted_tokens += accepted
        state = req.spec_state
        assert state is not None
        state.acceptance += _EWMA_WEIGHT * (accepted / proposed - state.acceptance)
        state.tokens_kept = _TOKEN_DECAY * state.tokens_kept + accepted
        state.tokens_tried = _TOKEN_DECAY * state.tokens_tried + accepted + (accepted < proposed)
        if state.acceptance < self.config.min_acceptance:
            self._back_off(state)
            state.acceptance = min(1.0, 2 * self.config.min_acceptance)  # the retry gets a fair chance
        elif accepted == proposed and not self.costs.measured:
            state.backoff = 0  # (with step costs measured, the cost rule says when it pays again)
