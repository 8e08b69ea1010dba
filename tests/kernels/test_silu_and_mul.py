from __future__ import annotations

import pytest
import torch

from anycore.kernels import reference

OP = "silu_and_mul"
pytestmark = pytest.mark.arm64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows, d", [(1, 1), (3, 15), (8, 100), (2, 1032), (1, 11008)])
def test_silu_and_mul(kernel, tol, dtype, rows, d):
    x = torch.randn(rows, 2 * d, dtype=dtype) * 4
    torch.testing.assert_close(kernel(x), reference.silu_and_mul(x), **tol(dtype))


def test_silu_extremes(kernel):
    x = torch.tensor([[-100.0, -20.0, 0.0, 20.0, 100.0, 1e-3, 1.0, 2.0, 3.0, 4.0]])
    torch.testing.assert_close(kernel(x), reference.silu_and_mul(x), rtol=1e-5, atol=1e-6)
