from __future__ import annotations

import pytest
import torch

from anycore.kernels import reference

OP = "add_rms_norm"
pytestmark = pytest.mark.arm64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows, hidden", [(1, 64), (7, 100), (3, 1000), (2, 4096), (4, 33)])
def test_add_rms_norm(kernel, tol, dtype, rows, hidden):
    x = torch.randn(rows, hidden, dtype=dtype)
    res = torch.randn(rows, hidden, dtype=dtype) * 4
    w = torch.randn(hidden, dtype=dtype)
    x_before, res_before = x.clone(), res.clone()
    normed, summed = kernel(x, res, w, 1e-6)
    ref_normed, ref_summed = reference.add_rms_norm(x, res, w, 1e-6)
    torch.testing.assert_close(summed, ref_summed, **tol(dtype))
    torch.testing.assert_close(normed, ref_normed, **tol(dtype))
    assert torch.equal(x, x_before) and torch.equal(res, res_before)  # inputs untouched
