"""ModelRunner: owns the model and the KV tensors; turns a SchedulerOutput into a forward pass."""

from __future__ import annotations

import math
import mmap

import numpy as np
import torch
from torch import nn

from anycore.engine.native_executor import NativeExecutor
from anycore.engine.prompt_logprobs import (
    PromptLogprobPiece,
    VerifySpan,
    gather_prompt_logprobs,
    logits_layout,
)
from anycore.engine.sampler import sample_requests
from anycore.engine.slot_rows import SlotRows
from anycore.engine.spec_verify import verify_drafts, verify_logits
from anycore.kernels.ops import KernelOps
from anycore.layers.forward_batch import ForwardBatch
from anycore.scheduler.request import TokenLogprob
from anycore.scheduler.scheduler import ScheduledRequest, SchedulerOutput
from anycore.spec.tree import ancestor_mask


class KVPool:
    """K and V for every layer: ``[num_layers, num_slots, num_kv_heads, head_dim]`` each.

    With ``window_layers`` (the sliding-window layers' indices) and ``num_window_slots``, those
    layers' K/V live in a second pool, ``k_window``/``v_window`` ``[len(window_layers),
    num_window_slots, ...]``, indexed by window slots (anycore/cache/swa.py), and ``k``/``v`` hold
    only the other (global) layers. ``k_layers``/``v_layers`` are the per-layer views either way.

    Backed by private anonymous memory mappings, which the kernel fills with zeros lazily: a
    page costs resident memory only once a K/V row on it is written, so RSS follows the slots in
    use (the allocator hands out low slot ids first), not the ``--kv-cache-gb`` budget, which
    ``torch.zeros`` would touch in full at start-up. Every slot still reads as 0.0 until written
    (never garbage): attention only reads a request's own slots, and a masked padding position
    (torch-native decode points those at slot 0) multiplies finite values by a zero weight.
    """

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 window_layers: tuple[int, ...] = (), num_window_slots: int = 0):
        self.window_layers = window_layers
        full = [i for i in range(num_layers) if i not in window_layers]
        self.k = lazy_zeros((len(full), num_slots, num_kv_heads, head_dim), dtype)
        self.v = lazy_zeros((len(full), num_slots, num_kv_heads, head_dim), dtype)
        self.k_layers: list[torch.Tensor] = [None] * num_layers  # type: ignore[list-item]
        self.v_layers: list[torch.Tensor] = [None] * num_layers  # type: ignore[list-item]
        for j, i in enumerate(full):
            self.k_layers[i], self.v_layers[i] = self.k[j], self.v[j]
        self.k_window = self.v_window = None
        if window_layers:
            shape = (len(window_layers), num_window_slots, num_kv_heads, head_dim)
            self.k_window, self.v_window = lazy_zeros(shape, dtype), lazy_zeros(shape, dtype)
            for j, i in enumerate(window_layers):
                self.k_layers[i], self.v_layers[i] = self.k_window[j], self.v_window[j]

    def discard(self) -> None:
        """Returns every written page to the OS; the pool reads as zeros again, as when new.

        Only for a pool no request holds slots in (nothing cached either): the engine calls it
        after online quantization, whose calibration windows wrote K/V (SmolLM2-135M: 11 MB of
        pages that would otherwise stay resident for good)."""
        for t in (self.k, self.v, self.k_window, self.v_window):
            if t is not None:
                discard_pages(t)

    @staticmethod
    def bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def discard_pages(t: torch.Tensor) -> None:
    """Drops the resident pages of a ``lazy_zeros`` tensor (``MADV_DONTNEED``: a private
    anonymous page reads as zero on its next touch); zero-fills a tensor without a mapping."""
    mapping = getattr(t, "_anycore_mapping", None)
    if mapping is None or not hasattr(mmap, "MADV_DONTNEED"):
        t.zero_()
        return
    mapping.madvise(mmap.MADV_DONTNEED)


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor whose pages become resident only when written (anonymous ``mmap``; the
    tensor keeps the mapping alive)."""
    numel = math.prod(shape)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):  # (no anonymous mmap: Windows)
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    t = torch.frombuffer(buf, dtype=dtype, count=numel).view(shape)
    t._anycore_mapping = buf  # (for discard_pages; the tensor's storage keeps it alive anyway)
    return t


class ModelRunner:
    """Turns a SchedulerOutput into tokens: the batch's tensors, the forward (op by op or the
    native path the executor picks), the logits head and the sampler."""

    def __init__(self, model: nn.Module, kv: KVPool, ops: KernelOps, window_of: np.ndarray | None = None) -> None:
        """``window_of``: full slot -> window slot (-1: none), the KV manager's live map
        (anycore/cache/swa.py), when ``kv`` keeps sliding layers in a window pool."""
        self.model = model
        self.kv = kv
        self.native = NativeExecutor(model, ops)
        self.k_layers = kv.k_layers  # per-layer views of the pool(s)
        self.v_layers = kv.v_layers
        self.window_of = window_of
        self.slot_rows = SlotRows()
        # target hidden states an EAGLE head drafts from (ForwardBatch.capture_layers); None: off.
        # After each step ``features`` holds (q_start_loc, captured rows) of the batch.
        self.capture_layers: tuple[int, ...] | None = None
        self.features: tuple[torch.Tensor, torch.Tensor] | None = None
        # a request decoding alone that samples takes one native call for its logits
        # (NativeExecutor.decode_logits) when the model can; the engine turns it off with the
        # native greedy call (--decode-burst 0)
        self.native_single_step = True

    def build_batch(self, out: SchedulerOutput) -> ForwardBatch:
        sched = out.scheduled
        b = len(sched)
        if out.all_decode:
            positions = np.fromiter((s.start for s in sched), np.int64, b)
            input_ids = np.fromiter((s.request.all_token_ids[s.start] for s in sched), np.int64, b)
            seq_lens = positions + 1
            q_start = np.arange(b + 1, dtype=np.int64)
            n_new = np.ones(b, dtype=np.int64)
        else:
            n_new = np.array([s.num_new_tokens for s in sched], dtype=np.int64)
            starts = np.array([s.start for s in sched], dtype=np.int64)
            seq_lens = starts + n_new
            q_start = np.zeros(b + 1, dtype=np.int64)
            np.cumsum(n_new, out=q_start[1:])
            total = int(q_start[-1])
            # positions: start..start+n for each request, built without a per-token loop
            positions = np.arange(total, dtype=np.int64) - np.repeat(q_start[:-1] - starts, n_new)
            input_ids = np.empty(total, dtype=np.int64)
            for i, s in enumerate(sched):
                if s.draft_tokens:  # a verify step: the last known token, then the draft
                    input_ids[q_start[i]] = s.request.all_token_ids[s.start]
                    input_ids[q_start[i] + 1 : q_start[i + 1]] = s.draft_tokens
                else:
                    input_ids[q_start[i] : q_start[i + 1]] = s.request.all_token_ids[s.start : s.start + s.num_new_tokens]
        slot_table = self._slot_table(sched, seq_lens)
        slot_mapping = slot_table[np.repeat(np.arange(b), n_new), positions]
        window_table = window_mapping = None
        if self.window_of is not None:
            # (columns whose position holds no window KV are behind every query's window, or
            # padding: never read; they point at window slot 0 rather than -1)
            window_table = self.window_of[slot_table]
            window_mapping = window_table[np.repeat(np.arange(b), n_new), positions]
            if (window_mapping < 0).any():  # (would overwrite another position's KV: never silently)
                raise RuntimeError("a new token's KV slot has no window slot (KV manager out of step)")
            np.maximum(window_table, 0, out=window_table)
        tree_mask = None
        if not out.all_decode and any(s.draft_parents is not None for s in sched):
            positions, tree_mask = self._tree_rows(sched, positions, q_start, n_new)
        sample_rows = [i for i, s in enumerate(sched) if s.sample]
        logits_indices = q_start[1:][sample_rows] - 1
        t = torch.from_numpy
        return ForwardBatch(
            input_ids=t(input_ids),
            positions=t(positions),
            slot_mapping=t(slot_mapping),
            q_start_loc=t(q_start),
            seq_lens=t(seq_lens),
            slot_table=t(slot_table),
            logits_indices=t(np.ascontiguousarray(logits_indices)),
            k_cache=self.k_layers,
            v_cache=self.v_layers,
            k_pool=self.kv.k if window_table is None else None,
            v_pool=self.kv.v if window_table is None else None,
            tree_mask=tree_mask,
            window_slot_mapping=None if window_mapping is None else t(window_mapping),
            window_slot_table=None if window_table is None else t(window_table),
        )

    @staticmethod
    def _tree_rows(sched, positions: np.ndarray, q_start: np.ndarray, n_new: np.ndarray):
        """Tree verifies: each node at start + its depth (its slot stays the next in the slot
        list, already mapped), and the attention mask: causal rows for every other request."""
        positions = positions.copy()
        width = int(n_new.max())
        mask = torch.ones(width, width, dtype=torch.bool).tril()
        rows = []
        for i, s in enumerate(sched):
            n = int(n_new[i])
            if s.draft_parents is None:
                rows.append(mask[:n])
                continue
            tree = ancestor_mask(s.draft_parents)
            rows.append(torch.nn.functional.pad(tree, (0, width - n)))
            positions[q_start[i] + 1 : q_start[i + 1]] = s.start + np.asarray(s.draft_tokens.depths)
        return positions, torch.cat(rows)

    def _slot_table(self, sched, seq_lens: np.ndarray) -> np.ndarray:
        """[batch, max seq_len] slots of each request (0-padded); one request: a view of its row."""
        rows = [self.slot_rows.row(s.request) for s in sched]
        if len(self.slot_rows) > 2 * len(sched) + 8:
            self.slot_rows.retain({s.request.request_id for s in sched})
        if len(rows) == 1:
            return rows[0][None, : seq_lens[0]]
        table = np.zeros((len(rows), int(seq_lens.max())), dtype=np.int64)
        for i, row in enumerate(rows):
            table[i, : seq_lens[i]] = row[: seq_lens[i]]
        return table

    def max_steps(self, limit: int) -> int:
        """Tokens a native greedy decode may run in one call here: ``limit``, or 0 when the
        model cannot run one natively (checked per step: quantization or hooks change it)."""
        if self.window_of is not None:  # (the native decode writes one pool: not a window pool)
            return 0
        return limit if limit >= 1 and self.native.can_decode_greedy() else 0

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[dict[str, list[int]], dict[str, list[TokenLogprob]],
                                                     dict[str, PromptLogprobPiece]]:
        """Runs one step; returns the tokens (and logprobs, where asked) of each sampling
        request (1 .. k + 1 for a verify step, engine/spec_verify.py), and the prompt logprobs
        this step computed (requests with prompt_logprobs)."""
        if len(out.scheduled) == 1 and out.scheduled[0].greedy_native:
            return self._multi_step(out.scheduled[0]), {}, {}
        if len(out.scheduled) == 1 and self._logits_alone(out.scheduled[0]):
            s = out.scheduled[0]
            return (self._verify_alone(s), {}, {}) if s.draft_tokens else self._sample_alone(s)
        batch = self.build_batch(out)
        layout = logits_layout(out.scheduled)
        if layout is not None:  # some rows want every new token's logits (prompt logprobs, drafts)
            batch.logits_indices = layout.indices
        batch.capture_layers = self.capture_layers
        hidden = self.model(batch, self.native.layers_fn(batch))
        if batch.captured is not None:
            self.features = (batch.q_start_loc, batch.captured)
        prompt_lps: dict[str, PromptLogprobPiece] = {}
        full_hidden = hidden
        if layout is not None:
            prompt_lps = gather_prompt_logprobs(layout, hidden, self.model.compute_logits)
            hidden = hidden[layout.sample_rows]
        sampling = [s for s in out.scheduled if s.sample]
        if not sampling:
            return {}, {}, prompt_lps
        sampled: dict[str, list[int]] = {}
        if layout is not None and layout.verify_spans:
            sampled = verify_drafts(layout.verify_spans, full_hidden, self.model.compute_logits)
            hidden = hidden[layout.plain_sample_rows]
        reqs = [s.request for s in sampling if not s.draft_tokens]
        if not reqs:
            return sampled, {}, prompt_lps
        logits = self.model.compute_logits(hidden)
        tokens, logprobs = sample_requests(logits, reqs)
        ids = [r.request_id for r in reqs]
        sampled.update({rid: [t] for rid, t in zip(ids, tokens.tolist())})
        lps = {rid: [lp] for rid, lp in zip(ids, logprobs) if lp is not None}
        return sampled, lps, prompt_lps

    def _logits_alone(self, s: ScheduledRequest) -> bool:
        """``s`` is one request alone in its step that samples one token, or verifies a chain draft
        (no tree), from its new rows' logits only (no prompt logprobs, no hidden states captured
        for a draft head): one native call gives them (the native decode's own conditions)."""
        return (self.native_single_step and s.sample and s.draft_parents is None
                and s.num_new_tokens == 1 + len(s.draft_tokens) and not s.request.needs_prompt_logprobs
                and self.capture_layers is None and self.max_steps(1) == 1)

    def _native_logits(self, s: ScheduledRequest) -> torch.Tensor:
        """fp32 logits of ``s``'s new rows (its last token, then its draft) from one native call:
        the bits the runner's batch, the model's forward and the logits head give them."""
        req = s.request
        slot_row = torch.from_numpy(self.slot_rows.row(req)[: s.start + s.num_new_tokens])[None]
        tokens = [req.all_token_ids[s.start], *s.draft_tokens]
        return self.native.decode_logits(tokens, s.start, slot_row, self.kv.k, self.kv.v)

    def _verify_alone(self, s: ScheduledRequest) -> dict[str, list[int]]:
        """The verify extend's logits natively (~0.45 ms less Python a 1 + 3 step on the default
        model's Q4_1 blocks), then the same acceptance rule."""
        return verify_logits([VerifySpan(s, 0, s.num_new_tokens)], self._native_logits(s))

    def _sample_alone(self, s: ScheduledRequest):
        """The one-token step's logits natively, sampled as any step's are."""
        req = s.request
        tokens, logprobs = sample_requests(self._native_logits(s), [req])
        lps = {req.request_id: [logprobs[0]]} if logprobs[0] is not None else {}
        return {req.request_id: tokens.tolist()}, lps, {}

    def _multi_step(self, s: ScheduledRequest) -> dict[str, list[int]]:
        """``s.num_steps`` greedy tokens of one request in one native call."""
        req = s.request
        end = s.start + s.num_steps
        slot_row = torch.from_numpy(self.slot_rows.row(req)[:end])[None]
        tokens = self.native.decode_greedy(req.all_token_ids[s.start], s.start, s.num_steps, slot_row,
                                           self.kv.k, self.kv.v)
        return {req.request_id: tokens}

    @torch.inference_mode()
    def prompt_logits(self, out: SchedulerOutput) -> torch.Tensor:
        """Logits of every new token in the batch (for tests and perplexity)."""
        batch = self.build_batch(out)
        batch.logits_indices = torch.arange(batch.input_ids.shape[0])
        return self.model.compute_logits(self.model(batch, self.native.layers_fn(batch)))
