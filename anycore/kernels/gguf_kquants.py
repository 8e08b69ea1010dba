"""GGML's K-quant super-blocks (256 weights) decoded into the 32-block form of
anycore/kernels/gguf.py: ``(q [N, nb, 32] int16, dw [N, nb, 2] fp32, mw [N, nb] fp32)`` with
``w = dw[half] * q + mw`` per 32-weight sub-block (nb = K / 32).

Layouts (byte offsets in one super-block; ggml's ``block_q4_K`` / ``block_q5_K`` / ``block_q6_K``):

- ``Q4_K`` (144 bytes): fp16 ``d`` @0, fp16 ``dmin`` @2, 12 bytes of packed 6-bit scales and
  minimums @4, 128 bytes of nibbles @16. Sub-block ``j`` (of 8): ``w = d * sc[j] * q - dmin * m[j]``,
  its ``q`` the low (j even) or high (j odd) nibbles of bytes ``32 * (j // 2) .. + 31``.
- ``Q5_K`` (176 bytes): as Q4_K, with 32 bytes ``qh`` @16 before the nibbles @48: bit ``j`` of
  ``qh[l]`` is the fifth bit of element ``l`` of sub-block ``j``.
- ``Q6_K`` (210 bytes): 128 bytes ``ql`` @0, 64 bytes ``qh`` @128, 16 int8 scales @192 (one per 16
  weights), fp16 ``d`` @208. ``w = d * sc[e // 16] * (q - 32)``; in half ``h`` (128 weights),
  element ``32 * t + l`` takes the low (t < 2) or high nibble of ``ql[64 h + 32 (t % 2) + l]`` and
  bits ``2t, 2t + 1`` of ``qh[32 h + l]`` as its bits 4 and 5.

The scale products are fp32 exactly as GGML forms them (``d * sc``, ``dmin * m``), so dequantizing
is bit-equal to ``gguf.quants.dequantize``.
"""

from __future__ import annotations

import torch

Q4_K, Q5_K, Q6_K = 12, 13, 14
SUPER = 256  # weights per super-block
_BYTES = {Q4_K: 144, Q5_K: 176, Q6_K: 210}


def _half(b: torch.Tensor) -> torch.Tensor:
    """fp16 from two little-endian bytes ``[..., 2]`` -> fp32 ``[...]``."""
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 packed bytes ``[..., 12]`` -> the eight 6-bit scales and minimums ``[..., 8]`` (int64)."""
    s = scales.to(torch.int64)
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def decode(qweight: torch.Tensor, qtype: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = qweight.shape[0]
    blocks = qweight.reshape(n, -1, _BYTES[qtype])
    nsb = blocks.shape[1]
    if qtype == Q6_K:
        ql = blocks[..., 0:128].reshape(n, nsb, 2, 64).to(torch.int16)
        qh = blocks[..., 128:192].reshape(n, nsb, 2, 1, 32).to(torch.int16)
        sc = blocks[..., 192:208].contiguous().view(torch.int8).float()
        d = _half(blocks[..., 208:210])
        low = torch.cat([ql & 0x0F, ql >> 4], dim=-1).reshape(n, nsb, 2, 4, 32)
        high = (qh >> torch.tensor([0, 2, 4, 6], dtype=torch.int16).reshape(4, 1)) & 3
        q = (low | (high << 4)) - 32
        dw = (d[..., None] * sc).reshape(n, nsb * 8, 2)
        return q.reshape(n, nsb * 8, 32), dw, torch.zeros(n, nsb * 8)
    d, dmin = _half(blocks[..., 0:2]), _half(blocks[..., 2:4])
    sc, mn = scale_min(blocks[..., 4:16])
    qs = blocks[..., -128:].reshape(n, nsb, 4, 1, 32).to(torch.int16)
    q = (qs >> torch.tensor([0, 4], dtype=torch.int16).reshape(2, 1)) & 0x0F  # [n, nsb, 4, 2, 32]
    q = q.reshape(n, nsb, 8, 32)
    if qtype == Q5_K:
        qh = blocks[..., 16:48].reshape(n, nsb, 1, 32).to(torch.int16)
        q = q | (((qh >> torch.arange(8, dtype=torch.int16).reshape(8, 1)) & 1) << 4)
    dw = (d[..., None] * sc.float()).reshape(n, nsb * 8, 1).expand(n, nsb * 8, 2)
    mw = -(dmin[..., None] * mn.float()).reshape(n, nsb * 8)
    return q.reshape(n, nsb * 8, 32), dw, mw
