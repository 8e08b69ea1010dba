"""EAGLE / EAGLE-3 / MTP drafting: a one-layer head over the target's hidden states
(anycore/spec/eagle_head.py: an EAGLE head's folder, or the target's own MTP layer, spec/mtp.py).

The target's forward captures, for every row it computes, the features the head reads
(``ModelRunner.capture_layers``); after each step the engine hands them over (``add_features``).
Position i's feature pairs with token i + 1: the head's KV at position i is computed from
(embedding of token i + 1, feature i). Per request the speculator keeps

- ``slots``: the head's KV of the positions it has absorbed, in order (its own pool and
  allocator, like the draft model's). Only target features are absorbed, so these positions
  are all accepted tokens and never need rolling back;
- ``pending``: features not yet absorbed, by position. A step that recomputes a position
  (a verify step after rejections) replaces what was pending from there on, and features of
  positions that are no longer accepted tokens (rejected drafts) are dropped before absorbing.

Proposing (chain drafts): absorb the pending features in one extend of the head (its last row
predicts draft token 1 when it is the newest position), then k - 1 one-row steps, each fed the
previous draft token and the head's own previous output; those steps' KV slots are given back
at once. Drafts are the head's argmax (a point mass), so verification is lossless. With
``eagle_topk`` > 1 every request (greedy or sampled) gets a top-k tree instead (``_draft_tree``),
its children also fixed tokens: spec/tree.py verifies it greedily or by tree rejection sampling.

A request whose positions were never computed by the target (a prefix-cache hit) has no
features there: the head attends over the positions it has, at their true RoPE positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from anycore.cache.slot_allocator import SlotAllocator
from anycore.kernels.ops import KernelOps
from anycore.layers.forward_batch import ForwardBatch
from anycore.scheduler.request import Request
from anycore.scheduler.scheduler import SchedulerOutput
from anycore.spec.eagle_head import EagleHead, aux_layers, read_checkpoint
from anycore.spec.policy import SpeculativeConfig, Speculator
from anycore.spec.tree import DraftTree, ancestor_mask


@dataclass
class EagleState:
    slots: list[int] = field(default_factory=list)
    next_pos: int = 0  # the first position not absorbed yet
    pending_pos: int = 0  # position of pending[0]
    pending: torch.Tensor | None = None  # [n, feature] target features from pending_pos on
    last_out: torch.Tensor | None = None  # head output at next_pos - 1 ([1, H]), drafts token 1


class EagleSpeculator(Speculator):
    def __init__(self, config: SpeculativeConfig, target: torch.nn.Module, ops: KernelOps, num_slots: int,
                 dtype: torch.dtype, max_positions: int,
                 checkpoint: tuple[dict[str, Any], dict[str, torch.Tensor]] | None = None) -> None:
        """``checkpoint``: the head's (config, tensors) when they do not come from a folder
        (``mtp``: the target's own, spec/mtp.py); else read from ``config.draft_model``."""
        super().__init__(config)
        from anycore.engine.runner import KVPool  # (the engine package imports the scheduler)

        if checkpoint is None:
            assert config.draft_model is not None
            checkpoint = read_checkpoint(config.draft_model)
        hf, tensors = checkpoint
        self.head = EagleHead.from_tensors(config.algorithm, hf, tensors, target, ops, dtype, max_positions)
        del tensors, checkpoint
        tc = target.config
        self.capture_layers: tuple[int, ...] = aux_layers(hf, tc.num_layers) if config.algorithm == "eagle3" else ()
        self.kv = KVPool(1, num_slots, self.head.num_kv_heads, self.head.head_dim, dtype)
        self.allocator = SlotAllocator(num_slots)
        self.states: dict[str, EagleState] = {}

    # ---- features in ----------------------------------------------------------------------
    def add_features(self, out: SchedulerOutput, features: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """The target features of the step ``out`` just computed (q_start_loc, rows)."""
        if features is None:
            return
        q_start, rows = features
        starts = q_start.tolist()
        for i, s in enumerate(out.scheduled):
            req = s.request
            if not req.params.speculative or req.is_finished:
                continue
            st = self.states.setdefault(req.request_id, EagleState())
            chunk = rows[starts[i] : starts[i + 1]]
            if s.draft_parents is not None:  # a tree verify: the root, then the accepted path's nodes
                chunk = chunk[[0] + [j + 1 for j in s.tree_path or []]]
            if s.start < st.next_pos:  # (recomputed an absorbed position: only after a preemption)
                self._reset(req.request_id)
                st = self.states.setdefault(req.request_id, EagleState())
            if st.pending is None or s.start < st.pending_pos:
                st.pending, st.pending_pos = chunk.clone(), s.start
                continue
            keep = min(s.start - st.pending_pos, st.pending.shape[0])
            if st.pending_pos + keep < s.start:  # (a gap: positions the head never sees)
                st.pending, st.pending_pos = chunk.clone(), s.start
                continue
            st.pending = torch.cat((st.pending[:keep], chunk))

    # ---- proposing ------------------------------------------------------------------------
    def propose(self, req: Request, limit: int, batch_size: int) -> list[int]:
        st = self.states.get(req.request_id)
        if st is not None:
            with torch.inference_mode():
                self._absorb(req, st)  # (every step, drafting or not: pending stays small)
        if st is None or st.last_out is None or st.next_pos != req.num_tokens - 1:
            return []  # (no head output yet, or the newest position's feature is missing)
        depth = self._draft_len(req, limit, batch_size, self.config.eagle_topk)
        if not depth:
            return []
        with torch.inference_mode():
            if self.config.eagle_topk > 1:  # (greedy and sampled requests: both verify trees losslessly)
                return self._draft_tree(st, depth, self.config.eagle_topk)
            return self._draft(req, st, depth)

    def _absorb(self, req: Request, st: EagleState) -> None:
        """Runs the head over the pending features of accepted positions (those < L - 1)."""
        if st.pending is None:
            return
        tokens = req.all_token_ids
        last = len(tokens) - 2  # the newest position with a target feature
        first = max(st.pending_pos, st.next_pos)
        n = last - first + 1
        if n <= 0 or first - st.pending_pos >= st.pending.shape[0]:
            return
        feats = st.pending[first - st.pending_pos : first - st.pending_pos + n]
        n = feats.shape[0]
        slots = self.allocator.allocate(n)
        if slots is None:
            return  # (the head's pool is full: no drafts until some is free)
        st.slots = st.slots + slots
        ids = torch.tensor(tokens[first + 1 : first + 1 + n], dtype=torch.int64)
        out = self.head(ids, feats, True, self._batch(st.slots, torch.arange(first, first + n), n))
        st.last_out = out[-1:]
        st.next_pos = first + n
        # rows past ``last`` were rejected drafts' (the next step recomputes those positions)
        st.pending, st.pending_pos = None, st.next_pos

    def _draft(self, req: Request, st: EagleState, k: int) -> list[int]:
        draft = [int(self.head.draft_ids(st.last_out)[0])]
        out = st.last_out
        temp: list[int] = []
        pos = st.next_pos  # the position of the newest token, whose pair gives draft token 2
        while len(draft) < k:
            slot = self.allocator.allocate(1)
            if slot is None:
                break
            temp += slot
            ids = torch.tensor([draft[-1]], dtype=torch.int64)
            out = self.head(ids, out, False, self._batch(st.slots + temp, torch.tensor([pos]), 1))
            draft.append(int(self.head.draft_ids(out)[0]))
            pos += 1
        self.allocator.free(temp)  # (drafted positions' KV: recomputed from target features later)
        return draft

    def _draft_tree(self, st: EagleState, depth: int, topk: int) -> DraftTree:
        """EAGLE-2-style expansion: level 1 is the root's top-k tokens; each next level takes
        the top-k children of every node of the level before and keeps the k with the highest
        path log-probability. The head computes every node so far in one tree-masked extend per
        level (recomputing the earlier levels' rows: a few rows of one layer, no KV bookkeeping
        across levels); its slots are given back at the end."""
        ids, lps = self.head.draft_topk(st.last_out, topk)
        tokens, parents, scores = ids[0].tolist(), [-1] * topk, lps[0].tolist()
        outs: list[torch.Tensor] = []  # each node's head output, once computed
        level = list(range(topk))
        temp = self.allocator.allocate(topk * (depth - 1)) or []
        for _ in range(1, depth):
            if len(temp) < len(tokens):
                break
            tree = DraftTree(tokens, parents)
            feats = torch.cat([st.last_out if p < 0 else outs[p] for p in parents])
            n = len(tokens)
            batch = self._batch(st.slots + temp[:n], st.next_pos - 1 + torch.tensor(tree.depths), n)
            batch.tree_mask = ancestor_mask(parents, with_root=False)
            out = self.head(torch.tensor(tokens), feats, False, batch)
            outs = list(out.split(1))
            ids, lps = self.head.draft_topk(out[level], topk)
            cand = (torch.tensor([scores[j] for j in level])[:, None] + lps).flatten()
            best = cand.topk(topk).indices.tolist()
            new_level = []
            for c in best:
                parent = level[c // topk]
                tokens.append(int(ids.flatten()[c]))
                parents.append(parent)
                scores.append(float(cand[c]))
                new_level.append(len(tokens) - 1)
            level = new_level
        self.allocator.free(temp)
        return DraftTree(tokens, parents)

    def _batch(self, slots: list[int], positions: torch.Tensor, n: int) -> ForwardBatch:
        table = torch.tensor(slots, dtype=torch.int64)[None]
        return ForwardBatch(
            input_ids=torch.empty(0, dtype=torch.int64), positions=positions, slot_mapping=table[0, -n:],
            q_start_loc=torch.tensor([0, n]), seq_lens=torch.tensor([len(slots)]), slot_table=table,
            logits_indices=torch.empty(0, dtype=torch.int64), k_cache=[self.kv.k[0]], v_cache=[self.kv.v[0]])

    # ---- bookkeeping ----------------------------------------------------------------------
    def _reset(self, request_id: str) -> None:
        st = self.states.pop(request_id, None)
        if st is not None:
            self.allocator.free(st.slots)

    def release(self, req: Request) -> None:
        self._reset(req.request_id)

    @property
    def num_slots_held(self) -> int:
        return self.allocator.num_slots - self.allocator.num_free
