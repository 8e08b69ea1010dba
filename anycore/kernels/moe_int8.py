"""The W8A8 fused Mixture-of-Experts op (kernel-table op ``fused_moe_w8a8``): int8 experts in
the layout of the implementation that runs them.

The math is ``fused_moe`` with int8 experts (anycore.kernels.moe: softmax top-k routing, experts
grouped, per-token int8 activations, int32 accumulation, fp32 epilogue per output channel,
SiLU-and-mul in the activation dtype, fp32 weighted combine). Like ``w8a8_linear``
(anycore.kernels.int8) each implementation reads the experts in its own pre-packed layout made
once at load by its ``pack``, so packed experts go back to the implementation that packed them:

- reference and torch-native: ``int8 [E, N, K]`` as quantized (``torch._int_mm`` per expert);
- a native variant: each expert packed by that variant's ``int8_pack`` (panels for VPDPBUSD /
  SDOT / SMMLA, csrc/common/int8_impl.h), stacked ``[E, packed bytes]``; the whole layer is one
  native call (csrc/common/fused_moe_w8a8.cpp) on the variant's int8 GEMM/GEMV.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from anycore.kernels.moe import fused_moe_reference, fused_moe_torch


@dataclass(frozen=True)
class Int8Moe:
    """One implementation of ``fused_moe_w8a8`` and the expert layout it reads.

    ``pack(qweight int8 [E, N, K]) -> packed`` (once, at load); ``unpack(packed, n, k) ->
    int8 [E, N, K]`` (saving); ``self(x, router_logits, w13, w2, top_k, renormalize, w13_scale,
    w2_scale)`` the layer, ``w13``/``w2`` packed, scales fp32 ``[E, 2I]`` and ``[E, H]``."""

    impl: str
    pack: Callable[[torch.Tensor], torch.Tensor]
    unpack: Callable[[torch.Tensor, int, int], torch.Tensor]
    forward: Callable[..., torch.Tensor]

    def __call__(self, x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                 top_k: int, renormalize: bool, w13_scale: torch.Tensor, w2_scale: torch.Tensor) -> torch.Tensor:
        return self.forward(x, router_logits, w13, w2, top_k, renormalize, w13_scale, w2_scale)


def _as_is(qweight: torch.Tensor) -> torch.Tensor:
    if qweight.dtype is not torch.int8 or qweight.dim() != 3:
        raise ValueError(f"int8 experts must be int8 [E, N, K], got {qweight.dtype} {tuple(qweight.shape)}")
    return qweight.contiguous()


def _unpack_as_is(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    if tuple(packed.shape[1:]) != (n, k):
        raise ValueError(f"int8 experts {tuple(packed.shape)} are not [E, {n}, {k}]")
    return packed


REFERENCE_MOE_W8A8 = Int8Moe("reference", _as_is, _unpack_as_is, fused_moe_reference)
TORCH_NATIVE_MOE_W8A8 = Int8Moe("torch-native", _as_is, _unpack_as_is, fused_moe_torch)


def native_int8_moe(idx: int, impl: str) -> Int8Moe:
    """The extension variant ``impl`` (index ``idx``): experts packed by its ``int8_pack`` and
    the layer in one call; activations other than fp32/bf16 run in fp32. Bound by
    anycore.kernels.dispatch after its CPU check."""
    lib = torch.ops.anycore

    def pack(qweight: torch.Tensor) -> torch.Tensor:
        _as_is(qweight)
        return torch.stack([lib.int8_pack(q, idx) for q in qweight])

    def unpack(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
        return torch.stack([lib.int8_unpack(p, n, k, idx) for p in packed])

    def forward(x, router_logits, w13, w2, top_k, renormalize, w13_scale, w2_scale):
        lead, rows = x.shape, x.reshape(-1, x.shape[-1])
        if x.dtype not in (torch.float32, torch.bfloat16):
            rows = rows.float()
        out = lib.fused_moe_w8a8(rows, router_logits.reshape(rows.shape[0], -1), w13, w2, top_k, renormalize,
                                 w13_scale, w2_scale, idx)
        return out.to(x.dtype).reshape(lead)

    return Int8Moe(impl, pack, unpack, forward)
