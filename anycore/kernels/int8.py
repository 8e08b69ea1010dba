"""W8A8 INT8 matmul: the pure-torch reference, the torch-native fallback and the native binding.

Scheme (the one SGLang/vLLM call W8A8 INT8): weights int8 symmetric per output channel
(``w ≈ qweight * w_scale[n]``), activations int8 symmetric per token, quantized at run time
(``x ≈ xq * x_scale[m]``); products accumulate exactly in int32, then
``y = acc * x_scale[m] * w_scale[n] (+ bias)`` in fp32, cast to the activation dtype.

The kernel-table op ``w8a8_linear`` is an ``Int8Linear``: each implementation reads the weight
in its own pre-packed layout, made once at load by its ``pack`` (torch-native: ``[K, N]`` for
``torch._int_mm``; native variants: panels for VPDPBUSD / SDOT / SMMLA, see
csrc/common/int8_impl.h), so a packed weight must go back to the implementation that packed it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def quantize_weight_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` float -> (int8 ``[N, K]``, fp32 scales ``[N]``), symmetric, range ±127."""
    wf = w.float()
    scale = wf.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    # one temporary, rounded and clamped in place (the alpha search quantizes each weight 7 times)
    q = (wf / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
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
    (contiguous), the layout _int_mm reads fastest for small M. ``x`` may have leading dims."""
    lead = x.shape[:-1]
    xq, xs = quantize_per_token(x.reshape(-1, x.shape[-1]))
    acc = torch._int_mm(xq, qweight_t)
    y = acc.float() * xs[:, None] * w_scale[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*lead, qweight_t.shape[1])


@dataclass(frozen=True)
class Int8Linear:
    """One implementation of ``w8a8_linear`` and the weight layout it reads.

    ``pack(qweight [N, K] int8) -> packed`` (once, at load); ``unpack(packed, n, k) -> [N, K]``
    (e.g. for saving), or ``unpack(packed, n, k, rows)`` only those rows (int64 ids,
    ``[len(rows), K]``); ``self(x, packed, w_scale, bias)`` is the W8A8 linear;
    ``acc(xq [M, K] int8, packed, n) -> int32 [M, N]`` the exact accumulator (tests).
    """

    impl: str
    pack: Callable[[torch.Tensor], torch.Tensor]
    unpack: Callable[..., torch.Tensor]
    forward: Callable[..., torch.Tensor]
    acc: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]

    def __call__(self, x: torch.Tensor, packed: torch.Tensor, w_scale: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward(x, packed, w_scale, bias)


def _pack_t(qweight: torch.Tensor) -> torch.Tensor:
    return qweight.t().contiguous()


def _unpack_t(packed: torch.Tensor, n: int, k: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    return packed.t().contiguous() if rows is None else packed[:, rows.reshape(-1)].t().contiguous()


def _acc_torch(xq: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    return torch._int_mm(xq, packed)


def _pack_ref(qweight: torch.Tensor) -> torch.Tensor:
    return qweight.contiguous()


def _unpack_ref(packed: torch.Tensor, n: int, k: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    return packed if rows is None else packed[rows.reshape(-1)]


def _acc_ref(xq: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    return (xq.long() @ packed.long().t()).to(torch.int32)


TORCH_NATIVE_W8A8 = Int8Linear("torch-native", _pack_t, _unpack_t, w8a8_linear_torch, _acc_torch)
REFERENCE_W8A8 = Int8Linear("reference", _pack_ref, _unpack_ref, w8a8_linear_reference, _acc_ref)


def native_int8_linear(idx: int, impl: str) -> Int8Linear:
    """The extension variant ``impl`` (index ``idx``): its packer and kernel; activations other
    than fp32/bf16 run in fp32. Bound by anycore.kernels.dispatch after its CPU check."""
    lib = torch.ops.anycore

    def forward(x, packed, w_scale, bias=None):
        if x.dtype not in (torch.float32, torch.bfloat16):
            return lib.w8a8_linear(x.float(), packed, w_scale, bias, idx).to(x.dtype)
        return lib.w8a8_linear(x, packed, w_scale, bias, idx)

    return Int8Linear(
        impl,
        pack=lambda qweight: lib.int8_pack(qweight, idx),
        unpack=lambda packed, n, k, rows=None: lib.int8_unpack(packed, n, k, idx, rows),
        forward=forward,
        acc=lambda xq, packed, n: lib.w8a8_int8_acc(xq, packed, n, idx),
    )
