"""Gemma's elementwise ops against transformers' own modules: Gemma3RMSNorm and the
``gelu_pytorch_tanh`` activation of its GeGLU MLP."""

from __future__ import annotations

import pytest
import torch

from anycore.kernels.dispatch import implementations, make_op

DT = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


def _impls(op):
    return [pytest.param(name, id=name) for name, why in implementations(op) if not why]


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("name", _impls("gemma_rms_norm"))
@pytest.mark.parametrize("size", [7, 256, 640])
def test_gemma_rms_norm_is_transformers(name, dtype, size):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    norm = Gemma3RMSNorm(size, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.normal_(0, 0.5)
    x = (torch.randn(5, size) * 3).to(dtype)
    got = make_op("gemma_rms_norm", name)(x, norm.weight.data, 1e-6)
    assert got.dtype == dtype
    # the same operations in the same order: bit-identical, bf16 included (cast after the scale)
    assert torch.equal(got, norm(x))


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("name", _impls("gelu_tanh_and_mul"))
def test_gelu_tanh_and_mul_is_transformers_geglu(name, dtype):
    from transformers.activations import ACT2FN

    x = (torch.randn(3, 2 * 37) * 2).to(dtype)
    gate, up = x[:, :37], x[:, 37:]
    assert torch.equal(make_op("gelu_tanh_and_mul", name)(x), ACT2FN["gelu_pytorch_tanh"](gate) * up)
