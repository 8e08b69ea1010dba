"""RMSNorm through the kernel table."""

from __future__ import annotations

import torch
from torch import nn

from anycore.kernels.ops import KernelOps


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, ops: KernelOps, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without ``residual``: the normed tensor. With it: ``(norm(x + residual), x + residual)``."""
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps)
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)
