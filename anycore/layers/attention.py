"""Paged attention layer: writes new K/V into the pool, attends over each request's slots."""

from __future__ import annotations

import torch
from torch import nn

from anycore.kernels.ops import KernelOps
from anycore.layers.forward_batch import ForwardBatch


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, layer_idx: int, ops: KernelOps,
                 scale: float | None = None, sliding_window: int | None = None, softcap: float | None = None) -> None:
        """``scale`` default ``head_dim ** -0.5``; ``sliding_window``: each query sees only that
        many latest keys (itself included); ``softcap``: scores soft-capped with tanh."""
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.layer_idx = layer_idx
        self.scale = head_dim**-0.5 if scale is None else scale
        self.sliding_window = sliding_window
        self.softcap = softcap
        self.ops = ops

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        t = q.shape[0]
        k_cache = batch.k_cache[self.layer_idx]
        v_cache = batch.v_cache[self.layer_idx]
        windowed = self.sliding_window is not None and batch.window_slot_table is not None
        slot_mapping = batch.window_slot_mapping if windowed else batch.slot_mapping
        slot_table = batch.window_slot_table if windowed else batch.slot_table
        # index_copy_ is a single fused scatter (cheaper than advanced-index assignment)
        k_cache.index_copy_(0, slot_mapping, k.reshape(t, self.num_kv_heads, self.head_dim))
        v_cache.index_copy_(0, slot_mapping, v.reshape(t, self.num_kv_heads, self.head_dim))
        q = q.view(t, self.num_heads, self.head_dim)
        if batch.tree_mask is not None:
            if self.sliding_window or self.softcap:
                raise ValueError("tree drafts need plain attention (no sliding window, no softcap)")
            out = self.ops.tree_attention(q, k_cache, v_cache, batch.q_start_loc, batch.seq_lens, slot_table,
                                          batch.tree_mask, self.scale)
            return out.view(t, self.num_heads * self.head_dim)
        view = decode_window_view(batch, self.sliding_window) if self.sliding_window and not self.softcap else None
        if view is not None:
            # every row a decode: its window is exactly a sequence of the window's slots whose
            # last token is the query, so the plain (native where available) op computes it
            out = self.ops.paged_attention(q, k_cache, v_cache, batch.q_start_loc, view[0], view[1], self.scale)
        elif self.sliding_window or self.softcap:
            out = self.ops.paged_attention_window(
                q, k_cache, v_cache, batch.q_start_loc, batch.seq_lens, slot_table, self.scale,
                self.sliding_window or 0, self.softcap or 0.0)
        else:
            out = self.ops.paged_attention(
                q, k_cache, v_cache, batch.q_start_loc, batch.seq_lens, slot_table, self.scale)
        return out.view(t, self.num_heads * self.head_dim)


def decode_window_view(batch: ForwardBatch, window: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For a batch of decodes only: ``(seq_lens, slot_table)`` of each request's last ``window``
    positions (rows of the slot table shifted to the window's first slot), or None when some
    request has more or fewer than one new token. Made once per batch and window, from the
    window pool's table when the batch has one (only sliding layers ask)."""
    views = batch.window_views
    if window not in views:
        lens = batch.seq_lens
        if not bool(((batch.q_start_loc[1:] - batch.q_start_loc[:-1]) == 1).all()):
            views[window] = None
        else:
            first = (lens - window).clamp(min=0)
            span = lens - first
            cols = first[:, None] + torch.arange(int(span.max()))[None, :]
            cols = torch.minimum(cols, (lens - 1)[:, None])  # (columns past a row's span: never read)
            table = batch.window_slot_table if batch.window_slot_table is not None else batch.slot_table
            views[window] = (span, table.gather(1, cols))
    return views[window]
