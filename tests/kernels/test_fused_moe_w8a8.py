"""fused_moe_w8a8 (one MoE layer's int8 experts in one call, packed per implementation) against
the reference on every implementation this host has: odd sizes, experts no token chose, top-k
above the token count, decode rows and prefill rows, fp32 and bf16 activations; and the packed
experts unpack to what was packed."""

from __future__ import annotations

import pytest
import torch

from anycore.kernels import moe
from anycore.kernels.int8 import quantize_weight_per_channel

OP = "fused_moe_w8a8"
pytestmark = pytest.mark.arm64


def _int8_experts(e: int, h: int, i: int):
    w13, w2 = torch.randn(e, 2 * i, h) / h ** 0.5, torch.randn(e, h, i) / i ** 0.5
    q13, s13 = quantize_weight_per_channel(w13.reshape(-1, h))
    q2, s2 = quantize_weight_per_channel(w2.reshape(-1, i))
    return (w13, w2), (q13.view(e, 2 * i, h), s13.view(e, 2 * i), q2.view(e, h, i), s2.view(e, h))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens, hidden, inter, experts, top_k, renormalize", [
    (1, 64, 32, 8, 2, True),      # batch-1 decode: 6 experts get no token
    (2, 33, 17, 4, 3, False),     # odd sizes (K not a multiple of 4 / 8), top-k above the token count
    (4, 48, 24, 5, 5, True),      # every expert, every token
    (37, 72, 40, 6, 2, False),    # prefill: many rows per expert (the GEMM tiles, not the GEMV)
])
def test_fused_moe_w8a8_matches_reference(kernel, dtype, tokens, hidden, inter, experts, top_k, renormalize):
    x = torch.randn(tokens, hidden).to(dtype)
    logits = torch.randn(tokens, experts)
    (w13, w2), (q13, s13, q2, s2) = _int8_experts(experts, hidden, inter)
    p13, p2 = kernel.pack(q13), kernel.pack(q2)
    got = kernel(x, logits, p13, p2, top_k, renormalize, s13, s2)
    ref = moe.fused_moe_reference(x, logits, q13, q2, top_k, renormalize, s13, s2)
    assert got.dtype == dtype and got.shape == x.shape
    # the int32 accumulators are exact; the fp32 epilogue and (bf16) the rounding of the gate/up
    # output and of silu * up may move an activation by one int8 step
    tol = 2e-2 if dtype is torch.bfloat16 else 1e-5
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol)
    # and the int8 experts stay close to the float ones they came from
    dense = moe.fused_moe_reference(x.float(), logits, w13, w2, top_k, renormalize)
    assert (got.float() - dense).abs().max() < 0.05 * dense.abs().max()


def test_packed_experts_unpack_to_what_was_packed(kernel):
    _, (q13, _, q2, _) = _int8_experts(3, 40, 12)
    assert torch.equal(kernel.unpack(kernel.pack(q13), 24, 40), q13)
    assert torch.equal(kernel.unpack(kernel.pack(q2), 40, 12), q2)


def test_an_expert_no_token_chose_is_never_read(kernel):
    x, logits = torch.randn(3, 32), torch.full((3, 4), -30.0)
    logits[:, 1], logits[:, 2] = 5.0, 4.0  # every token: experts 1 and 2
    _, (q13, s13, q2, s2) = _int8_experts(4, 32, 16)
    s13, s2 = s13.clone(), s2.clone()
    s13[0], s13[3], s2[0], s2[3] = float("nan"), float("nan"), float("nan"), float("nan")
    got = kernel(x, logits, kernel.pack(q13), kernel.pack(q2), 2, True, s13, s2)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, moe.fused_moe_reference(x, logits, q13, q2, 2, True, s13, s2),
                               rtol=1e-5, atol=1e-5)


def test_experts_packed_for_another_layout_are_refused(kernel):
    _, (q13, s13, q2, s2) = _int8_experts(2, 32, 12)  # (2I = 24 rows: every layout pads them to 32)
    with pytest.raises((ValueError, RuntimeError)):
        kernel.pack(q13.float())
    if kernel.impl in ("reference", "torch-native"):
        return
    with pytest.raises(RuntimeError, match="packed"):  # unpacked [E, N, K] int8 into a native variant
        kernel(torch.randn(1, 32), torch.randn(1, 2), q13.reshape(2, -1), q2.reshape(2, -1), 1, True, s13, s2)


def test_one_token_equals_its_rows_in_a_batch(kernel, impl):
    """A single token (the batch-1 decode schedule: all its experts in one thread team) gives the
    bits the per-expert calls give the same token twice; unchosen experts stay unread."""
    if impl in ("reference", "torch-native"):
        pytest.skip("the one-token schedule is the native kernels'")
    e, h, i = 8, 200, 100  # panel runs with a tail on both projections
    x, logits = torch.randn(1, h).to(torch.bfloat16), torch.randn(1, e)
    logits[0, [0, 5]] = -30.0
    _, (q13, s13, q2, s2) = _int8_experts(e, h, i)
    s13[[0, 5]], s2[[0, 5]] = float("nan"), float("nan")
    p13, p2 = kernel.pack(q13), kernel.pack(q2)
    alone = kernel(x, logits, p13, p2, 3, True, s13, s2)
    twice = kernel(x.repeat(2, 1), logits.repeat(2, 1), p13, p2, 3, True, s13, s2)
    assert torch.isfinite(alone).all() and torch.equal(alone[0], twice[0]) and torch.equal(alone[0], twice[1])
