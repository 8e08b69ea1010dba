"""GGUF block-quantized linear: weights kept as the file's own blocks, int8 activations.

Weight formats (ggml's block layouts, one output row = ``K / 32`` consecutive blocks, so a
weight is ``uint8 [N, K / 32 * block_bytes]``: the tensor's bytes exactly as the file stores
them, rows permuted at most):

- ``Q4_0`` (ggml type 2), 18 bytes: fp16 ``d``, 16 bytes of nibbles; ``w = d * (q - 8)``
- ``Q4_1`` (type 3), 20 bytes: fp16 ``d``, fp16 ``m``, 16 bytes of nibbles; ``w = d * q + m``
- ``Q8_0`` (type 8), 34 bytes: fp16 ``d``, 32 int8 ``q``; ``w = d * q``

Nibbles: byte ``j`` holds element ``j`` in its low 4 bits and element ``j + 16`` in its high 4.
Every format is ``w = dw * q + mw`` per block (Q4_0: ``mw = -8 dw``; Q8_0: ``mw = 0``).

Activations are quantized per 32-block (llama.cpp's Q8_1 idea): ``dx = max(|x|, 1e-12) / 127``,
``qx = round_half_even(x / dx)``, and ``sx = dx * sum(qx)``. Then one output is

    y = sum over blocks of  dw * dx * sum(q * qx)  +  mw * sx

with ``sum(q * qx)`` exact in int32: that is what every implementation computes (the float
order of the sum over blocks differs, so results agree to float rounding, not bit for bit).

That is for at most ``INT8_MAX_ROWS`` activation rows (decode, small batches). More rows
(prefill) take the simpler path: the blocks dequantized to the activation dtype, then a float
GEMM (``F.linear``; oneDNN), which on this project's CPUs beats the per-block int8 tiles
once a call has more than a few rows (SmolLM2 gate_up, 64 rows, one thread: 5.0 ms int8 tiles vs
~2.3 ms dequantize + bf16 GEMM).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 32
INT8_MAX_ROWS = 16  # csrc/common/kernel_table.h kGgufInt8MaxRows
Q4_0, Q4_1, Q8_0 = 2, 3, 8
# ggml type id -> (name, bytes per 32-weight block)
FORMATS: dict[int, tuple[str, int]] = {Q4_0: ("Q4_0", 18), Q4_1: ("Q4_1", 20), Q8_0: ("Q8_0", 34)}
# rows of activations one call of the torch-native path handles at once (bounds its [M, N, blocks]
# temporary)
_TORCH_ROWS = 16


def block_bytes(qtype: int) -> int:
    if qtype not in FORMATS:
        raise ValueError(f"unsupported GGUF block type {qtype} (supported: "
                         f"{', '.join(f'{n} ({t})' for t, (n, _) in FORMATS.items())})")
    return FORMATS[qtype][1]


def in_features(qweight: torch.Tensor, qtype: int) -> int:
    """K of a block weight ``uint8 [N, K / 32 * block_bytes]``."""
    bb = block_bytes(qtype)
    if qweight.dim() != 2 or qweight.dtype != torch.uint8 or qweight.shape[1] % bb:
        raise ValueError(f"a {FORMATS[qtype][0]} weight is uint8 [N, blocks * {bb}]; got "
                         f"{qweight.dtype} {tuple(qweight.shape)}")
    return qweight.shape[1] // bb * BLOCK


def decode_blocks(qweight: torch.Tensor, qtype: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q [N, nb, 32] int16, dw [N, nb] fp32, mw [N, nb] fp32)`` with ``w = dw * q + mw``."""
    bb = block_bytes(qtype)
    n = qweight.shape[0]
    blocks = qweight.reshape(n, -1, bb)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
    if qtype == Q8_0:
        q = blocks[..., 2:].contiguous().view(torch.int8).to(torch.int16)
        return q, d, torch.zeros_like(d)
    start = 2 if qtype == Q4_0 else 4
    nibbles = blocks[..., start:].to(torch.int16)
    q = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1)
    if qtype == Q4_0:
        return q, d, -8.0 * d
    m = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()
    return q, d, m


def dequantize(qweight: torch.Tensor, qtype: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight ``[N, K]`` (what loading without native blocks would have produced)."""
    q, dw, mw = decode_blocks(qweight, qtype)
    return (q.float() * dw[..., None] + mw[..., None]).reshape(qweight.shape[0], -1).to(dtype)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> ``(qx [M, nb, 32] int8, dx [M, nb] fp32, sx [M, nb] fp32)`` per 32-block."""
    xb = x.float().reshape(x.shape[0], -1, BLOCK)
    dx = xb.abs().amax(dim=-1).clamp(min=1e-12) / 127.0
    qx = torch.round(xb / dx[..., None]).clamp(-127, 127)
    return qx.to(torch.int8), dx, dx * qx.sum(dim=-1)


def gguf_linear_reference(x: torch.Tensor, qweight: torch.Tensor, qtype: int,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
    """The oracle: exact integer block sums (int64), the block epilogue in float64."""
    k = in_features(qweight, qtype)
    lead = x.shape[:-1]
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the weight {k}")
    if x.numel() > INT8_MAX_ROWS * k:
        return _dense(x, qweight, qtype, bias)
    qx, dx, sx = quantize_activations(x.reshape(-1, k))
    q, dw, mw = decode_blocks(qweight, qtype)
    isum = torch.einsum("mbk,nbk->mnb", qx.long(), q.long()).double()
    y = (isum * dw.double()[None] * dx.double()[:, None]).sum(-1) + sx.double() @ mw.double().t()
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype).reshape(*lead, qweight.shape[0])


def gguf_linear_torch(x: torch.Tensor, qweight: torch.Tensor, qtype: int,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """Torch-native: the same arithmetic in fp32, weight blocks decoded per call (integer block
    sums stay exact in fp32: at most 32 * 127 * 255 < 2^24), ``_TORCH_ROWS`` rows at a time."""
    k = in_features(qweight, qtype)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.shape[0] > INT8_MAX_ROWS:
        return _dense(x, qweight, qtype, bias)
    q, dw, mw = decode_blocks(qweight, qtype)
    qf = q.float().permute(1, 2, 0)  # [nb, 32, N]
    out = []
    for r in range(0, x2.shape[0], _TORCH_ROWS):
        qx, dx, sx = quantize_activations(x2[r : r + _TORCH_ROWS])
        isum = torch.bmm(qx.float().transpose(0, 1), qf)  # [nb, m, N]
        y = (isum * (dx.t()[:, :, None] * dw.t()[:, None, :])).sum(0) + sx @ mw.t()
        out.append(y)
    y = torch.cat(out) if out else x2.new_zeros(0, qweight.shape[0], dtype=torch.float32)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*lead, qweight.shape[0])


def _dense(x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: torch.Tensor | None) -> torch.Tensor:
    """The prefill path: blocks dequantized to x's dtype, then F.linear."""
    return F.linear(x, dequantize(qweight, qtype, x.dtype), None if bias is None else bias.to(x.dtype))
