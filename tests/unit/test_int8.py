"""W8A8 INT8 math: quantizers, the exact reference, and the torch._int_mm fallback."""

from __future__ import annotations

import pytest
import torch

from anycore.kernels.int8 import (
    quantize_per_token,
    quantize_weight_per_channel,
    w8a8_linear_reference,
    w8a8_linear_torch,
)


@pytest.mark.parametrize("m,k,n", [(1, 64, 32), (3, 100, 17), (17, 576, 192), (64, 33, 129)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fallback_matches_reference(m, k, n, dtype):
    torch.manual_seed(m * k + n)
    x = torch.randn(m, k).to(dtype)
    w = torch.randn(n, k)
    bias = torch.randn(n).to(dtype)
    qw, ws = quantize_weight_per_channel(w)
    ref = w8a8_linear_reference(x, qw, ws, bias)
    got = w8a8_linear_torch(x, qw.t().contiguous(), ws, bias)
    assert got.dtype == dtype
    assert torch.allclose(got.float(), ref.float(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-3)


def test_int32_accumulation_is_exact():
    torch.manual_seed(0)
    xq = torch.randint(-127, 128, (5, 4096), dtype=torch.int8)
    wq = torch.randint(-127, 128, (7, 4096), dtype=torch.int8)
    exact = xq.long() @ wq.long().t()
    assert torch.equal(torch._int_mm(xq, wq.t().contiguous()).long(), exact)


def test_quantizers_are_symmetric_and_bounded():
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]])
    q, s = quantize_per_token(x)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    assert q[0, 1] == -127 and torch.allclose(s[0], torch.tensor(2.0 / 127))
    assert torch.equal(q[1], torch.zeros(3, dtype=torch.int8))  # all-zero row: no NaN
    w = torch.randn(8, 16)
    qw, ws = quantize_weight_per_channel(w)
    assert torch.allclose(qw.float() * ws[:, None], w, atol=ws.max().item() / 2 + 1e-6)


def test_quantization_error_is_small_relative_to_output():
    torch.manual_seed(1)
    x, w = torch.randn(16, 512), torch.randn(256, 512) / 20
    qw, ws = quantize_weight_per_channel(w)
    y, ref = w8a8_linear_reference(x, qw, ws), x @ w.t()
    assert ((y - ref).norm() / ref.norm()) < 0.02
