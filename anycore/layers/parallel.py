"""Tensor-parallel layers: a loaded model's projections, embedding and head cut to one rank's share.

Megatron's scheme, applied after loading (each rank loads the checkpoint, keeps its slices and
drops the rest; the sharded model then runs the ordinary op-by-op forward):

- **column parallel** (QKV, gate/up): the rank keeps its output rows; no communication.
- **row parallel** (o_proj, down): the rank keeps the matching input columns and its partial
  outputs are summed over the ranks (one all-reduce each, ``RowParallelLinear``).
- **vocab parallel** embedding: each rank holds a contiguous block of rows; a token outside it
  looks up zeros and the all-reduce adds the one rank's row (exact: x + 0 == x).
- **vocab parallel** head: each rank's logits for its rows, gathered on rank 0 (the only rank
  that samples).

Attention is split **by KV-head group**, not by equal division of heads: a KV head and the query
heads that read it (``num_heads / num_kv_heads`` of them) stay on one rank, so attention needs
no communication and each rank's KV pool holds only its KV heads. KV heads that do not divide
evenly are split unevenly: SmolLM2-135M's 3 KV groups (9 query heads) at TP=2 are 2 groups
(6 query heads) on rank 0 and 1 group (3 query heads) on rank 1. The MLP's intermediate width is
split as evenly as possible (``split_even``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from anycore.config import ModelConfig
from anycore.distributed.group import ParallelGroup, split_even
from anycore.layers.embedding import LogitsHead, VocabEmbedding
from anycore.layers.linear import Linear, storage_replaced


class RowParallelLinear(nn.Module):
    """A row-parallel projection: this rank's partial ``x_r W_r^T``, summed over the ranks."""

    def __init__(self, linear: Linear, group: ParallelGroup) -> None:
        super().__init__()
        self.linear = linear
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.linear(x))


class ParallelEmbedding(nn.Module):
    """Vocab-parallel lookup over ``table`` (already cut to rows ``[start, end)``)."""

    def __init__(self, table: VocabEmbedding, start: int, end: int, group: ParallelGroup) -> None:
        super().__init__()
        self.table = table
        self.start, self.end = start, end
        self.group = group
        self.dtype = table.dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        outside = (input_ids < self.start) | (input_ids >= self.end)
        local = (input_ids - self.start).masked_fill(outside, 0)
        rows = F.embedding(local, self.table.weight).masked_fill(outside[..., None], 0.0)
        return self.group.all_reduce(rows)


class ParallelLogitsHead(nn.Module):
    """Vocab-parallel logits: rank 0 gets ``[rows, vocab]`` fp32, the other ranks None."""

    def __init__(self, head: LogitsHead, vocab_size: int, group: ParallelGroup) -> None:
        super().__init__()
        self.head = head
        self.vocab_size = vocab_size
        self.group = group

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.group.gather_columns(self.head(hidden), self.vocab_size)


def vocab_range(vocab_size: int, group: ParallelGroup) -> tuple[int, int]:
    """Rows of the embedding/head a rank holds: chunks of ``ceil(vocab / world)`` (so the
    gathered logits are equal-sized pieces; the last rank's is padded)."""
    chunk = -(-vocab_size // group.world)
    return min(vocab_size, group.rank * chunk), min(vocab_size, (group.rank + 1) * chunk)


def kv_head_range(num_kv_heads: int, group: ParallelGroup) -> tuple[int, int]:
    """The KV heads (hence KV groups) rank ``group.rank`` holds; see the module docstring."""
    if num_kv_heads < group.world:
        raise ValueError(f"tensor parallel size {group.world} exceeds the model's {num_kv_heads} KV heads "
                         "(attention is split by KV-head group)")
    return split_even(num_kv_heads, group.world, group.rank)


def _keep(linear: Linear, rows: torch.Tensor | None = None, cols: slice | None = None,
          out_sizes: list[int] | None = None, bias: bool = True) -> None:
    """Replaces ``linear``'s weight by its ``rows`` (column parallel) or ``cols`` (row parallel);
    ``bias=False`` drops the bias (a row-parallel bias is added once, by rank 0)."""
    if linear.method.name != "dense":
        raise ValueError(f"tensor parallel runs dense projections only, not {linear.method.name!r}")
    w = linear.weight.data
    w = w[rows] if rows is not None else w[:, cols]
    linear.weight = nn.Parameter(w.contiguous(), requires_grad=False)
    if linear.bias is not None:
        linear.bias = (nn.Parameter(linear.bias.data[rows].contiguous(), requires_grad=False)
                       if rows is not None else linear.bias if bias else None)
    linear.out_sizes = out_sizes or [w.shape[0]]
    linear.out_features, linear.in_features = w.shape


def _rows(*ranges: tuple[int, int]) -> torch.Tensor:
    return torch.cat([torch.arange(a, b) for a, b in ranges])


def shard_attention(attn: nn.Module, group: ParallelGroup) -> int:
    """Cuts a Llama-family ``Attention`` to this rank's KV groups; returns its KV head count."""
    inner = attn.attn
    d, heads, kv_heads = attn.head_dim, inner.num_heads, inner.num_kv_heads
    per_group = heads // kv_heads
    a, b = kv_head_range(kv_heads, group)
    q = (a * per_group * d, b * per_group * d)
    k = (attn.q_size + a * d, attn.q_size + b * d)
    v = (attn.q_size + attn.kv_size + a * d, attn.q_size + attn.kv_size + b * d)
    q_size, kv_size = q[1] - q[0], k[1] - k[0]
    _keep(attn.qkv_proj, rows=_rows(q, k, v), out_sizes=[q_size, kv_size, kv_size])
    _keep(attn.o_proj, cols=slice(*q), bias=group.rank == 0)
    attn.o_proj = RowParallelLinear(attn.o_proj, group)
    attn.q_size, attn.kv_size = q_size, kv_size
    inner.num_heads, inner.num_kv_heads = (b - a) * per_group, b - a
    return b - a


def shard_mlp(mlp: nn.Module, group: ParallelGroup) -> None:
    """Cuts a gated MLP (``gate_up_proj`` = [gate; up], ``down_proj``) to this rank's share."""
    width = mlp.down_proj.in_features
    lo, hi = split_even(width, group.world, group.rank)
    _keep(mlp.gate_up_proj, rows=_rows((lo, hi), (width + lo, width + hi)), out_sizes=[hi - lo] * 2)
    _keep(mlp.down_proj, cols=slice(lo, hi), bias=group.rank == 0)
    mlp.down_proj = RowParallelLinear(mlp.down_proj, group)


def shard_embedding_and_head(model: nn.Module, vocab_size: int, group: ParallelGroup) -> None:
    start, end = vocab_range(vocab_size, group)
    table, head = model.embed_tokens, model.lm_head
    if table.is_int8 or head.int8_kernel is not None:
        raise ValueError("tensor parallel runs a float embedding and logits head")
    table.weight = nn.Parameter(table.weight.data[start:end].contiguous(), requires_grad=False)
    if head.tied_to is None:
        head.weight = nn.Parameter(head.weight.data[start:end].contiguous(), requires_grad=False)
    model.embed_tokens = ParallelEmbedding(table, start, end, group)
    model.lm_head = ParallelLogitsHead(head, vocab_size, group)


# the dense Llama-family classes shard_llama_family handles (models/llama.py)
TP_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def check_tensor_parallel(config: ModelConfig, world: int) -> None:
    """Raises a ValueError before any rank starts when ``config``'s model cannot be sharded
    ``world`` ways (the same conditions ``shard_llama_family`` meets on the loaded model)."""
    reason = None
    if config.architecture not in TP_ARCHITECTURES:
        reason = f"{config.architecture} is not one of {', '.join(TP_ARCHITECTURES)}"
    elif config.moe is not None or config.qk_norm_full:
        reason = "sparse (MoE) MLPs and whole-projection q/k norms are not sharded yet"
    elif config.num_kv_heads < world:
        reason = f"{config.num_kv_heads} KV heads cannot be split {world} ways (attention is split by KV group)"
    if reason is not None:
        raise ValueError(f"tensor parallel: unsupported model ({reason})")


def shard_llama_family(model: nn.Module, group: ParallelGroup) -> int:
    """Cuts a loaded Llama-family model (models/llama.py: Llama, Mistral, Qwen2, Qwen3, SmolLM)
    to rank ``group.rank``'s share in place; returns the KV heads its pool must hold."""
    from anycore.models.llama import MLP, LlamaForCausalLM

    reason = None
    if not isinstance(model, LlamaForCausalLM):
        reason = f"{type(model).__name__} is not a Llama-family decoder"
    elif model.config.qk_norm_full:
        reason = "q/k norms over the whole projection need every head"
    elif any(not isinstance(layer.mlp, MLP) for layer in model.layers):
        reason = "sparse (MoE) MLPs are not sharded yet"
    if reason is not None:
        raise ValueError(f"tensor parallel: unsupported model ({reason})")
    kv_heads = 0
    for layer in model.layers:
        kv_heads = shard_attention(layer.self_attn, group)
        shard_mlp(layer.mlp, group)
    shard_embedding_and_head(model, model.config.vocab_size, group)
    storage_replaced()
    return kv_heads
