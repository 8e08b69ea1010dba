"""GGUF block linear (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K weights, int8 activations per
32-block): every implementation on this host against the reference.

The integer block sums are exact in every implementation; what may differ is the fp32 order of
the sum over blocks. So one block (K = 32) must agree to a few fp32 ulps, and longer rows to
fp32 rounding of the sum of the blocks' magnitudes. Shapes: output rows not a multiple of any
SIMD width or work chunk, K a multiple of 32 but not of 256 (K-quants: of 256, one to five
super-blocks), 1, 3, 4, 6, 7 activation rows (decode
batches, one partial 4-row tile) up to INT8_MAX_ROWS; more rows (prefill) run the dequantized
weight through F.linear. Tests marked ``arm64`` use tiny shapes:
the emulated Arm64 lane runs them for generic and dotprod.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anycore.kernels import gguf as G
from anycore.kernels.onednn import has_bf16_gemm

OP = "gguf_linear"
FORMATS = sorted(G.FILE_FORMATS)
INTERLEAVED = sorted(t for t in G.FORMATS if G.is_interleaved(t))


def random_blocks(n: int, k: int, qtype: int) -> torch.Tensor:
    """Random GGUF rows: any nibbles/int8 values and packed scales, realistic fp16 scales (and
    Q4_1 / K-quant minimums). K-quant rows: ``k`` rounded up to whole 256-weight super-blocks.
    An interleaved type: such file rows, interleaved by 16 (``n`` a multiple of 16)."""
    if G.is_interleaved(qtype):
        return G.interleave16(random_blocks(n, k, G.file_type(qtype)), G.file_type(qtype))
    bb = G.block_bytes(qtype)
    nb = -(-k // G.block_elems(qtype))
    raw = torch.randint(0, 256, (n, nb, bb), dtype=torch.uint8)
    d = (torch.rand(n, nb) * 0.02 + 1e-4).half().view(torch.uint8).reshape(n, nb, 2)
    if qtype == G.Q6_K:
        raw[..., 208:210] = (torch.rand(n, nb) * 0.002 + 1e-5).half().view(torch.uint8).reshape(n, nb, 2)
    elif qtype in (G.Q4_K, G.Q5_K):  # d and dmin multiply 6-bit scales and minimums
        raw[..., 0:2] = (torch.rand(n, nb) * 0.001 + 1e-5).half().view(torch.uint8).reshape(n, nb, 2)
        raw[..., 2:4] = (torch.rand(n, nb) * 0.002).half().view(torch.uint8).reshape(n, nb, 2)
    else:
        raw[..., 0:2] = d
    if qtype == G.Q4_1:
        raw[..., 2:4] = (torch.randn(n, nb) * 0.05).half().view(torch.uint8).reshape(n, nb, 2)
    return raw.reshape(n, nb * bb)


def kshape(k: int, qtype: int) -> int:
    """K as random_blocks makes it for ``qtype``."""
    e = G.block_elems(qtype)
    return -(-k // e) * e


def magnitude(x: torch.Tensor, qweight: torch.Tensor, qtype: int) -> torch.Tensor:
    """Per output, the sum over blocks of |block term|: what the fp32 rounding scales with."""
    qx, dx, sx = G.quantize_activations(x.float())
    q, dw, mw = G.decode_blocks(qweight, qtype)
    qxh, qh = qx.reshape(*qx.shape[:2], 2, 16), q.reshape(*q.shape[:2], 2, 16)
    isum = torch.einsum("mbhk,nbhk->mnbh", qxh.double(), qh.double())
    scaled = (isum * dw.double()[None] * dx.double()[:, None, :, None]).abs().sum(-1)
    return (scaled + (sx.double()[:, None] * mw.double()[None]).abs()).sum(-1)


def check(kernel, m: int, n: int, k: int, qtype: int, dtype: torch.dtype, bias: bool) -> None:
    w, k = random_blocks(n, k, qtype), kshape(k, qtype)
    x = (torch.randn(m, k) * 2).to(dtype)
    b = torch.randn(n).to(dtype) if bias else None
    out = kernel(x, w, qtype, b)
    ref = G.gguf_linear_reference(x, w, qtype, b)
    assert out.shape == (m, n) and out.dtype == dtype
    exact = G.gguf_linear_reference(x.double(), w, qtype, None if b is None else b.double())
    bound = magnitude(x, w, qtype) + (b.double().abs() if b is not None else 0)
    if dtype == torch.float32:
        err = (out.double() - exact).abs()
        assert (err <= 4 * 2.0**-23 * (bound + 1e-30) * max(1, k // G.BLOCK)).all(), float((err / bound).max())
    else:  # the fp32 result rounded to bf16: within one bf16 rounding of the reference's
        torch.testing.assert_close(out.float(), ref.float(), rtol=2**-7, atol=2**-7 * float(bound.max()) * 1e-3)


@pytest.mark.arm64
@pytest.mark.parametrize("qtype", FORMATS, ids=[G.FORMATS[t][0] for t in FORMATS])
@pytest.mark.parametrize("m, n, k", [(1, 1, 32), (2, 5, 64), (3, 17, 96)])
def test_tiny(kernel, qtype, m, n, k):
    check(kernel, m, n, k, qtype, torch.float32, bias=True)


@pytest.mark.parametrize("qtype", FORMATS, ids=[G.FORMATS[t][0] for t in FORMATS])
@pytest.mark.parametrize("m", [1, 3, 4, 6, 7])
@pytest.mark.parametrize("n, k", [(1, 32), (19, 320), (100, 576)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_matches_reference(kernel, qtype, m, n, k, dtype):
    check(kernel, m, n, k, qtype, dtype, bias=m % 2 == 1)


@pytest.mark.parametrize("qtype", FORMATS, ids=[G.FORMATS[t][0] for t in FORMATS])
def test_int8_rows_up_to_the_limit(kernel, qtype):
    """Four 4-row tiles; a long row (48 blocks); output rows over many chunks."""
    check(kernel, G.INT8_MAX_ROWS, 131, 1536, qtype, torch.float32, bias=True)


def _dense_expected(x, w, qtype, b=None):
    """F.linear on the blocks dequantized to x's dtype; for bf16 where oneDNN has no bf16 GEMM
    (AVX2-only x86), the fp32 one on the blocks dequantized to fp32, rounded to bf16."""
    if x.dtype is torch.bfloat16 and not has_bf16_gemm():
        y = torch.nn.functional.linear(x.float(), G.dequantize(w, qtype, torch.float32), None if b is None else b.float())
        return y.to(x.dtype)
    return torch.nn.functional.linear(x, G.dequantize(w, qtype, x.dtype), b)


@pytest.mark.parametrize("qtype", FORMATS, ids=[G.FORMATS[t][0] for t in FORMATS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_prefill_rows_run_the_dequantized_weight(kernel, qtype, dtype):
    """More than INT8_MAX_ROWS rows: F.linear on the blocks dequantized to x's dtype, or for
    bf16 where oneDNN has no bf16 GEMM (AVX2-only x86), to fp32 with the result rounded."""
    w = random_blocks(37, 320, qtype)
    x = torch.randn(G.INT8_MAX_ROWS + 1, kshape(320, qtype)).to(dtype)
    b = torch.randn(37).to(dtype)
    expected = _dense_expected(x, w, qtype, b)
    torch.testing.assert_close(kernel(x, w, qtype, b), expected)
    torch.testing.assert_close(G.gguf_linear_reference(x, w, qtype, b), expected)


@pytest.mark.parametrize("qtype", FORMATS, ids=[G.FORMATS[t][0] for t in FORMATS])
def test_leading_dims_and_empty_rows(kernel, qtype):
    w, k = random_blocks(9, 64, qtype), kshape(64, qtype)
    x = torch.randn(2, 3, k)
    torch.testing.assert_close(kernel(x, w, qtype), G.gguf_linear_reference(x, w, qtype))
    assert kernel(torch.randn(0, k), w, qtype).shape == (0, 9)


def test_one_block_is_exact_per_block_scale():
    """K = 32: y = dw * dx * isum + mw * sx, with isum the exact integer dot product."""
    w = random_blocks(7, 32, G.Q4_1)
    x = torch.randn(3, 32)
    qx, dx, sx = G.quantize_activations(x)
    q, dw, mw = G.decode_blocks(w, G.Q4_1)
    isum = (qx.long()[:, None, 0, :] * q.long()[None, :, 0, :]).sum(-1)
    expected = isum.double() * dw[None, :, 0, 0].double() * dx[:, None, 0].double() + sx[:, None, 0].double() * mw[None, :, 0].double()
    torch.testing.assert_close(G.gguf_linear_reference(x.double(), w, G.Q4_1), expected)


def test_activation_quantization_is_within_half_a_step():
    x = torch.randn(5, 96) * 3
    x[0, :32] = 0  # an all-zero block quantizes to zeros
    qx, dx, sx = G.quantize_activations(x)
    back = qx.float() * dx[..., None]
    assert ((back - x.reshape(5, 3, 32)).abs() <= dx[..., None] / 2 + 1e-7).all()
    assert qx[0, 0].eq(0).all() and sx[0, 0] == 0
    torch.testing.assert_close(sx, dx * qx.float().sum(-1))


@pytest.mark.parametrize("qtype", FORMATS, ids=[G.FORMATS[t][0] for t in FORMATS])
def test_dequantize_matches_the_gguf_package(qtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    w = random_blocks(6, 96, qtype)  # (K-quants: one super-block, 256)
    expected = dequantize(w.numpy(), GGMLQuantizationType(qtype))
    np.testing.assert_array_equal(G.dequantize(w, qtype).numpy(), expected.astype(np.float32))


def test_bad_arguments_are_errors():
    w = random_blocks(4, 64, G.Q4_0)
    with pytest.raises(ValueError, match="unsupported GGUF block type"):
        G.in_features(w, 10)  # Q2_K: no kernel
    with pytest.raises(ValueError, match="uint8"):
        G.in_features(w[:, :-1], G.Q4_0)
    with pytest.raises(ValueError, match="features"):
        G.gguf_linear_reference(torch.randn(1, 32), w, G.Q4_0)


def test_q6k_halves_take_their_own_scales():
    """Q6_K's one int8 scale per 16 weights: a super-block whose odd 16-halves are scaled by 0
    contributes only its even halves' products."""
    w = random_blocks(3, 256, G.Q6_K)
    w.reshape(3, 210)[:, 193:208:2] = 0  # scales 1, 3, ..., 15
    x = torch.randn(2, 256)
    qx, dx, _ = G.quantize_activations(x)
    q, dw, _ = G.decode_blocks(w, G.Q6_K)
    even = (qx.long()[:, None, :, :16] * q.long()[None, :, :, :16]).sum(-1)  # [m, n, 8]
    expected = (even.double() * dw[None, :, :, 0].double() * dx[:, None, :].double()).sum(-1)
    torch.testing.assert_close(G.gguf_linear_reference(x.double(), w, G.Q6_K), expected)


# The 16-row interleaved layout (G.interleave16): every implementation runs it, a variant with a
# micro-kernel for that type's (variant_kernels lists "gguf_interleaved16_q4_1", ...) with that one. Rows: 1 and 8
# (one pass of a group), 9 (a second partial pass), 16; output rows one group and several.
@pytest.mark.arm64
@pytest.mark.parametrize("qtype", INTERLEAVED, ids=[G.FORMATS[t][0] + "x16" for t in INTERLEAVED])
@pytest.mark.parametrize("m, n, k", [(1, 16, 32), (3, 32, 64)])
def test_interleaved_tiny(kernel, qtype, m, n, k):
    check(kernel, m, n, k, qtype, torch.float32, bias=True)


@pytest.mark.parametrize("qtype", INTERLEAVED, ids=[G.FORMATS[t][0] + "x16" for t in INTERLEAVED])
@pytest.mark.parametrize("m", [1, 8, 9, 16])
@pytest.mark.parametrize("n, k", [(16, 32), (48, 320), (112, 576)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_interleaved_matches_reference(kernel, qtype, m, n, k, dtype):
    check(kernel, m, n, k, qtype, dtype, bias=m % 2 == 1)


@pytest.mark.parametrize("qtype", INTERLEAVED, ids=[G.FORMATS[t][0] + "x16" for t in INTERLEAVED])
def test_interleaved_rows_do_not_depend_on_the_batch(kernel, impl, qtype):
    """A native kernel gives each activation row the same bits alone or among the most rows the int8 tiles take."""
    if impl in ("reference", "torch-native"):
        pytest.skip("batch invariance is the native kernels' promise")
    w = random_blocks(64, 576, qtype)
    x = torch.randn(G.INT8_MAX_ROWS, 576)
    together = kernel(x, w, qtype)
    for r in (0, 7, 8, 15):
        assert torch.equal(kernel(x[r : r + 1], w, qtype)[0], together[r])


@pytest.mark.parametrize("qtype", sorted(G.FILE_FORMATS), ids=[G.FILE_FORMATS[t][0] for t in sorted(G.FILE_FORMATS)])
def test_interleaving_keeps_the_bytes(qtype):
    w = random_blocks(48, 96 if qtype not in (G.Q4_K, G.Q5_K, G.Q6_K) else 256, qtype)
    if not G.can_interleave(qtype, 48):
        assert qtype not in (G.Q4_0, G.Q4_1, G.Q8_0)
        with pytest.raises(ValueError, match="interleave"):
            G.interleave16(w, qtype)
        return
    x16 = G.interleave16(w, qtype)
    assert x16.shape == w.shape and not torch.equal(x16, w)
    assert x16._base is None  # owns its storage: the weight arena's move frees the old bytes
    assert torch.equal(G.deinterleave16(x16, G.X16 + qtype), w)
    assert torch.equal(G.dequantize(x16, G.X16 + qtype), G.dequantize(w, qtype))
    ids = torch.tensor([0, 17, 47, 5, 5, 16])
    assert torch.equal(G.gather_rows(x16, G.X16 + qtype, ids), w[ids])
    assert not G.can_interleave(qtype, 40)  # not whole groups


@pytest.mark.parametrize("qtype", INTERLEAVED, ids=[G.FORMATS[t][0] + "x16" for t in INTERLEAVED])
def test_interleaved_prefill_rows_run_the_dequantized_weight(kernel, qtype):
    """Dequantizing the interleaved tiles gives the file rows' bits: the same F.linear result."""
    w = random_blocks(48, 320, qtype)
    x = torch.randn(G.INT8_MAX_ROWS + 1, 320).to(torch.bfloat16)
    torch.testing.assert_close(kernel(x, w, qtype), _dense_expected(x, w, qtype))
    file_rows = G.deinterleave16(w, qtype)
    assert torch.equal(kernel(x, w, qtype), kernel(x, file_rows, G.file_type(qtype)))


def test_interleaved_needs_whole_groups():
    from anycore.kernels.dispatch import load_extension

    if not load_extension().available:
        pytest.skip("extension unavailable")
    w = random_blocks(32, 64, G.X16 + G.Q4_1)[:24]
    with pytest.raises(RuntimeError, match="groups of 16 rows"):
        torch.ops.anycore.gguf_linear(torch.randn(1, 64), w, G.X16 + G.Q4_1, None, 0)


@pytest.mark.parametrize("qtype", FORMATS + INTERLEAVED, ids=[G.FORMATS[t][0] for t in FORMATS + INTERLEAVED])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_embedding_rows_equal_the_torch_lookup(impl, qtype, dtype):
    """The native lookup of a GGUF table (VocabEmbedding, on gguf_linear's variant): the rows the
    torch form gives (blocks gathered, dequantized in fp32, then the dtype), bit for bit, in any
    order, repeated, in both layouts."""
    from anycore.kernels.build import load_extension
    from anycore.kernels.dispatch import _bind_gguf_embedding
    from anycore.platform.selection import REFERENCE, TORCH_NATIVE

    if impl in (REFERENCE, TORCH_NATIVE):
        pytest.skip("a native lookup only")
    w = random_blocks(48, 320, qtype)
    ids = torch.tensor([47, 0, 5, 5, 16, 31, 17, 2])
    lookup = _bind_gguf_embedding(load_extension().variants.index(impl))
    expected = G.dequantize(G.gather_rows(w, qtype, ids), G.file_type(qtype)).to(dtype)
    got = lookup(w, qtype, ids, dtype)
    assert got.dtype == dtype and torch.equal(got, expected)
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        lookup(w, qtype, torch.tensor([48]), dtype)


def test_the_int8_row_limit_is_one_rule():
    """The extension's int8/dense row limit is gguf.int8_max_rows's for this CPU, which the
    reference and torch-native forms follow: otherwise the oracle would check the wrong path."""
    from anycore.kernels.dispatch import load_extension
    from anycore.platform.features import CpuFeatures, detect

    assert G.int8_max_rows(CpuFeatures("x86_64", frozenset({"avx512f", "avx512_vnni"}))) == 256
    assert G.int8_max_rows(CpuFeatures("x86_64", frozenset({"avx512f", "amx_tile", "amx_bf16"}))) == 16
    assert G.int8_max_rows(CpuFeatures("aarch64", frozenset({"asimd", "asimddp"}))) == 16
    assert G.INT8_MAX_ROWS == G.int8_max_rows(detect())
    if not load_extension().available:
        pytest.skip("extension unavailable")
    assert torch.ops.anycore.gguf_int8_max_rows() == G.INT8_MAX_ROWS
