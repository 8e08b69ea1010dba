"""GGUF block-quantized linear: weights kept as the file's own blocks, int8 activations.

Weight formats (ggml's block layouts, one output row = ``K / 32`` consecutive blocks, so a
weight is ``uint8 [N, K / 32 * block_bytes]``: the tensor's bytes exactly as the file stores
them, rows permuted at most):

- ``Q4_0`` (ggml type 2), 18 bytes: fp16 ``d``, 16 bytes of nibbles; ``w = d * (q - 8)``
- ``Q4_1`` (type 3), 20 bytes: fp16 ``d``, fp16 ``m``, 16 bytes of nibbles; ``w = d * q + m``
- ``Q5_0`` (type 6), 22 bytes: fp16 ``d``, uint32 ``qh`` (bit ``e``: element ``e``'s fifth bit),
  16 bytes of nibbles; ``w = d * (q - 16)``
- ``Q8_0`` (type 8), 34 bytes: fp16 ``d``, 32 int8 ``q``; ``w = d * q``
- ``Q4_K``, ``Q5_K``, ``Q6_K`` (types 12, 13, 14): 256-weight super-blocks of 144, 176 and 210
  bytes (anycore/kernels/gguf_kquants.py), eight 32-weight sub-blocks each with its own scale (and
  minimum; Q6_K: one int8 scale per 16 weights)

Nibbles: byte ``j`` holds element ``j`` in its low 4 bits and element ``j + 16`` in its high 4.

Interleaved by 16 rows (type ``X16 + t`` for ``t`` in Q4_0, Q4_1, Q8_0; ``interleave16``): the
same bytes regrouped so that a 512-bit register holds the same 4 weights of 16 rows. Rows come in
groups of 16; a group is ``K / 32`` tiles, tile ``b`` the 16 rows' block ``b``: their 16 fp16
``d``, (Q4_1) their 16 fp16 ``m``, then 64-byte chunks ``c`` (4 for Q4, 8 for Q8_0) whose bytes
``4 l .. 4 l + 3`` are row ``l``'s quant bytes ``4 c .. 4 c + 3`` (Q8_0's int8 ``q`` stored as
``q + 128``). The load step chooses it for a weight when the bound ``gguf_linear`` variant has a
micro-kernel for it (``prefers_interleaved``); every implementation runs both layouts.
Every format is ``w = dw * q + mw`` per 32-block, ``dw`` taken per half of 16 (the halves' scales
differ only in Q6_K; Q4_0: ``mw = -8 dw``; Q5_0: ``-16 dw``; Q8_0, Q6_K: ``mw = 0``, ``q`` signed).

Activations are quantized per 32-block (llama.cpp's Q8_1 idea): ``dx = max(|x|, 1e-12) / 127``,
``qx = round_half_even(x / dx)``, and ``sx = dx * sum(qx)``. Then one output is

    y = sum over blocks and halves of  dw * dx * sum(q * qx)  +  sum over blocks of  mw * sx

with ``sum(q * qx)`` exact in int32: that is what every implementation computes (the float
order of the sum over blocks differs, so results agree to float rounding, not bit for bit).

That is for at most ``INT8_MAX_ROWS`` activation rows (decode, batches, the extend of a prompt
whose prefix is cached). More rows (prefill chunks) take the simpler path: the blocks
dequantized to the activation dtype, then a float GEMM (``F.linear``; oneDNN). Where the
crossover lies depends on that GEMM (``int8_max_rows``): on a 2-core AMD EPYC (Zen 4, AVX-512
VNNI/BF16, no AMX), SmolLM2 Q4_1 shapes, 2 threads, bf16 activations, the int8 tiles beat
dequantize + bf16 GEMM at every row count up to 256 (3072 x 576: 163 vs 467 us at 17 rows, 667
vs 1057 at 64, 2077 vs 2590 at 256) and tie at 512, so there they run up to 256 rows. With
AMX-BF16 oneDNN's GEMM is several times faster and the old limit of 16 rows stays (not
re-measured); on Arm too (not measured). Where oneDNN has no bf16 GEMM (AVX2-only x86), bf16
activations take the fp32 one: the blocks dequantized to fp32 (exactly), the result rounded
to bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from anycore.kernels import gguf_kquants as K
from anycore.kernels.onednn import has_bf16_gemm
from anycore.platform.features import CpuFeatures, detect

BLOCK = 32


def int8_max_rows(features: CpuFeatures) -> int:
    """Activation rows up to which ``gguf_linear`` runs the int8 block tiles on this CPU (more:
    dequantize + float GEMM; see the module docstring for the measurements behind it)."""
    if features.arch == "x86_64" and not features.has("amx_bf16"):
        return 256
    return 16


# this process's rule: the reference and torch-native forms read it, the extension applies the same
# rule itself (csrc/common/ops.h gguf_int8_max_rows; tests/kernels/test_gguf_linear.py checks they agree)
INT8_MAX_ROWS = int8_max_rows(detect())
Q4_0, Q4_1, Q5_0, Q8_0 = 2, 3, 6, 8
Q4_K, Q5_K, Q6_K = K.Q4_K, K.Q5_K, K.Q6_K
# ggml type id -> (name, bytes per block, weights per block)
FILE_FORMATS: dict[int, tuple[str, int, int]] = {
    Q4_0: ("Q4_0", 18, 32), Q4_1: ("Q4_1", 20, 32), Q5_0: ("Q5_0", 22, 32), Q8_0: ("Q8_0", 34, 32),
    Q4_K: ("Q4_K", 144, 256), Q5_K: ("Q5_K", 176, 256), Q6_K: ("Q6_K", 210, 256),
}
X16 = 100  # + a file type: its 16-row interleaved layout (csrc/common/kernel_table.h kGgufX16)
GROUP = 16
_X16_QUANTS = {Q4_0: (32, 4), Q4_1: (64, 4), Q8_0: (32, 8)}  # offset of the quant chunks in a tile, chunks
# every layout the kernels take: the file's, and the interleaved forms (same name and sizes)
FORMATS: dict[int, tuple[str, int, int]] = {**FILE_FORMATS, **{X16 + t: FILE_FORMATS[t] for t in _X16_QUANTS}}
# rows of activations one call of the torch-native path handles at once (bounds its [M, N, blocks]
# temporary)
_TORCH_ROWS = 16


def block_bytes(qtype: int) -> int:
    if qtype not in FORMATS:
        raise ValueError(f"unsupported GGUF block type {qtype} (supported: "
                         f"{', '.join(f'{n} ({t})' for t, (n, *_) in FORMATS.items())})")
    return FORMATS[qtype][1]


def block_elems(qtype: int) -> int:
    block_bytes(qtype)
    return FORMATS[qtype][2]


def in_features(qweight: torch.Tensor, qtype: int) -> int:
    """K of a block weight ``uint8 [N, K / block_elems * block_bytes]``."""
    bb = block_bytes(qtype)
    if qweight.dim() != 2 or qweight.dtype != torch.uint8 or qweight.shape[1] % bb:
        raise ValueError(f"a {FORMATS[qtype][0]} weight is uint8 [N, blocks * {bb}]; got "
                         f"{qweight.dtype} {tuple(qweight.shape)}")
    return qweight.shape[1] // bb * block_elems(qtype)


def file_type(qtype: int) -> int:
    """The file's block type of a layout (itself, or what an interleaved layout regroups)."""
    return qtype - X16 if qtype >= X16 else qtype


def is_interleaved(qtype: int) -> bool:
    return qtype >= X16


def can_interleave(qtype: int, rows: int) -> bool:
    return qtype in _X16_QUANTS and rows % GROUP == 0


def interleave16(qweight: torch.Tensor, qtype: int) -> torch.Tensor:
    """File blocks ``[N, row bytes]`` (Q4_0, Q4_1 or Q8_0, ``N % 16 == 0``) -> the same bytes
    interleaved by 16 rows (type ``X16 + qtype``), shape unchanged."""
    if not can_interleave(qtype, qweight.shape[0]):
        raise ValueError(f"only Q4_0/Q4_1/Q8_0 weights of whole 16-row groups interleave; got type {qtype}, "
                         f"{qweight.shape[0]} rows")
    n, bb = qweight.shape[0], block_bytes(qtype)
    start, chunks = _X16_QUANTS[qtype]
    scales = start // 32  # fp16 scales per row and block: d, (Q4_1) m
    blocks = qweight.reshape(n // GROUP, GROUP, -1, bb)  # [g, lane, b, bytes]
    heads = blocks[..., : 2 * scales].reshape(n // GROUP, GROUP, -1, scales, 2).permute(0, 2, 3, 1, 4)
    quants = blocks[..., bb - 4 * chunks:]
    if qtype == Q8_0:
        quants = quants ^ 0x80  # int8 q -> q + 128, unsigned
    quants = quants.reshape(n // GROUP, GROUP, -1, chunks, 4).permute(0, 2, 3, 1, 4)  # [g, b, c, lane, 4]
    nb = blocks.shape[2]
    # written into a tensor of the final shape: a view of the concatenation would keep it as its
    # base, so moving the weight (anycore/engine/weight_arena.py) would leave a second copy alive
    out = torch.empty_like(qweight)
    torch.cat([heads.reshape(n // GROUP, nb, -1), quants.reshape(n // GROUP, nb, -1)], dim=-1,
              out=out.view(n // GROUP, nb, -1))
    return out


def deinterleave16(qweight: torch.Tensor, qtype: int) -> torch.Tensor:
    """The inverse of ``interleave16``: an interleaved weight (type ``X16 + t``) -> type ``t``'s file blocks."""
    base = file_type(qtype)
    n, bb = qweight.shape[0], block_bytes(base)
    start, chunks = _X16_QUANTS[base]
    scales = start // 32
    tiles = qweight.reshape(n // GROUP, -1, GROUP * bb)  # [g, b, tile bytes]
    nb = tiles.shape[1]
    heads = tiles[..., : 2 * scales * GROUP].reshape(n // GROUP, nb, scales, GROUP, 2).permute(0, 3, 1, 2, 4)
    quants = tiles[..., 2 * scales * GROUP:].reshape(n // GROUP, nb, chunks, GROUP, 4).permute(0, 3, 1, 2, 4)
    if base == Q8_0:
        quants = quants ^ 0x80
    out = torch.empty_like(qweight)
    torch.cat([heads.reshape(n // GROUP, GROUP, nb, -1), quants.reshape(n // GROUP, GROUP, nb, -1)], dim=-1,
              out=out.view(n // GROUP, GROUP, nb, -1))
    return out


def gather_rows(qweight: torch.Tensor, qtype: int, rows: torch.Tensor) -> torch.Tensor:
    """File blocks of the given rows (int64 ids) of a weight in either layout."""
    if not is_interleaved(qtype):
        return qweight.index_select(0, rows)
    n = qweight.shape[0]
    groups = qweight.reshape(n // GROUP, -1).index_select(0, rows // GROUP)  # each row's whole group
    plain = deinterleave16(groups.reshape(-1, qweight.shape[1]), qtype).reshape(rows.numel(), GROUP, -1)
    return plain[torch.arange(rows.numel()), rows % GROUP]


def decode_blocks(qweight: torch.Tensor, qtype: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q [N, nb, 32] int16, dw [N, nb, 2] fp32, mw [N, nb] fp32)`` per 32-block ``nb``, with
    ``w = dw[half] * q + mw`` (half = element // 16)."""
    if is_interleaved(qtype):
        qweight, qtype = deinterleave16(qweight, qtype), file_type(qtype)
    if block_elems(qtype) != BLOCK:
        return K.decode(qweight, qtype)
    bb = block_bytes(qtype)
    n = qweight.shape[0]
    blocks = qweight.reshape(n, -1, bb)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1).float()
    dw = d[..., None].expand(*d.shape, 2)
    if qtype == Q8_0:
        q = blocks[..., 2:].contiguous().view(torch.int8).to(torch.int16)
        return q, dw, torch.zeros_like(d)
    start = {Q4_0: 2, Q4_1: 4, Q5_0: 6}[qtype]
    nibbles = blocks[..., start:].to(torch.int16)
    q = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1)
    if qtype == Q4_0:
        return q, dw, -8.0 * d
    if qtype == Q5_0:  # the fifth bits: bit e of the little-endian uint32 qh is element e's
        qh = blocks[..., 2:6].to(torch.int64)
        qh = qh[..., 0] | (qh[..., 1] << 8) | (qh[..., 2] << 16) | (qh[..., 3] << 24)
        bits = (qh[..., None] >> torch.arange(32)) & 1
        return q | (bits.to(torch.int16) << 4), dw, -16.0 * d
    m = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).float()
    return q, dw, m


def dequantize(qweight: torch.Tensor, qtype: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight ``[N, K]`` (what loading without native blocks would have produced)."""
    q, dw, mw = decode_blocks(qweight, qtype)
    dw32 = dw.repeat_interleave(BLOCK // 2, dim=-1)
    return (q.float() * dw32 + mw[..., None]).reshape(qweight.shape[0], -1).to(dtype)


# formats that re-encode losslessly as Q8_0 (the same fp16 d, the offset folded into int8 q)
_AS_Q8_0 = {Q4_0: 8, Q5_0: 16, Q8_0: 0}


def as_q8_0(qweight: torch.Tensor, qtype: int) -> torch.Tensor | None:
    """Q4_0 / Q5_0 blocks rewritten as the Q8_0 blocks of the same weights (``w = d * (q - 8)``
    is ``d * q8`` with ``q8 = q - 8``: exact); None for a format that has no such form. Lets a
    merged projection whose shards mix these types (Gemma 3's Q5_0 q/k with a Q8_0 v) stay blocks."""
    if qtype not in _AS_Q8_0:
        return None
    if qtype == Q8_0:
        return qweight
    n = qweight.shape[0]
    blocks = qweight.reshape(n, -1, block_bytes(qtype))
    q, _, _ = decode_blocks(qweight, qtype)
    q8 = (q - _AS_Q8_0[qtype]).to(torch.int8).view(torch.uint8)
    return torch.cat([blocks[..., 0:2], q8], dim=-1).reshape(n, -1)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> ``(qx [M, nb, 32] int8, dx [M, nb] fp32, sx [M, nb] fp32)`` per 32-block."""
    xb = x.float().reshape(x.shape[0], -1, BLOCK)
    dx = xb.abs().amax(dim=-1).clamp(min=1e-12) / 127.0
    qx = torch.round(xb / dx[..., None]).clamp(-127, 127)
    return qx.to(torch.int8), dx, dx * qx.sum(dim=-1)


def gguf_linear_reference(x: torch.Tensor, qweight: torch.Tensor, qtype: int,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
    """The oracle: exact integer block sums (int64), the block epilogue in float64."""
    k = in_features(qweight, qtype)
    lead = x.shape[:-1]
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the weight {k}")
    if x.numel() > INT8_MAX_ROWS * k:
        return _dense(x, qweight, qtype, bias)
    qx, dx, sx = quantize_activations(x.reshape(-1, k))
    q, dw, mw = decode_blocks(qweight, qtype)
    halves = BLOCK // 2
    qxh, qh = qx.reshape(*qx.shape[:2], 2, halves), q.reshape(*q.shape[:2], 2, halves)
    isum = torch.einsum("mbhk,nbhk->mnbh", qxh.long(), qh.long()).double()
    y = (isum * dw.double()[None] * dx.double()[:, None, :, None]).sum((-1, -2)) + sx.double() @ mw.double().t()
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype).reshape(*lead, qweight.shape[0])


def gguf_linear_torch(x: torch.Tensor, qweight: torch.Tensor, qtype: int,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """Torch-native: the same arithmetic in fp32, weight blocks decoded per call (integer block
    sums stay exact in fp32: at most 32 * 127 * 255 < 2^24), ``_TORCH_ROWS`` rows at a time."""
    k = in_features(qweight, qtype)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.shape[0] > INT8_MAX_ROWS:
        return _dense(x, qweight, qtype, bias)
    q, dw, mw = decode_blocks(qweight, qtype)
    n, halves = qweight.shape[0], BLOCK // 2
    qf = q.float().reshape(n, -1, halves).permute(1, 2, 0)  # [2 nb, 16, N]
    dwh = dw.reshape(n, -1).t()  # [2 nb, N]
    out = []
    for r in range(0, x2.shape[0], _TORCH_ROWS):
        qx, dx, sx = quantize_activations(x2[r : r + _TORCH_ROWS])
        m = qx.shape[0]
        isum = torch.bmm(qx.float().reshape(m, -1, halves).transpose(0, 1), qf)  # [2 nb, m, N]
        dxh = dx.repeat_interleave(2, dim=1).t()  # [2 nb, m]
        y = (isum * (dxh[:, :, None] * dwh[:, None, :])).sum(0) + sx @ mw.t()
        out.append(y)
    y = torch.cat(out) if out else x2.new_zeros(0, qweight.shape[0], dtype=torch.float32)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*lead, qweight.shape[0])


def _dense(x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: torch.Tensor | None) -> torch.Tensor:
    """The prefill path: blocks dequantized to x's dtype, then F.linear (fp32 for bf16 x where
    oneDNN has no bf16 GEMM, as the native kernels run it)."""
    if x.dtype is torch.bfloat16 and not has_bf16_gemm():
        y = F.linear(x.float(), dequantize(qweight, qtype, torch.float32), None if bias is None else bias.float())
        return y.to(torch.bfloat16)
    return F.linear(x, dequantize(qweight, qtype, x.dtype), None if bias is None else bias.to(x.dtype))
