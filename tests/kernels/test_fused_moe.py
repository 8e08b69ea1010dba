"""fused_moe (one MoE layer's routed experts in one call) against its reference, on every
implementation this host has: odd sizes, experts no token chose, top-k above the token count,
renormalised or not, bf16 rows on both sides of the native GEMV limit, and int8 experts."""

from __future__ import annotations

import pytest
import torch

from anycore.kernels import moe
from anycore.kernels.int8 import quantize_weight_per_channel

OP = "fused_moe"
pytestmark = pytest.mark.arm64


def _experts(e: int, h: int, i: int, dtype: torch.dtype):
    return (torch.randn(e, 2 * i, h) / h ** 0.5).to(dtype), (torch.randn(e, h, i) / i ** 0.5).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens, hidden, inter, experts, top_k", [
    (1, 64, 32, 8, 2),      # batch-1 decode: 6 experts get no token
    (2, 33, 17, 4, 3),      # odd sizes, top-k above the token count
    (16, 48, 24, 5, 5),     # every expert, every token: the GEMV limit (16 rows; 8 with AMX-BF16)
    (77, 72, 40, 6, 2),     # prefill: rows per expert above the GEMV limit
])
@pytest.mark.parametrize("renormalize", [True, False], ids=["renorm", "raw"])
def test_fused_moe_matches_reference(kernel, tol, dtype, tokens, hidden, inter, experts, top_k, renormalize):
    x = torch.randn(tokens, hidden).to(dtype)
    logits = torch.randn(tokens, experts).to(dtype)
    w13, w2 = _experts(experts, hidden, inter, dtype)
    got = kernel(x, logits, w13, w2, top_k, renormalize)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got, moe.fused_moe_reference(x, logits, w13, w2, top_k, renormalize), **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_prefill_under_inference_mode(kernel, tol, dtype):
    """The engine runs under torch.inference_mode(): a prefill's experts (the threads of the
    native kernel take experts side by side) still write their inference-mode tensors, with the
    result made outside it."""
    x, logits = torch.randn(77, 72).to(dtype), torch.randn(77, 6).to(dtype)
    w13, w2 = _experts(6, 72, 40, dtype)
    with torch.inference_mode():
        got = kernel(x, logits, w13, w2, 2, True)
    torch.testing.assert_close(got, moe.fused_moe_reference(x, logits, w13, w2, 2, True), **tol(dtype))


def test_an_expert_no_token_chose_is_never_read(kernel):
    x, logits = torch.randn(3, 16), torch.full((3, 4), -30.0)
    logits[:, 1], logits[:, 2] = 5.0, 4.0  # every token: experts 1 and 2
    w13, w2 = _experts(4, 16, 8, torch.float32)
    w13[0], w13[3], w2[0], w2[3] = float("nan"), float("nan"), float("nan"), float("nan")
    got = kernel(x, logits, w13, w2, 2, True)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, moe.fused_moe_reference(x, logits, w13, w2, 2, True), rtol=1e-5, atol=2e-5)


def test_routing_is_softmax_top_k_then_optional_renormalisation():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    probs = logits.softmax(-1)
    w, ids = moe.route(logits, 2, renormalize=False)
    assert ids.tolist() == [[1, 2]]
    torch.testing.assert_close(w, probs[:, [1, 2]])
    w, _ = moe.route(logits, 2, renormalize=True)
    torch.testing.assert_close(w, probs[:, [1, 2]] / probs[:, [1, 2]].sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_int8_experts_match_reference(kernel, dtype):
    x = torch.randn(9, 40).to(dtype)
    logits = torch.randn(9, 6)
    w13, w2 = _experts(6, 40, 24, torch.float32)
    q13, s13 = quantize_weight_per_channel(w13.reshape(-1, 40))
    q2, s2 = quantize_weight_per_channel(w2.reshape(-1, 24))
    args = (x, logits, q13.view(6, 48, 40), q2.view(6, 40, 24), 2, True, s13.view(6, 48), s2.view(6, 40))
    ref = moe.fused_moe_reference(*args)
    # (the int8 accumulators are exact; only the fp32 epilogue and the bf16 rounding differ)
    torch.testing.assert_close(kernel(*args), ref, rtol=2e-2 if dtype is torch.bfloat16 else 1e-5,
                               atol=2e-2 if dtype is torch.bfloat16 else 1e-5)
    # and the int8 experts stay close to the float ones they came from
    dense = moe.fused_moe_reference(x.float(), logits, w13, w2, 2, True)
    assert (ref.float() - dense).abs().max() < 0.05 * dense.abs().max()


def test_shapes_that_do_not_fit_are_refused():
    x, logits = torch.randn(2, 16), torch.randn(2, 4)
    w13, w2 = _experts(4, 16, 8, torch.float32)
    with pytest.raises(ValueError, match="do not fit"):
        moe.fused_moe_torch(x, logits, w13, w2, 5, True)
    with pytest.raises(ValueError, match="do not fit"):
        moe.fused_moe_torch(x, logits[:, :3], w13, w2, 2, True)


def test_one_bf16_token_equals_its_rows_in_a_batch(kernel, impl):
    """A single bf16 token (the batch-1 decode schedule: all its experts' GEMV rows in one thread
    team) gives the bits the per-expert GEMV calls give the same token twice; unchosen experts
    stay unread."""
    if impl in ("reference", "torch-native"):
        pytest.skip("the one-token schedule is the native kernels'")
    e, h, i = 8, 200, 100  # row runs with a tail on both projections
    x, logits = torch.randn(1, h).to(torch.bfloat16), torch.randn(1, e).to(torch.bfloat16)
    logits[0, [0, 5]] = -30.0
    w13, w2 = _experts(e, h, i, torch.bfloat16)
    w13[[0, 5]], w2[[0, 5]] = float("nan"), float("nan")
    alone = kernel(x, logits, w13, w2, 3, True)
    twice = kernel(x.repeat(2, 1), logits.repeat(2, 1), w13, w2, 3, True)
    assert torch.isfinite(alone).all() and torch.equal(alone[0], twice[0]) and torch.equal(alone[0], twice[1])
