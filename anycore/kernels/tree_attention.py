"""tree_attention: paged attention whose new tokens see each other through a given mask.

A speculative tree verify (anycore/spec/tree.py) computes the request's last token (the root)
and every drafted node in one extend; a node may see the whole cached prefix, and among the new
tokens only the root, its ancestors and itself. With the mask lower-triangular this is exactly
``paged_attention`` (causal extend), which is how rows of other requests in the same batch
(prefill chunks, plain decodes) are expressed.

Arguments are ``paged_attention``'s plus ``mask`` [num_tokens, max new tokens] bool: request
i's queries are its last n_i keys (rows ``q_start_loc[i]:q_start_loc[i+1]``); query row r of
request i sees every key before those n_i, and new key j (0-based among them) iff
``mask[r, j]``. Every row must see at least one key (itself, in practice).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _requests(q_start_loc: torch.Tensor, seq_lens: torch.Tensor, slot_table: torch.Tensor, mask: torch.Tensor):
    """Per request with new tokens: (first row, end row, its slots [L], visible [n, L] bool),
    the whole cached prefix visible and the new tokens through ``mask``."""
    starts = q_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        a, b = starts[i], starts[i + 1]
        n = b - a
        if n == 0:
            continue
        visible = torch.ones(n, seq_len, dtype=torch.bool)
        visible[:, seq_len - n :] = mask[a:b, :n]
        yield a, b, slot_table[i, :seq_len].long(), visible


def tree_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, q_start_loc: torch.Tensor,
                             seq_lens: torch.Tensor, slot_table: torch.Tensor, mask: torch.Tensor,
                             scale: float) -> torch.Tensor:
    """fp32 math, one request and one head group at a time (the oracle)."""
    out = torch.empty_like(q)
    group = q.shape[1] // k_cache.shape[1]
    for a, b, slots, visible in _requests(q_start_loc, seq_lens, slot_table, mask):
        k = k_cache[slots].repeat_interleave(group, dim=1).float()  # [L, H, D]
        v = v_cache[slots].repeat_interleave(group, dim=1).float()
        scores = torch.einsum("nhd,lhd->hnl", q[a:b].float(), k) * scale
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[a:b] = torch.einsum("hnl,lhd->nhd", scores.softmax(dim=-1), v).to(q.dtype)
    return out


def tree_attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, q_start_loc: torch.Tensor,
                         seq_lens: torch.Tensor, slot_table: torch.Tensor, mask: torch.Tensor,
                         scale: float) -> torch.Tensor:
    """The same through ``scaled_dot_product_attention`` with a boolean mask per request."""
    out = torch.empty_like(q)
    gqa = q.shape[1] != k_cache.shape[1]
    for a, b, slots, visible in _requests(q_start_loc, seq_lens, slot_table, mask):
        k = k_cache[slots].transpose(0, 1)  # [KV, L, D]
        v = v_cache[slots].transpose(0, 1)
        o = F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k, v, attn_mask=visible, scale=scale,
                                           enable_gqa=gqa)
        out[a:b] = o.transpose(0, 1)
    return out
