"""The fused Mixture-of-Experts MLP (kernel-table op ``fused_moe``): the reference and the
torch-native implementation.

One call per MoE layer does the whole sparse MLP: route every token (softmax over the experts'
router logits in fp32, the ``top_k`` largest, renormalised when ``renormalize``), group the
(token, slot) pairs by expert, run each expert that got tokens once over its tokens
(gate/up GEMM, SiLU-and-mul, down GEMM), and sum the outputs weighted by the routing weights
in fp32. Experts that get no token are never read, so a batch-1 decode streams only the
``top_k`` active experts' weights.

Weights are stacked per layer: ``w13 [E, 2I, H]`` (gate rows, then up rows: the dense MLP's
``gate_up_proj`` layout) and ``w2 [E, H, I]``. With ``w13_scale [E, 2I]`` and
``w2_scale [E, H]`` given, the weights are int8 per output channel and activations are
quantized per token at run time (the W8A8 INT8 scheme of anycore.kernels.int8), each GEMM
accumulating exactly in int32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from anycore.kernels.int8 import quantize_per_token, w8a8_linear_reference
from anycore.kernels.onednn import float_linear


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights fp32 ``[T, top_k]``, expert ids int64 ``[T, top_k]``) from ``router_logits
    [T, E]``: the routing every supported model defines (HF's Qwen2/3-MoE, Mixtral, OLMoE)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def _check(x, router_logits, w13, w2, top_k, w13_scale, w2_scale) -> None:
    t, h = x.shape
    e, two_i, h13 = w13.shape
    if router_logits.shape != (t, e) or h13 != h or tuple(w2.shape) != (e, h, two_i // 2) or not 1 <= top_k <= e:
        raise ValueError(f"fused_moe: x {tuple(x.shape)}, router_logits {tuple(router_logits.shape)}, w13 "
                         f"{tuple(w13.shape)}, w2 {tuple(w2.shape)}, top_k {top_k} do not fit together")
    if (w13_scale is None) != (w2_scale is None):
        raise ValueError("fused_moe: give both w13_scale and w2_scale (int8 weights) or neither")


def fused_moe_reference(
    x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int,
    renormalize: bool, w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The oracle: token by token, slot by slot, the plain math (fp32 combine)."""
    _check(x, router_logits, w13, w2, top_k, w13_scale, w2_scale)
    weights, ids = route(router_logits, top_k, renormalize)
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for slot in range(top_k):
            e = int(ids[t, slot])
            row = x[t : t + 1]
            if w13_scale is None:
                gate_up = F.linear(row, w13[e])
                y = F.linear(F.silu(gate_up[:, : w2.shape[2]]) * gate_up[:, w2.shape[2] :], w2[e])
            else:
                gate_up = w8a8_linear_reference(row, w13[e], w13_scale[e])
                act = F.silu(gate_up[:, : w2.shape[2]]) * gate_up[:, w2.shape[2] :]
                y = w8a8_linear_reference(act, w2[e], w2_scale[e])
            out[t] += weights[t, slot] * y[0].float()
    return out.to(x.dtype)


def _int8_linear(x: torch.Tensor, qweight: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """W8A8 with ``qweight [N, K]`` int8 (torch._int_mm reads its transposed view)."""
    xq, xs = quantize_per_token(x)
    acc = torch._int_mm(xq, qweight.t())
    return (acc.float() * xs[:, None] * w_scale[None, :]).to(x.dtype)


def fused_moe_torch(
    x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int,
    renormalize: bool, w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Grouped by expert: one GEMM pair per expert that got tokens, its rows gathered once."""
    _check(x, router_logits, w13, w2, top_k, w13_scale, w2_scale)
    weights, ids = route(router_logits, top_k, renormalize)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # (token, slot) pairs, grouped by expert
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    flat_weights = weights.reshape(-1)
    inter = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float32)
    start = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue  # an expert no token chose: its weights are not touched
        pairs = order[start : start + count]
        start += count
        tokens = pairs // top_k
        rows = x[tokens]
        if w13_scale is None:
            gate_up = float_linear(rows, w13[e])
            y = float_linear(F.silu(gate_up[:, :inter]) * gate_up[:, inter:], w2[e])
        else:
            gate_up = _int8_linear(rows, w13[e], w13_scale[e])
            y = _int8_linear(F.silu(gate_up[:, :inter]) * gate_up[:, inter:], w2[e], w2_scale[e])
        out.index_add_(0, tokens, y.float() * flat_weights[pairs, None])
    return out.to(x.dtype)
