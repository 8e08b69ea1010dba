"""Linear layers with a seam for quantization methods and native kernels.

A ``Linear`` owns its parameters; *how* it multiplies is delegated to a ``LinearMethod`` so a
quantized method (e.g. W8A8 INT8) can replace the weight layout after loading without the model
file changing. Merged projections (QKV, gate+up) are one Linear with several output shards.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from anycore.kernels.ops import KernelOps


class LinearMethod(Protocol):
    name: str

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None: ...

    def process_weights_after_loading(self, layer: Linear) -> None: ...

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor: ...

    # Optional: ``load_shard(layer, kind, tensor, shard) -> bool``: takes a checkpoint tensor
    # itself (True) instead of the copy into ``layer.<kind>`` (e.g. GGUF blocks, kept as they are).
    # Optional: ``native_args(layer) -> ((weight, w8a8 scale or None, bias or None), variant index)``
    # for the native decoder stack (engine/native_executor.py), or None when this
    # method's multiply has no native equivalent there (the layer then runs unfused).


class UnquantizedLinearMethod:
    """Dense weights in the run dtype; the multiply is the kernel table's ``linear``."""

    name = "dense"

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        layer.weight = nn.Parameter(torch.empty(layer.out_features, layer.in_features, dtype=dtype), requires_grad=False)

    def process_weights_after_loading(self, layer: Linear) -> None:
        pass

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        return layer.matmul(x, layer.weight, layer.bias)

    def native_args(self, layer: Linear):
        # index -1: oneDNN (at::linear), what the torch-native `linear` runs
        index = layer.kernels.native_index.get("linear", -1) if layer.kernels is not None else -1
        return (layer.weight, None, layer.bias), index


class Linear(nn.Module):
    """``y = x W^T + b`` where W stacks ``out_sizes`` shards along the output dimension."""

    def __init__(
        self,
        in_features: int,
        out_sizes: int | list[int],
        bias: bool = False,
        dtype: torch.dtype = torch.float32,
        ops: KernelOps | None = None,
        method: LinearMethod | None = None,
    ) -> None:
        super().__init__()
        self.out_sizes = [out_sizes] if isinstance(out_sizes, int) else list(out_sizes)
        self.in_features = in_features
        self.out_features = sum(self.out_sizes)
        self.bias = (
            nn.Parameter(torch.zeros(self.out_features, dtype=dtype), requires_grad=False) if bias else None
        )
        self.matmul = ops.linear if ops is not None else F.linear
        self.kernels = ops  # the table quantized methods pick their kernel from (None: torch-native)
        self.method: LinearMethod = method or UnquantizedLinearMethod()
        self.method.create_weights(self, dtype)

    # Bumped whenever some Linear gets a new method or a forward hook, or weight storage is
    # replaced (storage_replaced): arguments cached for the fused native calls from an older
    # generation, raw pointers included, must be rebuilt (the per-step check is then one integer
    # comparison, not a walk over every projection's attributes).
    generation: ClassVar[int] = 0

    def __setattr__(self, name: str, value) -> None:
        if name == "method":
            Linear.generation += 1
        super().__setattr__(name, value)

    def register_forward_pre_hook(self, *args, **kwargs):
        Linear.generation += 1
        return super().register_forward_pre_hook(*args, **kwargs)

    def register_forward_hook(self, *args, **kwargs):
        Linear.generation += 1
        return super().register_forward_hook(*args, **kwargs)

    def load(self, kind: str, tensor: torch.Tensor, shard: int = 0) -> None:
        """Copies a checkpoint tensor (``weight``, ``bias``, ``weight_scale``...) into output
        shard ``shard``; every such tensor is split along the output dimension."""
        load_shard = getattr(self.method, "load_shard", None)
        if load_shard is not None and load_shard(self, kind, tensor, shard):
            return  # the method keeps this tensor its own way (e.g. GGUF blocks)
        start = sum(self.out_sizes[:shard])
        size = self.out_sizes[shard]
        target = getattr(self, kind, None)
        if target is None:
            raise ValueError(f"checkpoint has a {kind} this layer does not expect")
        expected = (size, *target.shape[1:])
        if tensor.numel() == size and target.dim() == 1:
            tensor = tensor.reshape(size)  # per-channel scales come as [N] or [N, 1]
        if tuple(tensor.shape) != expected:
            raise ValueError(f"{kind} shard {shard}: checkpoint shape {tuple(tensor.shape)} != expected {expected}")
        target.data[start : start + size].copy_(tensor)

    def param_kinds(self) -> list[str]:
        """Names of the tensors a checkpoint must provide for this layer."""
        return [name for name, _ in self.named_parameters(recurse=False)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)

    def native_args(self):
        """What the native decoder stack needs to run this projection, or None.

        None too while hooks are attached (e.g. calibration statistics): they observe this
        module's forward, which the native stack never calls."""
        if self._forward_pre_hooks or self._forward_hooks:
            return None
        native_args = getattr(self.method, "native_args", None)
        return native_args(self) if native_args is not None else None


def storage_replaced() -> None:
    """Call after moving any model weight to new storage (``t.data = ...``): fused calls built
    before must not keep using pointers into the old one."""
    Linear.generation += 1
