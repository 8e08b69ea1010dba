from __future__ import annotations

import pytest
import torch

from anycore.kernels import reference

OP = "apply_rotary"
pytestmark = pytest.mark.arm64


def _tables(tokens: int, head_dim: int):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    positions = torch.randint(0, 4096, (tokens,))
    return reference.rotary_cos_sin(inv_freq, positions)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 80, 128])
@pytest.mark.parametrize("tokens, heads", [(1, 1), (5, 3), (17, 4)])
def test_rotary(kernel, tol, dtype, head_dim, tokens, heads):
    x = torch.randn(tokens, heads * head_dim, dtype=dtype)
    cos, sin = _tables(tokens, head_dim)
    out = kernel(x, cos, sin, head_dim)
    torch.testing.assert_close(out, reference.apply_rotary(x, cos, sin, head_dim), **tol(dtype))
    assert out.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rotary_on_qkv_slice(kernel, tol, dtype):
    tokens, head_dim, heads, kv_heads = 9, 64, 4, 2
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    cos, sin = _tables(tokens, head_dim)
    for part in (q, k):
        torch.testing.assert_close(kernel(part, cos, sin, head_dim),
                                   reference.apply_rotary(part, cos, sin, head_dim), **tol(dtype))
