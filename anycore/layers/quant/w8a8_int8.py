"""W8A8 INT8 linear method: int8 per-channel weights, int8 per-token dynamic activations.

Two ways in: *online* (the checkpoint is float; weights are quantized after loading) and
*pre-quantized* (compressed-tensors checkpoints: int8 ``weight`` + ``weight_scale``).
After loading, the float weight is dropped and the int8 weight is packed once for the
kernel that will run it.
"""

from __future__ import annotations

import torch
from torch import nn

from anycore.kernels.int8 import TORCH_NATIVE_W8A8, quantize_weight_per_channel


class W8A8Int8LinearMethod:
    name = "w8a8_int8"

    def __init__(self, prequantized: bool = False) -> None:
        self.prequantized = prequantized

    def create_weights(self, layer: nn.Module, dtype: torch.dtype) -> None:
        n, k = layer.out_features, layer.in_features
        if self.prequantized:
            layer.weight = nn.Parameter(torch.empty(n, k, dtype=torch.int8), requires_grad=False)
            layer.weight_scale = nn.Parameter(torch.empty(n, dtype=torch.float32), requires_grad=False)
        else:
            layer.weight = nn.Parameter(torch.empty(n, k, dtype=dtype), requires_grad=False)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.prequantized:
            qweight, scale = layer.weight.data, layer.weight_scale.data.float()
        else:
            qweight, scale = quantize_weight_per_channel(layer.weight.data)
        # only the packed int8 weight stays in memory, in the layout of the kernel-table
        # implementation that will run it (layer.int8_kernel); savers get [N, K] back with
        # layer.int8_kernel.unpack(layer.qweight_packed, out_features, in_features)
        kernel = layer.kernels.w8a8_linear if getattr(layer, "kernels", None) is not None else TORCH_NATIVE_W8A8
        layer.int8_kernel = kernel
        layer.register_buffer("qweight_packed", kernel.pack(qweight.contiguous()))
        layer.register_buffer("w_scale", scale.contiguous())
        del layer.weight
        if hasattr(layer, "weight_scale"):
            del layer.weight_scale
        layer.register_buffer("weight", None, persistent=False)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return layer.int8_kernel(x, layer.qweight_packed, layer.w_scale, layer.bias)

    def native_args(self, layer: nn.Module):
        """For the native decoder stack: only a native kernel's packing can run there."""
        kernels = getattr(layer, "kernels", None)
        if kernels is None or layer.int8_kernel is not kernels.w8a8_linear:
            return None
        index = kernels.native_index.get("w8a8_linear")
        return None if index is None else ((layer.qweight_packed, layer.w_scale, layer.bias), index)
