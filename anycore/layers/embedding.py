"""Token embedding and the logits head (tied to the embedding or its own matrix)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from anycore.kernels.ops import KernelOps


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class LogitsHead(nn.Module):
    """fp32 logits for the selected rows; shares the embedding matrix when tied."""

    def __init__(
        self, vocab_size: int, hidden_size: int, dtype: torch.dtype, tied_to: VocabEmbedding | None,
        ops: KernelOps | None = None,
    ) -> None:
        super().__init__()
        self.tied_to = tied_to
        self.matmul = ops.linear if ops is not None else F.linear
        if tied_to is None:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.tied_to.weight if self.tied_to is not None else self.weight
        return self.matmul(hidden, weight).float()
