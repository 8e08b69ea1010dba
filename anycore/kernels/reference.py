"""Pure-torch reference implementations of every op in the kernel table.

These are the oracles: every native variant is tested against them, and they are also the
torch-native fallback that runs wherever no native variant exists. They favour clarity over
speed, but they are vectorised where that costs no clarity.

Conventions shared by every implementation of an op:
- activations are 2-D ``[num_tokens, features]`` (a flat batch of all requests' tokens);
- the KV pool of one layer is ``[num_slots, num_kv_heads, head_dim]`` for K and for V;
- a request's KV lives at the slots listed in its row of ``slot_table`` (int32/int64),
  ``seq_lens[i]`` entries of it being valid.
"""

from __future__ import annotations

import torch

from anycore.kernels.gguf import gguf_linear_reference as gguf_linear  # noqa: F401  (GGUF block oracle)
from anycore.kernels.int8 import REFERENCE_W8A8 as w8a8_linear  # noqa: F401  (W8A8 INT8 oracle)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32, cast back to the input dtype before the weight (as HF Llama)."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: normalised and scaled by ``1 + weight`` in fp32, then cast to the input
    dtype (HF Gemma3RMSNorm; the weight is stored zero-centred)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(rms_norm(x + residual), x + residual)``; the sum is the next residual."""
    summed = x + residual
    return rms_norm(summed, weight, eps), summed


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)``, ``weight [out, in]``: F.linear's semantics, in the input dtype."""
    return torch.nn.functional.linear(x, weight, bias)


def rotary_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[num_tokens, head_dim]`` for the given positions (rotate-half layout)."""
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Applies rotate-half RoPE to ``x [num_tokens, num_heads * head_dim]``; returns a new tensor.

    Math in fp32 then cast, as the HF reference does for fp32 and close to it for bf16.
    """
    t = x.shape[0]
    xh = x.view(t, -1, head_dim)
    half = head_dim // 2
    rotated = torch.cat((-xh[..., half:], xh[..., :half]), dim=-1)
    c = cos[:, None, :].to(x.dtype)
    s = sin[:, None, :].to(x.dtype)
    return (xh * c + rotated * s).reshape(t, -1)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :d]) * x[:, d:]`` for ``x [num_tokens, 2 * d]``."""
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """GeGLU: ``gelu_tanh(x[:, :d]) * x[:, d:]`` for ``x [num_tokens, 2 * d]`` (Gemma's MLP,
    transformers' ``gelu_pytorch_tanh``)."""
    d = x.shape[-1] // 2
    return torch.nn.functional.gelu(x[..., :d], approximate="tanh") * x[..., d:]


def window_start(seq_len: int, num_new: int, window: int) -> int:
    """First position any of the last ``num_new`` queries of a ``seq_len`` sequence can see when
    each sees only the ``window`` latest keys (itself included); ``window`` 0 = no limit."""
    return max(0, seq_len - num_new - window + 1) if window > 0 else 0


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
    """``paged_attention`` where the query at position p sees only keys at positions
    ``p - window < k <= p`` (``window`` 0: all of ``0..p``; transformers' sliding-window mask),
    and scores are soft-capped ``softcap * tanh(s / softcap)`` before the mask (0: none).
    Keys outside every query's window are never read."""
    out = torch.empty_like(q)
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[1]
    group = num_heads // num_kv_heads
    starts = q_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_i = q[starts[i] : starts[i + 1]]  # [n, H, D]
        n = q_i.shape[0]
        if n == 0:
            continue
        first = window_start(seq_len, n, window)
        slots = slot_table[i, first:seq_len].long()
        k = k_cache[slots].repeat_interleave(group, dim=1)  # [L', H, D]
        v = v_cache[slots].repeat_interleave(group, dim=1)
        scores = torch.einsum("nhd,lhd->hnl", q_i.float(), k.float()) * scale
        if softcap > 0:
            scores = torch.tanh(scores / softcap) * softcap
        q_pos = torch.arange(seq_len - n, seq_len)[:, None]
        k_pos = torch.arange(first, seq_len)[None, :]
        hidden = k_pos > q_pos
        if window > 0:
            hidden |= k_pos <= q_pos - window
        scores = scores.masked_fill(hidden, float("-inf"))
        probs = scores.softmax(dim=-1)
        out[starts[i] : starts[i + 1]] = torch.einsum("hnl,lhd->nhd", probs, v.float()).to(q.dtype)
    return out


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    q_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    slot_table: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of new tokens over each request's paged KV (prefix + new tokens).

    q:           [num_tokens, num_heads, head_dim], request i's queries at rows
                 q_start_loc[i]:q_start_loc[i+1]; they are the *last* tokens of its sequence.
    k/v_cache:   [num_slots, num_kv_heads, head_dim] (the new tokens' K/V already written).
    seq_lens:    [batch] total tokens (cached prefix + new) of each request.
    slot_table:  [batch, >= max(seq_lens)] slots of each request's tokens in order.
    Returns      [num_tokens, num_heads, head_dim] in q's dtype. GQA by head grouping.
    """
    out = torch.empty_like(q)
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[1]
    group = num_heads // num_kv_heads
    starts = q_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        q_i = q[starts[i] : starts[i + 1]]  # [n, H, D]
        n = q_i.shape[0]
        slots = slot_table[i, :seq_len].long()
        k = k_cache[slots].repeat_interleave(group, dim=1)  # [L, H, D]
        v = v_cache[slots].repeat_interleave(group, dim=1)
        scores = torch.einsum("nhd,lhd->hnl", q_i.float(), k.float()) * scale
        # query j sits at absolute position seq_len - n + j and may see keys 0..that position
        q_pos = torch.arange(seq_len - n, seq_len)[:, None]
        k_pos = torch.arange(seq_len)[None, :]
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
        probs = scores.softmax(dim=-1)
        out[starts[i] : starts[i + 1]] = torch.einsum("hnl,lhd->nhd", probs, v.float()).to(q.dtype)
    return out
