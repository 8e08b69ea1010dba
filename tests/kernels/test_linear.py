"""The native small-M linear (x86 AVX-512, Arm Neon) against F.linear, raw op and dispatch routing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from anycore.kernels.build import load_extension
from anycore.kernels.dispatch import make_op

OP = "linear"
# tiny shapes: the emulated Arm64 lane runs them for each Arm variant of linear
pytestmark = pytest.mark.arm64


def _raw(impl):
    if impl == "torch-native":
        return lambda x, w, b: F.linear(x, w, b)
    idx = load_extension().variants.index(impl)
    return lambda x, w, b: torch.ops.anycore.linear(x, w, b, idx)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("m, k, n", [(1, 64, 7), (1, 100, 33), (2, 40, 5), (3, 4100, 17), (4, 96, 9), (5, 2048, 64),
                                     (7, 300, 13), (9, 64, 4), (6, 72, 10), (13, 200, 11), (16, 96, 12)])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_linear_raw(impl, dtype, m, k, n, with_bias):
    x = torch.randn(m, k, dtype=dtype)
    w = torch.randn(n, k, dtype=dtype) / k**0.5
    b = torch.randn(n, dtype=dtype) if with_bias else None
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    out = _raw(impl)(x, w, b)
    assert out.dtype == dtype and out.shape == (m, n)
    tol = {"rtol": 1e-5, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 2e-2}
    torch.testing.assert_close(out.float(), ref, **tol)


@pytest.mark.parametrize("m", [5, 8, 13, 16])
def test_linear_rows_do_not_depend_on_the_batch(impl, m):
    """Each bf16 row comes out bit for bit as a one-row call computes it, so a speculative verify
    of up to native_linear_max_rows() tokens equals one-token decodes (csrc/common/gemv_kernels.h)."""
    if impl == "torch-native":
        pytest.skip("F.linear (oneDNN) makes no such promise")
    x = torch.randn(m, 1000, dtype=torch.bfloat16)
    w = torch.randn(23, 1000, dtype=torch.bfloat16) / 1000**0.5
    rows = torch.cat([_raw(impl)(x[i:i + 1], w, None) for i in range(m)])
    assert torch.equal(_raw(impl)(x, w, None), rows)


def test_linear_dispatch_routes(kernel):
    w = torch.randn(48, 96, dtype=torch.bfloat16)
    for x in (torch.randn(1, 96, dtype=torch.bfloat16), torch.randn(4, 96, dtype=torch.bfloat16),
              torch.randn(1, 1, 96, dtype=torch.bfloat16), torch.randn(2, 96)):
        ww = w if x.dtype == torch.bfloat16 else w.float()
        out = kernel(x, ww)
        assert out.shape == x.shape[:-1] + (48,)
        torch.testing.assert_close(out.float(), F.linear(x.float(), ww.float()), rtol=1.6e-2, atol=2e-2)


def test_op_table_has_linear():
    assert make_op(OP, "torch-native") is not None
