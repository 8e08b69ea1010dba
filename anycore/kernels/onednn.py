"""What torch's CPU GEMM (oneDNN) does fast on this CPU, and the float linear that follows it.

oneDNN has a bf16 GEMM of its own only with AVX-512 BW/VL/DQ, AMX or Arm's BF16 (torch's own
test, ``torch.ops.mkldnn._is_mkldnn_bf16_supported``). Without one (an AVX2-only x86 such as
Zen 3) a bf16 ``F.linear`` is several times slower than fp32: on a 2-core Zen 3, 1536 x 576, it
took 0.16 / 0.60 / 2.97 / 46.8 ms at 1 / 4 / 32 / 512 rows, and the same widened to fp32
0.33 / 0.47 / 0.80 / 5.7 ms. So there bf16 GEMMs of at least ``WIDEN_MIN_ROWS`` rows run in
fp32 and round the result back to bf16 (``kWidenMinRows`` in csrc/common/ops.h: the native
decoder stack's rule is the same).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

WIDEN_MIN_ROWS = 4


@functools.cache
def has_bf16_gemm() -> bool:
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def widens(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``float_linear(x, weight)`` runs in fp32 rather than bf16."""
    return (x.dtype is torch.bfloat16 and weight.dtype is torch.bfloat16
            and x.numel() >= WIDEN_MIN_ROWS * x.shape[-1] and not has_bf16_gemm())


def float_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, in fp32 with the result rounded to bf16 where ``widens(x, weight)``."""
    if widens(x, weight):
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(torch.bfloat16)
    return F.linear(x, weight, bias)
