"""When a request speculates, and what it proposes: the engine-wide settings, each request's
acceptance history (back-off) and the totals ``Engine.stats()`` reports.

Speculation pays when verifying 1 + k tokens costs about one decode step (batch-1 decode reads
every weight once per step whatever the token count) and some drafts are accepted. It stops
paying when (a) the drafts are mostly rejected — each request keeps an EWMA of its accepted
fraction and, below ``min_acceptance``, backs off for a growing number of steps before trying
again — or (b) the batch is large, so a step is no longer bandwidth-bound and every extra
verified token costs compute: above ``max_batch`` running requests nobody speculates.

Reproducibility: a seeded sampling request's random draws depend on whether it speculated, so
its decision must not depend on other requests. It ignores the batch-size rule (its back-off
depends only on its own tokens; a step whose token budget or KV pool leaves no room for its draft
still changes it). Greedy requests give the same tokens either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from anycore.scheduler.request import Request
from anycore.spec.ngram import propose_ngram

ALGORITHMS = ("ngram", "draft", "eagle", "eagle3", "mtp")
HEAD_ALGORITHMS = ("eagle", "eagle3", "mtp")  # a one-layer head over target features (spec/eagle.py)

_EWMA_WEIGHT = 0.3  # of the newest verify step in a request's acceptance average
_MAX_BACKOFF = 64  # steps


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
    backoff: int = 0  # the length of the last back-off (doubles while acceptance stays low)


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

    def propose(self, req: Request, limit: int, batch_size: int) -> list[int]:
        """Draft tokens for a decoding request (at most ``limit``), or [] for a plain decode."""
        if not self._may_propose(req, limit, batch_size):
            return []
        c = self.config
        return propose_ngram(req.all_token_ids, min(c.num_tokens, limit), c.ngram_max, c.ngram_min)

    def _may_propose(self, req: Request, limit: int, batch_size: int) -> bool:
        """The request may speculate this step (and its back-off clock ticks when not)."""
        c = self.config
        if limit <= 0 or not req.params.speculative or not req.can_speculate:
            return False
        if batch_size > c.max_batch and not (req.params.seed is not None and req.params.temperature > 0):
            return False
        state = req.spec_state
        if state is None:
            state = req.spec_state = SpecState()
        if state.skip > 0:
            state.skip -= 1
            return False
        return True

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
        if state.acceptance < self.config.min_acceptance:
            state.backoff = min(max(2 * state.backoff, 4), _MAX_BACKOFF)
            state.skip = state.backoff
            state.acceptance = min(1.0, 2 * self.config.min_acceptance)  # the retry gets a fair chance
        elif accepted == proposed:
            state.backoff = 0
