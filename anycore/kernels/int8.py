"""W8A8 INT8 matmul: the pure-torch reference and the torch-native fallback.

Scheme (the one SGLang/vLLM call W8A8 INT8): weights int8 symmetric per output channel
(``w ≈ qweight * w_scale[n]``), activations int8 symmetric per token, quantized at run time
(``x ≈ xq * x_scale[m]``); products accumulate exactly in int32, then
``y = acc * x_scale[m] * w_scale[n] (+ bias)`` in fp32, cast to the activation dtype.
"""

from __future__ import annotations

import torch


def quantize_weight_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` float -> (int8 ``[N, K]``, fp32 scales ``[N]``), symmetric, range ±127."""
    wf = w.float()
    scale = wf.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(wf / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` float -> (int8 ``[M, K]``, fp32 scales ``[M]``), symmetric, range ±127."""
    xf = x.float()
    scale = xf.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(xf / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def w8a8_linear_reference(
    x: torch.Tensor, qweight: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The oracle: exact int32 accumulation via int64 matmul, fp32 epilogue. ``qweight [N, K]``."""
    xq, xs = quantize_per_token(x)
    acc = (xq.long() @ qweight.long().t()).to(torch.int32)
    y = acc.float() * xs[:, None] * w_scale.float()[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def w8a8_linear_torch(
    x: torch.Tensor, qweight_t: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Torch-native fallback on ``torch._int_mm``; weight pre-packed as ``qweight_t [K, N]``
    (contiguous), the layout _int_mm reads fastest for small M."""
    xq, xs = quantize_per_token(x)
    acc = torch._int_mm(xq, qweight_t)
    y = acc.float() * xs[:, None] * w_scale[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
