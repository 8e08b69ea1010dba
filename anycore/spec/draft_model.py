"""Drafts from a small model: another checkpoint with the target's vocabulary
(``--speculative-model``), or the target's own first N layers plus its final norm and head
(``--speculative-draft-layers N``, a self-draft).

The draft model has its own KV pool and runner; each request it drafts for keeps a mirror
``Request`` whose slots hold the draft model's KV of the tokens in ``kv_tokens``. Proposing:
the draft KV is valid for the longest common prefix of ``kv_tokens`` and the request's tokens
now (a verify step kept some drafts and replaced the rest), the slots past it go back, the
tokens the draft has not seen are computed in one extend (its argmax is draft token 1), then
k - 1 one-token greedy steps give the rest. The drafts are the draft model's argmax, a point
mass, so the target's verification (spec/verify.py) is lossless for greedy and sampling alike.

It runs inside ``Scheduler.schedule`` (the scheduler proposes while it plans the step), one
request at a time: a batch-1 measure, like speculation itself.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from anycore.cache.slot_allocator import SlotAllocator
from anycore.config import ModelConfig
from anycore.kernels.ops import KernelOps
from anycore.loader import open_model_source
from anycore.models import build_model
from anycore.sampling_params import SamplingParams
from anycore.scheduler.request import Request
from anycore.scheduler.scheduler import ScheduledRequest, SchedulerOutput, common_prefix_len
from anycore.spec.policy import SpeculativeConfig, Speculator

_LAYER_PREFIX = "model.layers."


def _layer_index(name: str) -> int | None:
    if not name.startswith(_LAYER_PREFIX):
        return None
    return int(name[len(_LAYER_PREFIX):].split(".", 1)[0])


def load_draft_model(target_path: str | None, target_config: ModelConfig, ops: KernelOps, dtype: torch.dtype,
                     max_len: int, draft_path: str | None, draft_layers: int | None) -> torch.nn.Module:
    """The draft model: ``draft_path``'s checkpoint, or the target's first ``draft_layers``
    layers (its embedding, final norm and head included)."""
    if draft_path is not None:
        source = open_model_source(draft_path)
        if source.config.vocab_size != target_config.vocab_size:
            raise ValueError(f"speculative model {Path(draft_path).name} has vocabulary {source.config.vocab_size}, "
                             f"the target {target_config.vocab_size}: drafts must use the target's token ids")
        return build_model(source.config, ops, dtype, source.weights(dtype), max_len)
    assert draft_layers is not None
    if not 1 <= draft_layers < target_config.num_layers:
        raise ValueError(f"speculative_draft_layers must be in [1, {target_config.num_layers - 1}]")
    source = open_model_source(target_path)
    config = replace(source.config, num_layers=draft_layers)
    weights = ((n, t) for n, t in source.weights(dtype) if (_layer_index(n) or 0) < draft_layers)
    return build_model(config, ops, dtype, weights, max_len)


class DraftModelSpeculator(Speculator):
    def __init__(self, config: SpeculativeConfig, model: torch.nn.Module, ops: KernelOps, num_slots: int,
                 dtype: torch.dtype) -> None:
        super().__init__(config)
        from anycore.engine.runner import KVPool, ModelRunner  # (the engine package imports the scheduler)

        mc = model.config
        self.runner = ModelRunner(model, KVPool(mc.num_layers, num_slots, mc.num_kv_heads, mc.head_dim, dtype), ops)
        self.allocator = SlotAllocator(num_slots)
        self.mirrors: dict[str, Request] = {}

    def draft_tokens(self, req: Request, k: int) -> list[int]:
        mirror = self.mirrors.get(req.request_id)
        if mirror is None:
            mirror = self.mirrors[req.request_id] = Request(req.request_id, [], SamplingParams(temperature=0.0))
            mirror.all_token_ids = []
        tokens = req.all_token_ids
        valid = common_prefix_len(mirror.all_token_ids, tokens)
        valid = min(valid, len(tokens) - 1)  # (the last token's logits are wanted: compute it again)
        if len(mirror.slots) > valid:
            self.allocator.free(mirror.slots[valid:])
            mirror.slots = mirror.slots[:valid]  # (replaced, not cut: the runner's SlotRows)
        mirror.all_token_ids = list(tokens)
        draft: list[int] = []
        start = valid
        while len(draft) < k:
            n = len(mirror.all_token_ids) - start
            slots = self.allocator.allocate(n)
            if slots is None:
                break  # (the draft pool is full: fewer drafts, never an error)
            mirror.slots.extend(slots)
            out = SchedulerOutput([ScheduledRequest(mirror, start, n, sample=True)])
            sampled, _, _ = self.runner.execute(out)
            token = sampled[mirror.request_id][0]
            draft.append(token)
            start += n
            mirror.all_token_ids.append(token)
        # the KV covers all but the last draft token; kv_tokens are the tokens it was computed for
        mirror.all_token_ids = mirror.all_token_ids[: len(mirror.slots)]
        return draft

    def propose(self, req: Request, limit: int, batch_size: int) -> list[int]:
        k = self._draft_len(req, limit, batch_size)
        return self.draft_tokens(req, k) if k else []

    def release(self, req: Request) -> None:
        mirror = self.mirrors.pop(req.request_id, None)
        if mirror is not None:
            self.allocator.free(mirror.slots)
            mirror.slots = []

    @property
    def num_slots_held(self) -> int:
        return self.allocator.num_slots - self.allocator.num_free

