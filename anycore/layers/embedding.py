"""Token embedding and the logits head (tied to the embedding or its own matrix)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from anycore.kernels.gguf import INT8_MAX_ROWS, dequantize, file_type, gather_rows, gguf_linear_torch
from anycore.kernels.int8 import TORCH_NATIVE_W8A8, Int8Linear, quantize_weight_per_channel
from anycore.kernels.ops import KernelOps


class VocabEmbedding(nn.Module):
    """The token embedding table: bf16/fp32, int8 rows with a per-row scale, or a GGUF file's blocks.

    A lookup reads one row per token, so an int8 table costs nothing in speed; what it saves is
    memory: half the table (SmolLM2-135M 57 -> 28 MB; a 128k-vocabulary 4096-wide model 1 GB ->
    0.5 GB). Two ways to get there:

    - ``quantize_int8``: its own int8 rows (an untied table). Rounding error is at most half a
      step of 1/127 of the row's largest value.
    - ``share_int8_head``: a tied table reads its rows out of the int8 logits head, which holds
      the same matrix, packed for the W8A8 kernel (its columns smoothed: each row is scaled back
      by the head's ``inv_smooth``). One int8 copy of the matrix instead of two: the tied,
      quantized SmolLM2-135M keeps 28 MB less.

    ``use_gguf_blocks`` (``--quantization gguf``) keeps the file's blocks of the table and
    dequantizes the looked-up rows only, each exactly as the loader would have (the same rows a
    float table holds); tied, the blocks are the very tensor the logits head multiplies by, so
    SmolLM2-135M's Q8_0 table is held once (30 MB) instead of a bf16 copy (57 MB) beside it.
    """

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype, ops: KernelOps | None = None) -> None:
        super().__init__()
        self.dtype = dtype
        # a GGUF table's lookup: the native rows where the kernels have them (the same bits)
        self.gguf_lookup = ops.gguf_embedding if ops is not None else None
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False)
        self.shared_head: LogitsHead | None = None  # (a plain reference: not a submodule of the table)
        self.gguf_qtype: int | None = None

    @torch.no_grad()  # (not inference_mode: inference tensors cannot move into the weight block)
    def quantize_int8(self) -> None:
        """Replaces the float table by int8 rows + fp32 row scales. A logits head tied to this
        table must be quantized first (``LogitsHead.quantize_int8``): it reads the float table."""
        qweight, scale = quantize_weight_per_channel(self.weight.data)
        del self.weight
        self.register_buffer("weight", None, persistent=False)
        self.register_buffer("qweight", qweight)
        self.register_buffer("row_scale", scale)

    @torch.no_grad()
    def share_int8_head(self, head: LogitsHead) -> None:
        """Drops the float table: lookups read the rows of ``head``, an int8 logits head tied to
        this table (``LogitsHead.quantize_int8`` done)."""
        if head.tied_to is not self or head.int8_kernel is None:
            raise ValueError("share_int8_head needs an int8 logits head tied to this table")
        vocab_size, hidden_size = self.weight.shape
        del self.weight
        self.register_buffer("weight", None, persistent=False)
        object.__setattr__(self, "shared_head", head)  # bypasses Module.__setattr__: no submodule
        self.table_shape = (vocab_size, hidden_size)

    @torch.no_grad()
    def use_gguf_blocks(self, blocks) -> None:
        """Drops the float table for ``blocks`` (GGUFBlocks [vocab, hidden], gguf_blocks.py)."""
        if tuple(blocks.shape) != tuple(self.weight.shape):
            raise ValueError(f"embedding blocks {tuple(blocks.shape)} != the table's {tuple(self.weight.shape)}")
        self.table_shape = tuple(self.weight.shape)
        del self.weight
        self.register_buffer("weight", None, persistent=False)
        self.register_buffer("gguf_rows", blocks.data)
        self.gguf_qtype = int(blocks.qtype)
        self.gguf_qtype_tensor = torch.tensor([self.gguf_qtype], dtype=torch.int64)  # (decode_greedy's form)

    @property
    def is_int8(self) -> bool:
        return self.weight is None and self.gguf_qtype is None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.gguf_qtype is not None:  # the looked-up rows' blocks dequantized, in fp32 then the dtype
            if self.gguf_lookup is not None:
                rows = self.gguf_lookup(self.gguf_rows, self.gguf_qtype, input_ids.reshape(-1), self.dtype)
                return rows.reshape(*input_ids.shape, self.table_shape[1])
            blocks = gather_rows(self.gguf_rows, self.gguf_qtype, input_ids.reshape(-1))
            rows = dequantize(blocks, file_type(self.gguf_qtype))
            return rows.to(self.dtype).reshape(*input_ids.shape, self.table_shape[1])
        head = self.shared_head
        if head is not None:  # rows unpacked and dequantized per looked-up token only
            ids = input_ids.reshape(-1)
            rows = head.int8_kernel.unpack(head.qweight_packed, *self.table_shape, ids).float()
            rows *= head.w_scale[ids, None]
            if head.inv_smooth is not None:
                rows *= head.inv_smooth
            return rows.to(self.dtype).reshape(*input_ids.shape, self.table_shape[1])
        if self.is_int8:  # dequantized per looked-up row only
            return (self.qweight[input_ids].float() * self.row_scale[input_ids, None]).to(self.dtype)
        return F.embedding(input_ids, self.weight)


class LogitsHead(nn.Module):
    """fp32 logits for the selected rows; shares the embedding matrix when tied.

    ``quantize_int8(kernel, input_absmax)`` switches it to W8A8 (the linear layers' scheme: int8
    rows with per-row scales, activations quantized per token, fp32 logits straight from the
    kernel), halving the largest matrix a decode step streams. Given the calibration's
    per-channel max |hidden|, outliers are smoothed SmoothQuant-style: hidden channel j is
    divided by s_j at run time and the int8 copy's column j is multiplied by it. Measured on
    SmolLM2-135M (wikitext-2, 32k tokens, W8A8 body): perplexity +0.2% smoothed, +0.5% without.
    An untied head drops its float matrix; a tied one leaves the embedding's for the lookups.

    ``use_gguf_blocks(blocks)`` (``--quantization gguf``) multiplies by the GGUF file's own blocks
    of the matrix through ``gguf_linear`` instead, as llama.cpp does: int8 activations per
    32-block, fp32 logits, at most ``INT8_MAX_ROWS`` rows per call (more rows go in slices of that
    many, so no call falls back to dequantizing the whole vocabulary, and a row's logits do not
    depend on how many rows came with it).
    """

    def __init__(
        self, vocab_size: int, hidden_size: int, dtype: torch.dtype, tied_to: VocabEmbedding | None,
        ops: KernelOps | None = None,
    ) -> None:
        super().__init__()
        self.tied_to = tied_to
        self.matmul = ops.linear if ops is not None else F.linear
        self.kernels = ops
        self.int8_kernel: Int8Linear | None = None
        self.gguf_qtype: int | None = None
        if tied_to is None:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False)

    @torch.no_grad()  # (not inference_mode: inference tensors cannot move into the weight block)
    def quantize_int8(self, input_absmax: torch.Tensor | None = None, alpha: float = 0.5,
                      kernel: Int8Linear | None = None) -> None:
        """``kernel``: default the kernel table's ``w8a8_linear`` (torch-native without one)."""
        if kernel is None:
            kernel = self.kernels.w8a8_linear if self.kernels is not None else TORCH_NATIVE_W8A8
        weight = (self.tied_to.weight if self.tied_to is not None else self.weight).data.float()
        inv_smooth = None
        if input_absmax is not None:
            s = input_absmax.float().clamp(min=1e-5).pow(alpha) / weight.abs().amax(dim=0).clamp(min=1e-5).pow(1 - alpha)
            s = s.clamp(min=1e-5)
            weight = weight * s[None, :]
            inv_smooth = (1.0 / s).contiguous()
        qweight, scale = quantize_weight_per_channel(weight)
        del weight
        self.register_buffer("qweight_packed", kernel.pack(qweight))
        self.register_buffer("w_scale", scale.contiguous())
        self.register_buffer("inv_smooth", inv_smooth)
        self.int8_kernel = kernel
        if self.tied_to is None:
            del self.weight
            self.register_buffer("weight", None, persistent=False)

    @torch.no_grad()
    def use_gguf_blocks(self, blocks) -> None:
        """``blocks``: the matrix's GGUFBlocks (anycore/layers/quant/gguf_blocks.py), [vocab, hidden]."""
        weight = self.tied_to.weight if self.tied_to is not None else self.weight
        if tuple(blocks.shape) != tuple(weight.shape):
            raise ValueError(f"logits head blocks {tuple(blocks.shape)} != the head's {tuple(weight.shape)}")
        self.register_buffer("gguf_qweight", blocks.data.contiguous())
        self.gguf_qtype = int(blocks.qtype)
        # the native decode's form of the block type (csrc/common/decode_greedy.cpp)
        self.gguf_qtype_tensor = torch.tensor([self.gguf_qtype], dtype=torch.int64)
        if self.tied_to is None:
            del self.weight
            self.register_buffer("weight", None, persistent=False)

    @property
    def multiplies_table(self) -> bool:
        """Whether the head multiplies by the tied embedding table itself (no copy of its own)."""
        return self.tied_to is not None and self.int8_kernel is None and self.gguf_qtype is None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.gguf_qtype is not None:
            op = self.kernels.gguf_linear if self.kernels is not None else gguf_linear_torch
            x = hidden.float().reshape(-1, hidden.shape[-1])
            rows = [op(x[r : r + INT8_MAX_ROWS], self.gguf_qweight, self.gguf_qtype, None)
                    for r in range(0, x.shape[0], INT8_MAX_ROWS)]
            out = rows[0] if len(rows) == 1 else torch.cat(rows)
            return out.reshape(*hidden.shape[:-1], out.shape[-1])
        if self.int8_kernel is not None:
            x = hidden.float() if self.inv_smooth is None else hidden.float() * self.inv_smooth
            return self.int8_kernel(x, self.qweight_packed, self.w_scale)
        weight = self.tied_to.weight if self.tied_to is not None else self.weight
        return self.matmul(hidden, weight).float()
