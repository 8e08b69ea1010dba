"""Paged attention layer: writes new K/V into the pool, attends over each request's slots."""

from __future__ import annotations

import torch
from torch import nn

from anycore.kernels.ops import KernelOps
from anycore.layers.forward_batch import ForwardBatch


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, layer_idx: int, ops: KernelOps) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.layer_idx = layer_idx
        self.scale = head_dim**-0.5
        self.ops = ops

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        t = q.shape[0]
        k_cache = batch.k_cache[self.layer_idx]
        v_cache = batch.v_cache[self.layer_idx]
        # index_copy_ is a single fused scatter (cheaper than advanced-index assignment)
        k_cache.index_copy_(0, batch.slot_mapping, k.reshape(t, self.num_kv_heads, self.head_dim))
        v_cache.index_copy_(0, batch.slot_mapping, v.reshape(t, self.num_kv_heads, self.head_dim))
        out = self.ops.paged_attention(
            q.view(t, self.num_heads, self.head_dim),
            k_cache,
            v_cache,
            batch.q_start_loc,
            batch.seq_lens,
            batch.slot_table,
            self.scale,
        )
        return out.view(t, self.num_heads * self.head_dim)
