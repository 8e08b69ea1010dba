"""Gemma's elementwise ops against transformers' own modules: Gemma3RMSNorm and the
``gelu_pytorch_tanh`` activation of its GeGLU MLP. Every implementation this host can run:
the torch ones are the same operations in the same order (bit-identical); the native kernels
sum and approximate in their own order (fp32 to ~1e-5 absolute, bf16 to about one ulp)."""

from __future__ import annotations

import pytest
import torch

from anycore.kernels.dispatch import implementations, make_op

pytestmark = pytest.mark.arm64

DT = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
TORCH_IMPLS = ("reference", "torch-native")


def _impls(op):
    return [pytest.param(name, id=name, marks=[pytest.mark.skip(reason=f"{name}: {why}")] if why else [])
            for name, why in implementations(op)]


def _check(got, want, name, dtype):
    assert got.dtype == want.dtype and got.shape == want.shape
    if name in TORCH_IMPLS:
        assert torch.equal(got, want)
    else:
        # fp32 atol: where gelu(a) is near 0 (a < -2), torch's 0.5 a (1 + tanh(u)) loses digits
        # to cancellation (its error, about 1e-6 there, depends on the platform's tanh)
        tol = {"rtol": 2e-6, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 1e-5}
        torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("name", _impls("gemma_rms_norm"))
@pytest.mark.parametrize("rows, size", [(5, 7), (1, 256), (3, 640), (2, 1000)])
def test_gemma_rms_norm_is_transformers(name, dtype, rows, size):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    norm = Gemma3RMSNorm(size, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.normal_(0, 0.5)
    x = (torch.randn(rows, size) * 3).to(dtype)
    _check(make_op("gemma_rms_norm", name)(x, norm.weight.data, 1e-6), norm(x), name, dtype)


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("name", _impls("gemma_rms_norm"))
def test_gemma_rms_norm_strided_heads(name, dtype):
    """q_norm's input: head rows cut out of a wider projection (strided rows, contiguous dim)."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    norm = Gemma3RMSNorm(64, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.normal_(0, 0.5)
    wide = (torch.randn(6, 200) * 2).to(dtype)
    x = wide[:, 30:94]
    _check(make_op("gemma_rms_norm", name)(x, norm.weight.data, 1e-6), norm(x), name, dtype)


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("name", _impls("gelu_tanh_and_mul"))
@pytest.mark.parametrize("rows, d", [(3, 37), (1, 2048), (4, 100)])
def test_gelu_tanh_and_mul_is_transformers_geglu(name, dtype, rows, d):
    from transformers.activations import ACT2FN

    x = (torch.randn(rows, 2 * d) * 2).to(dtype)
    gate, up = x[:, :d], x[:, d:]
    _check(make_op("gelu_tanh_and_mul", name)(x), ACT2FN["gelu_pytorch_tanh"](gate) * up, name, dtype)


@pytest.mark.parametrize("name", _impls("gelu_tanh_and_mul"))
def test_gelu_tanh_extremes(name):
    """Far tails (the activation is 0 or the identity) and values around the knee."""
    from transformers.activations import ACT2FN

    gate = torch.tensor([[-100.0, -20.0, -5.0, -1.0, -1e-3, 0.0, 1e-3, 0.5, 1.0, 3.0, 20.0, 100.0]])
    x = torch.cat([gate, torch.full_like(gate, 1.5)], dim=1)
    want = ACT2FN["gelu_pytorch_tanh"](gate) * 1.5
    got = make_op("gelu_tanh_and_mul", name)(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-5)
