from __future__ import annotations

import pytest
import torch

from anycore.kernels import reference

OP = "rms_norm"
pytestmark = pytest.mark.arm64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows, hidden", [(1, 64), (7, 100), (3, 1000), (2, 4096), (5, 17)])
def test_rms_norm(kernel, tol, dtype, rows, hidden):
    x = torch.randn(rows, hidden, dtype=dtype) * 3
    w = torch.randn(hidden, dtype=dtype)
    torch.testing.assert_close(kernel(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rms_norm_strided_rows(kernel, tol, dtype):
    wide = torch.randn(6, 300, dtype=dtype)
    x = wide[:, 40:240]  # a column slice: rows are strided, the last dim is contiguous
    w = torch.rand(200, dtype=dtype) + 0.5
    torch.testing.assert_close(kernel(x, w, 1e-5), reference.rms_norm(x, w, 1e-5), **tol(dtype))
