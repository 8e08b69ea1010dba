"""W8A8 INT8 linear: every implementation on this host against the reference.

The int32 accumulator must be exact (checked through each implementation's ``acc`` debug
entry); the scaled output must match ``w8a8_linear_reference`` (same fp32 roundings, so fp32
is bit-exact in practice and asserted to a tight tolerance). Tests marked ``arm64`` use tiny
shapes: the emulated Arm64 lane runs them for generic, dotprod and i8mm.
"""

from __future__ import annotations

import pytest
import torch

from anycore.kernels.dispatch import make_op
from anycore.kernels.int8 import (
    Int8Linear,
    quantize_per_token,
    quantize_weight_per_channel,
    w8a8_linear_reference,
)

OP = "w8a8_linear"

TINY = [(1, 5, 3), (2, 37, 19), (3, 64, 16), (5, 100, 33)]  # (M, K, N): odd K and N, one full panel
ODD_KN = [(37, 19), (100, 33), (577, 130)]  # K not a multiple of 4/8/64, N not of 16
ROWS = [1, 2, 3, 17, 64, 130]


def _qweight(n: int, k: int) -> torch.Tensor:
    return torch.randint(-127, 128, (n, k), dtype=torch.int8)


def _shapes():
    out = [pytest.param(m, k, n, marks=pytest.mark.arm64, id=f"{m}x{k}x{n}") for m, k, n in TINY]
    out += [pytest.param(m, k, n, id=f"{m}x{k}x{n}") for k, n in ODD_KN for m in ROWS]
    return out


def test_kernel_is_an_int8_linear(kernel):
    assert isinstance(kernel, Int8Linear)


@pytest.mark.arm64
@pytest.mark.parametrize("n, k", [(1, 1), (3, 5), (16, 64), (19, 37), (33, 130)])
def test_pack_unpack_round_trip(kernel, n, k):
    qw = _qweight(n, k)
    packed = kernel.pack(qw)
    assert packed.dtype == torch.int8
    assert torch.equal(kernel.unpack(packed, n, k), qw)


@pytest.mark.arm64
@pytest.mark.parametrize("n, k", [(1, 1), (19, 37), (33, 130)])
def test_unpack_selected_rows(kernel, n, k):
    """Any rows, in any order and repeated: how a tied int8 head serves embedding lookups."""
    qw = _qweight(n, k)
    packed = kernel.pack(qw)
    rows = torch.tensor([n - 1, 0, n // 2, n - 1, 0])
    assert torch.equal(kernel.unpack(packed, n, k, rows), qw[rows])
    assert kernel.unpack(packed, n, k, torch.tensor([], dtype=torch.long)).shape == (0, k)


@pytest.mark.parametrize("m, k, n", _shapes())
def test_int32_accumulator_is_exact(kernel, m, k, n):
    qw = _qweight(n, k)
    xq = torch.randint(-127, 128, (m, k), dtype=torch.int8)
    xq[0, : min(k, 8)] = 127  # extremes: the u8-offset path's largest terms
    qw[0, : min(k, 8)] = -127
    acc = kernel.acc(xq, kernel.pack(qw), n)
    assert acc.dtype == torch.int32 and acc.shape == (m, n)
    assert torch.equal(acc.long(), xq.long() @ qw.long().t())


@pytest.mark.arm64
def test_accumulator_long_k(kernel):
    """K large enough that every int32 accumulator chain takes many steps (and the worst case)."""
    k = 4096 + 12
    qw = torch.full((17, k), -127, dtype=torch.int8)
    xq = torch.full((2, k), 127, dtype=torch.int8)
    xq[1] = -127
    acc = kernel.acc(xq, kernel.pack(qw), 17)
    assert torch.equal(acc.long(), xq.long() @ qw.long().t())


@pytest.mark.parametrize("m, k, n", _shapes())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_matches_reference(kernel, m, k, n, dtype, with_bias):
    x = torch.randn(m, k).to(dtype)
    qw, ws = quantize_weight_per_channel(torch.randn(n, k))
    bias = torch.randn(n).to(dtype) if with_bias else None
    ref = w8a8_linear_reference(x, qw, ws, bias)
    out = kernel(x, kernel.pack(qw), ws, bias)
    assert out.dtype == dtype and out.shape == (m, n)
    # same quantization and fp32 epilogue order as the reference: at most an ulp apart
    tol = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 1e-5}
    torch.testing.assert_close(out, ref, **tol)


@pytest.mark.arm64
def test_quantization_rounds_like_torch(kernel):
    """Activations on exact .5 quantization steps (round half to even) and a zero row."""
    k, n = 24, 16
    qw = torch.eye(n, k, dtype=torch.int8)  # y[:, j] = xq[:, j] * x_scale
    ws = torch.ones(n)
    x = torch.zeros(3, k)
    x[0, :] = torch.arange(k) - 11.5  # amax 12.5 -> x / scale hits many *.5 multiples
    x[0, -1] = 127.0
    x[1, :8] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 127.0])
    ref = w8a8_linear_reference(x, qw, ws)
    out = kernel(x, kernel.pack(qw), ws)
    assert torch.equal(out, ref)
    xq, _ = quantize_per_token(x)
    assert torch.equal(kernel.acc(xq, kernel.pack(qw), n), xq[:, :n].int())
    assert torch.equal(out[2], torch.zeros(n))


@pytest.mark.arm64
def test_batched_strided_and_other_dtypes(kernel):
    k, n = 40, 20
    qw, ws = quantize_weight_per_channel(torch.randn(n, k))
    packed = kernel.pack(qw)
    x3 = torch.randn(2, 3, k)
    out = kernel(x3, packed, ws)
    assert out.shape == (2, 3, n)
    torch.testing.assert_close(out.reshape(6, n), w8a8_linear_reference(x3.reshape(6, k), qw, ws))
    wide = torch.randn(4, 2 * k)
    strided = wide[:, :k]  # rows not contiguous with each other
    torch.testing.assert_close(kernel(strided, packed, ws), w8a8_linear_reference(strided.contiguous(), qw, ws))
    half = torch.randn(3, k).half()
    out = kernel(half, packed, ws)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), w8a8_linear_reference(half.float(), qw, ws), rtol=2e-3, atol=2e-3)


def test_wrong_packed_weight_is_refused(kernel, impl):
    if impl in ("torch-native", "reference"):
        pytest.skip("python implementations do not check the layout")
    qw, ws = quantize_weight_per_channel(torch.randn(32, 64))
    packed = kernel.pack(qw)
    with pytest.raises(RuntimeError, match="packed int8 weight"):
        kernel(torch.randn(1, 64), packed[:-16], ws)
    with pytest.raises(RuntimeError, match="packed int8 weight"):
        kernel(torch.randn(1, 200), packed, ws)  # another K: another packed size in every layout


@pytest.mark.parametrize("m, k, n", [(1, 576, 960), (1, 37, 19), (3, 100, 33), (7, 64, 130), (40, 577, 70)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_same_bits_as_generic(kernel, impl, m, k, n, dtype):
    """Variants with their own (vectorised) epilogue keep the portable one's arithmetic exactly:
    same quantized activations and int32 sums, so the outputs must be bit-identical."""
    if impl in ("torch-native", "reference", "generic"):
        pytest.skip("compares native variants with generic")
    generic = make_op(OP, "generic")
    x = (torch.randn(m, k) * 3).to(dtype)
    qw, ws = quantize_weight_per_channel(torch.randn(n, k))
    for bias in (None, torch.randn(n).to(dtype)):
        got = kernel(x, kernel.pack(qw), ws, bias)
        want = generic(x, generic.pack(qw), ws, bias)
        assert torch.equal(got, want)
    xq, _ = quantize_per_token(x.float())
    assert torch.equal(kernel.acc(xq, kernel.pack(qw), n), generic.acc(xq, generic.pack(qw), n))
