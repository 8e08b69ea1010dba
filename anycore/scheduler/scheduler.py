"""Token-budget scheduler: continuous batching with chunked prefill, prefix reuse, preemption.

Each step spends at most ``max_num_batched_tokens`` tokens: running requests first (a decode
costs one token, an unfinished prefill continues with as many as fit), then waiting requests
are admitted in policy order while budget, sequence slots and KV slots last. When KV slots run
out, the most recently admitted running request is preempted: its KV is released (its computed
tokens stay in the prefix cache) and it goes back to the front of the queue to be recomputed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from anycore.cache.manager import KVCacheManager
from anycore.scheduler.request import Request, RequestStatus
from anycore.spec.tree import accept_path

if TYPE_CHECKING:
    from anycore.spec.policy import Speculator


@dataclass
class ScheduledRequest:
    request: Request
    start: int  # num_computed_tokens before this step
    num_new_tokens: int
    # this step reaches the last known token, so a new token is sampled (never for a request
    # with max_tokens=0, which ends once its prompt is computed)
    sample: bool
    # tokens this step may produce: > 1 only for a multi-step greedy decode (Scheduler
    # ._multi_step), which writes the KV of positions start .. start + num_steps - 1 and holds
    # slots for all of them; stops it cannot foresee end it early in ``update``
    num_steps: int = 1
    # runs as one native greedy call (embedding, stack, head, argmax per token; no sampler),
    # for ``num_steps`` >= 1 tokens
    greedy_native: bool = False
    # a speculative verify step (anycore/spec/): the request's last token then these draft
    # tokens are computed (``num_new_tokens`` = 1 + len, slots held for all), logits are taken
    # at every position, and ``num_steps`` = 1 + len tokens may come out; ``update`` keeps the
    # verified ones and gives back the slots of rejected positions
    draft_tokens: list[int] = field(default_factory=list)
    # a tree draft (anycore/spec/tree.py DraftTree): draft_tokens' parents (None: a chain); the
    # runner's verify sets ``tree_path``, the accepted nodes, which ``update`` moves into place
    draft_parents: list[int] | None = None
    tree_path: list[int] | None = None


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def all_decode(self) -> bool:
        """Every scheduled request adds exactly one token (a decode step)."""
        return all(s.num_new_tokens == 1 for s in self.scheduled)

    @property
    def decode_shaped(self) -> bool:
        """Every scheduled request decodes: one token, or a verify of its last token and its
        drafts (no prefill chunk)."""
        return all(s.sample and (s.num_new_tokens == 1 or s.draft_tokens) for s in self.scheduled)


# A waiting request whose prompt shares at least this many more tokens with a prompt being
# prefilled right now than the prefix cache holds waits for that prefill to publish its KV,
# instead of computing the same prefix a second time in parallel (Scheduler._prefix_in_flight)
MIN_SHARED_IN_FLIGHT = 64


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        policy: str = "fcfs",
        speculator: Speculator | None = None,
    ) -> None:
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.policy = policy
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.speculator = speculator

    def add(self, request: Request) -> None:
        if request.num_tokens > self.kv.num_slots:
            raise ValueError(
                f"request needs {request.num_tokens} KV slots but the pool holds {self.kv.num_slots}; "
                "raise --kv-cache-gb or shorten the prompt"
            )
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, max_steps: int = 0) -> SchedulerOutput:
        """This step's work. ``max_steps`` >= 1 allows a native greedy decode when exactly one
        request runs, decoding with plain greedy sampling, and nobody waits (the runner then
        produces up to that many tokens in one native call, no sampler); a request arriving
        meanwhile waits at most that many tokens' time. 0: ordinary steps only."""
        if max_steps >= 1:
            multi = self._multi_step(max_steps)
            if multi is not None:
                return SchedulerOutput([multi])
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            draft = self._draft(req, budget) if n == 1 else []
            slots = self.kv.allocate(1 + len(draft)) if draft else None
            if slots is not None:
                out.scheduled.append(self._schedule_verify(req, draft, slots))
                budget -= 1 + len(draft)
                i += 1
                continue
            slots = self.kv.allocate(n)  # (no draft, or no slots for one: a plain decode)
            while slots is None:
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
                slots = self.kv.allocate(n)
            if slots is None:
                break
            out.scheduled.append(self._schedule_tokens(req, n, slots))
            budget -= n
            i += 1
        if out.preempted:
            return out  # memory is tight: do not admit anyone this step
        deferred: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self._next_waiting()
            if self._prefix_in_flight(req):
                deferred.append(req)
                continue
            self.kv.match(req)
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            slots = self.kv.allocate(n)
            if slots is None:
                self.kv.release(req)
                req.num_computed_tokens = req.num_cached_tokens = 0
                self.waiting.appendleft(req)
                break
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(self._schedule_tokens(req, n, slots))
            budget -= n
        self.waiting.extendleft(reversed(deferred))  # back at the front, in their order
        return out

    def _prefix_in_flight(self, req: Request) -> bool:
        """Whether a running request is still computing a prompt prefix ``req`` shares beyond
        what the prefix cache already holds (then ``req`` waits for it: its KV is published when
        that prompt's prefill ends, ``update``). Only with the prefix cache on, and not for a
        request that wants prompt logprobs (it takes no prefix hit anyway)."""
        if self.kv.radix is None or req.needs_prompt_logprobs:
            return False
        prompt = req.prompt_token_ids
        cached = None
        for r in self.running:
            if r.prefill_cached:
                continue
            shared = common_prefix_len(prompt, r.prompt_token_ids)
            if shared < MIN_SHARED_IN_FLIGHT:
                continue
            if cached is None:
                cached = self.kv.prefix_match_len(req)
            if shared >= cached + MIN_SHARED_IN_FLIGHT:
                return True
        return False

    def _multi_step(self, max_steps: int) -> ScheduledRequest | None:
        if self.waiting or len(self.running) != 1:
            return None
        req = self.running[0]
        if (req.num_tokens - req.num_computed_tokens != 1 or not req.prefill_cached or not req.plain_greedy
                or req.needs_prompt_logprobs):  # (the native multi-step call yields no logits)
            return None
        # a request with a draft verifies it instead: 1 + k tokens for about one step's weight
        # reads beats one token per native call. Without a draft (none found, or backed off
        # after low acceptance) the native call is the faster plain decode.
        draft = self._draft(req, self.max_num_batched_tokens)
        if draft:
            slots = self.kv.allocate(1 + len(draft))
            return None if slots is None else self._schedule_verify(req, draft, slots)
        n = min(max_steps, req.max_model_len - req.num_tokens)
        if req.params.max_tokens is not None:
            n = min(n, req.params.max_tokens - req.num_output_tokens)
        slots = self.kv.allocate(n) if n >= 1 else None
        if slots is None:
            return None  # (short of slots: an ordinary step, preempting if it must)
        req.slots.extend(slots)
        return ScheduledRequest(req, req.num_computed_tokens, 1, sample=True, num_steps=n, greedy_native=True)

    def _draft(self, req: Request, budget: int) -> list[int]:
        """Draft tokens for a decoding request this step ([]: a plain decode). A verify step
        may emit 1 + k tokens, so k leaves room for them under max_tokens and the context."""
        if self.speculator is None:
            return []
        limit = min(budget - 1, req.max_model_len - req.num_tokens - 1)
        if req.params.max_tokens is not None:
            limit = min(limit, req.params.max_tokens - req.num_output_tokens - 1)
        draft = self.speculator.propose(req, limit, len(self.running))
        if len(draft) > budget - 1 and hasattr(draft, "truncate"):
            draft = draft.truncate(budget - 1)  # (a tree wider than the step's token budget)
        return draft

    @staticmethod
    def _schedule_verify(req: Request, draft: list[int], slots: list[int]) -> ScheduledRequest:
        start = req.num_computed_tokens
        req.slots.extend(slots)
        n = 1 + len(draft)
        parents = getattr(draft, "parents", None)  # (a DraftTree: at most max_depth + 1 tokens come out)
        steps = n if parents is None else draft.max_depth + 1  # type: ignore[attr-defined]
        return ScheduledRequest(req, start, n, sample=True, num_steps=steps, draft_tokens=draft,
                                draft_parents=parents)

    def _next_waiting(self) -> Request:
        if self.policy == "lpm" and len(self.waiting) > 1:
            best = max(self.waiting, key=self.kv.prefix_match_len)
            self.waiting.remove(best)
            return best
        return self.waiting.popleft()

    @staticmethod
    def _schedule_tokens(req: Request, n: int, slots: list[int]) -> ScheduledRequest:
        start = req.num_computed_tokens
        req.slots.extend(slots)
        return ScheduledRequest(req, start, n, sample=start + n == req.num_tokens and req.wants_output)

    def _preempt(self, req: Request) -> None:
        self.kv.release(req)
        if self.speculator is not None:
            self.speculator.release(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        req.prefill_cached = False
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def update(self, out: SchedulerOutput, sampled: dict[str, list[int]]) -> list[tuple[Request, list[int]]]:
        """Advances the scheduled requests and appends their sampled tokens (``sampled``: the
        tokens each sampling request produced, in order), stopping at the first that ends the
        request (``Request.check_stop``: token rules and stop strings); returns each request
        that got tokens with the tokens it kept (finished ones included, already released).
        One routine for every step kind: a prefill chunk, a decode, a multi-step decode. A
        max_tokens=0 request is returned (finished, no tokens) once its prompt is computed."""
        progressed = []
        for s in out.scheduled:
            req = s.request
            if req.is_finished:  # aborted while the step ran
                continue
            # (a verify step computed its drafts' positions too, but they count only once kept)
            req.num_computed_tokens = s.start + (1 if s.draft_tokens else s.num_new_tokens)
            if not req.prefill_cached and req.num_computed_tokens >= req.num_prompt_tokens:
                # publish the prompt's KV now so concurrent requests with this prefix reuse it
                self.kv.cache_prefix(req)
                req.prefill_cached = True
            self.kv.trim_window(req)  # (sliding layers: window KV behind every later query goes back)
            if not req.wants_output and req.num_computed_tokens >= req.num_prompt_tokens:
                self.finish(req, "length")  # max_tokens=0: the prompt (and its logprobs) was all it wanted
                progressed.append((req, []))
                continue
            if not s.sample:
                continue
            kept = []
            tokens = sampled[req.request_id][: s.num_steps]
            if s.draft_tokens and self.speculator is not None:
                proposed = len(s.draft_tokens) if s.draft_parents is None else s.num_steps - 1  # (a tree: its depth)
                self.speculator.observe(req, proposed, len(tokens) - 1)
            if s.tree_path:  # the accepted nodes' KV into sequence order; the others roll back below
                req.slots = accept_path(req.slots, s.start, s.tree_path)
            for token in tokens:
                if kept:  # a multi-step or verify step computed the previous token's position too
                    req.num_computed_tokens += 1
                req.append_token(token)
                kept.append(token)
                reason = req.check_stop()
                if reason is not None:
                    self.finish(req, reason)  # (releases the slots of positions past the stop too)
                    break
            if not req.is_finished and len(req.slots) > req.num_computed_tokens:
                self._roll_back(req)
            if not req.is_finished:
                self.kv.trim_window(req)
            progressed.append((req, kept))
        return progressed

    def _roll_back(self, req: Request) -> None:
        """Frees the slots of positions a verify step computed but did not keep (rejected
        drafts). They are the request's own (the prefix cache only ever holds computed
        positions). The list is replaced, not cut in place: the runner's SlotRows mirror a slot
        list only while it grows (engine/slot_rows.py)."""
        k = req.num_computed_tokens
        self.kv.free(req.slots[k:])
        req.slots = req.slots[:k]

    def finish(self, req: Request, reason: str) -> None:
        """Ends a request (stop, length, abort) and releases its KV; idempotent."""
        if req.is_finished:
            return
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.release(req)
        if self.speculator is not None:
            self.speculator.release(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
