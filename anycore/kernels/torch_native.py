"""Torch-native implementations that differ from the references: faster fallbacks.

Same signatures and numerics as ``anycore.kernels.reference``. Ops whose reference is already
fast enough use it as their torch-native implementation (their ``OpSpec`` in
``anycore.kernels.ops`` says which; ``w8a8_linear``'s, on ``torch._int_mm``, is in
``anycore.kernels.int8``). Attention uses ``scaled_dot_product_attention`` and batches all
single-token (decode) queries together.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from anycore.kernels import reference
from anycore.kernels.onednn import float_linear

__all__ = ["linear", "paged_attention", "paged_attention_window"]

# F.linear, widened to fp32 for bf16 prefill rows where oneDNN has no bf16 GEMM
linear = float_linear


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    q_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    slot_table: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    out = torch.empty_like(q)
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[1]
    q_lens = (q_start_loc[1:] - q_start_loc[:-1]).tolist()
    lens = seq_lens.tolist()
    starts = q_start_loc.tolist()
    decode = [i for i, n in enumerate(q_lens) if n == 1]
    if decode:
        _decode_batch(q, k_cache, v_cache, starts, lens, slot_table, scale, decode, out)
    for i, n in enumerate(q_lens):
        if n == 1 or n == 0:
            continue
        seq_len = lens[i]
        slots = slot_table[i, :seq_len].long()
        k = k_cache[slots].transpose(0, 1)  # [KV, L, D]
        v = v_cache[slots].transpose(0, 1)
        qi = q[starts[i] : starts[i] + n].transpose(0, 1)  # [H, n, D]
        if seq_len == n:
            mask = None
            causal = True
        else:
            # queries are the last n positions: query j may see keys up to seq_len - n + j
            q_pos = torch.arange(seq_len - n, seq_len)[:, None]
            mask = torch.arange(seq_len)[None, :] <= q_pos
            causal = False
        o = F.scaled_dot_product_attention(
            qi, k, v, attn_mask=mask, is_causal=causal, scale=scale,
            enable_gqa=num_heads != num_kv_heads,
        )
        out[starts[i] : starts[i] + n] = o.transpose(0, 1)
    return out


def _decode_batch(q, k_cache, v_cache, starts, lens, slot_table, scale, rows, out) -> None:
    """All single-query requests in one padded SDPA call."""
    idx = torch.tensor(rows)
    max_len = max(lens[i] for i in rows)
    table = slot_table[idx, :max_len].long()  # [B, L] (padding rows point at valid slot 0..)
    lens_t = torch.tensor([lens[i] for i in rows])
    valid = torch.arange(max_len)[None, :] < lens_t[:, None]  # [B, L]
    table = torch.where(valid, table, torch.zeros_like(table))
    k = k_cache[table].transpose(1, 2)  # [B, KV, L, D]
    v = v_cache[table].transpose(1, 2)
    q_rows = torch.tensor([starts[i] for i in rows])
    qb = q[q_rows][:, :, None, :]  # [B, H, 1, D]
    o = F.scaled_dot_product_attention(
        qb, k, v, attn_mask=valid[:, None, None, :], scale=scale,
        enable_gqa=q.shape[1] != k_cache.shape[1],
    )
    out[q_rows] = o[:, :, 0, :]


def paged_attention_window(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    q_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    slot_table: torch.Tensor,
    scale: float,
    window: int,
    softcap: float,
) -> torch.Tensor:
    """SDPA over each request's window only (the slots of keys no query can see are not
    gathered); decodes batched into one padded call. Soft-capped scores need the scores
    themselves, so ``softcap`` > 0 runs the reference."""
    if softcap > 0:
        return reference.paged_attention_window(q, k_cache, v_cache, q_start_loc, seq_lens, slot_table, scale,
                                                window, softcap)
    out = torch.empty_like(q)
    gqa = q.shape[1] != k_cache.shape[1]
    q_lens = (q_start_loc[1:] - q_start_loc[:-1]).tolist()
    lens = seq_lens.tolist()
    starts = q_start_loc.tolist()
    decode = [i for i, n in enumerate(q_lens) if n == 1]
    if decode:
        firsts = [reference.window_start(lens[i], 1, window) for i in decode]
        spans = [lens[i] - f for i, f in zip(decode, firsts)]
        width = max(spans)
        offsets = torch.arange(width)[None, :]
        first_t = torch.tensor(firsts)[:, None]
        valid = offsets < torch.tensor(spans)[:, None]  # [B, W]
        cols = torch.where(valid, first_t + offsets, first_t)  # (padding reads the first key again)
        table = slot_table[torch.tensor(decode)[:, None], cols].long()
        k = k_cache[table].transpose(1, 2)  # [B, KV, W, D]
        v = v_cache[table].transpose(1, 2)
        q_rows = torch.tensor([starts[i] for i in decode])
        o = F.scaled_dot_product_attention(q[q_rows][:, :, None, :], k, v, attn_mask=valid[:, None, None, :],
                                           scale=scale, enable_gqa=gqa)
        out[q_rows] = o[:, :, 0, :]
    for i, n in enumerate(q_lens):
        if n <= 1:
            continue
        seq_len = lens[i]
        first = reference.window_start(seq_len, n, window)
        slots = slot_table[i, first:seq_len].long()
        k = k_cache[slots].transpose(0, 1)  # [KV, L', D]
        v = v_cache[slots].transpose(0, 1)
        qi = q[starts[i] : starts[i] + n].transpose(0, 1)  # [H, n, D]
        q_pos = torch.arange(seq_len - n, seq_len)[:, None]
        k_pos = torch.arange(first, seq_len)[None, :]
        mask = k_pos <= q_pos
        if window > 0:
            mask &= k_pos > q_pos - window
        o = F.scaled_dot_product_attention(qi, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
        out[starts[i] : starts[i] + n] = o.transpose(0, 1)
    return out
