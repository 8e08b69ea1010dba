"""GGUF block weights served as they are (``--quantization gguf``): Q4_0, Q4_1, Q5_0, Q8_0,
Q4_K, Q5_K and Q6_K projections keep the file's blocks (anycore/kernels/gguf.py), never
expanded to bf16, and multiply through the kernel table's ``gguf_linear`` (int8 activations per
32-block).

A merged projection (QKV, gate+up) stays in blocks when all its shards come in one supported
block type, or in a mix of Q4_0 / Q5_0 / Q8_0 (then all Q8_0, re-encoded exactly: Gemma 3's
Q5_0 q/k with a Q8_0 v); otherwise (other mixes, an F16/F32 tensor, a type without a kernel such
as Q2_K) that layer is dense in the run dtype, dequantized as without this method (the start-up
log counts them, ``anycore.engine.engine.gguf_summary``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from anycore.kernels.gguf import (
    FORMATS,
    Q8_0,
    X16,
    as_q8_0,
    can_interleave,
    dequantize,
    gguf_linear_torch,
    in_features,
    interleave16,
)

GGUF = "gguf"


@dataclass(frozen=True)
class GGUFBlocks:
    """One checkpoint tensor still in its file blocks: ``data`` uint8 ``[rows, K / 32 * block bytes]``."""

    qtype: int
    data: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return (self.data.shape[0], in_features(self.data, self.qtype))

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(self.data, self.qtype, dtype)


def blocks_for(kernels, blocks: GGUFBlocks) -> GGUFBlocks:
    """``blocks`` in the layout the bound ``gguf_linear`` variant multiplies fastest: interleaved
    by 16 rows (anycore/kernels/gguf.py) when that variant has a micro-kernel for that type's
    interleaved layout and the row count allows, otherwise the file's. (Measured on a Zen 4 core,
    AVX-512 VNNI, and a Zen 3 core, AVX2, Q4_1 3072 x 576: see the commits that added them.)"""
    index = kernels.native_index.get("gguf_linear") if kernels is not None else None
    if index is None or not interleaves(index, blocks.qtype, blocks.data.shape[0]):
        return blocks
    return GGUFBlocks(X16 + blocks.qtype, interleave16(blocks.data, blocks.qtype))


def interleaves(index: int, qtype: int, rows: int) -> bool:
    """Whether native variant ``index`` takes a ``qtype`` weight of ``rows`` rows interleaved."""
    if not can_interleave(qtype, rows):
        return False
    return f"gguf_interleaved16_{FORMATS[qtype][0].lower()}" in torch.ops.anycore.variant_kernels(index)


class GGUFLinearMethod:
    name = GGUF

    def __init__(self, prequantized: bool = True) -> None:
        if not prequantized:
            raise ValueError("gguf weights come quantized in the file; there is no online gguf quantization")
        self.shards: dict[int, GGUFBlocks | torch.Tensor] = {}

    def create_weights(self, layer: nn.Module, dtype: torch.dtype) -> None:
        # a placeholder, so the checkpoint's completeness check expects `weight`; the shards are
        # kept by load_shard and joined after loading
        layer.weight = nn.Parameter(torch.empty(0, dtype=dtype), requires_grad=False)
        self.dtype = dtype

    def load_shard(self, layer: nn.Module, kind: str, tensor, shard: int) -> bool:
        """Takes shard ``shard`` of the weight (blocks or a dense tensor); False for other kinds."""
        if kind != "weight":
            return False
        expected = (layer.out_sizes[shard], layer.in_features)
        if tuple(tensor.shape) != expected:
            raise ValueError(f"weight shard {shard}: checkpoint shape {tuple(tensor.shape)} != expected {expected}")
        self.shards[shard] = tensor
        return True

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        shards = [self.shards[i] for i in range(len(layer.out_sizes))]
        self.shards = {}
        qtypes = {s.qtype if isinstance(s, GGUFBlocks) else None for s in shards}
        if len(qtypes) > 1 and None not in qtypes:
            q8 = [as_q8_0(s.data, s.qtype) for s in shards]
            if all(q is not None for q in q8):
                shards, qtypes = [GGUFBlocks(Q8_0, q) for q in q8], {Q8_0}
        if len(qtypes) == 1 and None not in qtypes:
            (qtype,) = qtypes
            blocks = blocks_for(getattr(layer, "kernels", None), GGUFBlocks(qtype, torch.cat([s.data for s in shards])))
            layer.qtype = blocks.qtype  # (X16 + the file's type when interleaved)
            # the native decoder stack's "scale" slot for blocks (csrc/common/decoder_layout.h)
            layer.qtype_tensor = torch.tensor([blocks.qtype], dtype=torch.int64)
            layer.register_buffer("qweight", blocks.data.contiguous())
            del layer.weight
            layer.register_buffer("weight", None, persistent=False)
            return
        from anycore.layers.linear import UnquantizedLinearMethod

        dense = [s.dequantize(self.dtype) if isinstance(s, GGUFBlocks) else s.to(self.dtype) for s in shards]
        layer.weight = nn.Parameter(torch.cat(dense).contiguous(), requires_grad=False)
        layer.method = UnquantizedLinearMethod()

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        kernels = getattr(layer, "kernels", None)
        op = kernels.gguf_linear if kernels is not None else gguf_linear_torch
        return op(x, layer.qweight, layer.qtype, layer.bias)


    def native_args(self, layer: nn.Module):
        """For the native decoder stack: (blocks, block type, bias) on the bound native kernel."""
        kernels = getattr(layer, "kernels", None)
        index = kernels.native_index.get("gguf_linear") if kernels is not None else None
        return None if index is None else ((layer.qweight, layer.qtype_tensor, layer.bias), index)


def format_name(qtype: int) -> str:
    return FORMATS[qtype][0]
