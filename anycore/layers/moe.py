"""The sparse MLP of Mixture-of-Experts models: a router, the stacked experts, an optional
sigmoid-gated shared expert (Qwen2-MoE). The experts run as one ``fused_moe`` kernel-table call
(anycore/kernels/moe.py).

Checkpoints store each expert's projections separately (``experts.<e>.gate_proj.weight``,
Mixtral's ``w1``/``w3``/``w2``), GGUF files all experts of a projection in one tensor
(``ffn_gate_exps``...); ``StackedExperts.load_stacked`` copies either into the stacked
``w13 [E, 2I, H]`` (gate rows, then up rows) and ``w2 [E, H, I]``.
"""

from __future__ import annotations

import torch
from torch import nn

from anycore.kernels.int8 import quantize_weight_per_channel
from anycore.kernels.ops import KernelOps
from anycore.layers.linear import storage_replaced

# checkpoint projection name -> (stacked tensor, shard: 0 gate rows / 1 up rows of w13)
_EXPERT_PROJECTIONS = {
    "gate_proj": ("w13", 0), "w1": ("w13", 0),
    "up_proj": ("w13", 1), "w3": ("w13", 1),
    "down_proj": ("w2", 0), "w2": ("w2", 0),
}

# all experts in one tensor (GGUF's ffn_*_exps)
_STACKED = {"gate_exps": ("w13", 0), "up_exps": ("w13", 1), "down_exps": ("w2", 0)}


class Router(nn.Module):
    """Router logits ``x W^T`` (``W [E, H]``), kept in the run dtype: online quantization leaves
    it dense (a few KB, and routing decisions are sensitive)."""

    def __init__(self, hidden_size: int, num_outputs: int, ops: KernelOps, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_outputs, hidden_size, dtype=dtype), requires_grad=False)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(x, self.weight)

    # a hook (calibration statistics) must see this forward: the native stack built before it
    # is rebuilt, and leaves a hooked router's layer to run op by op (NativeExecutor._sparse_args)
    def register_forward_pre_hook(self, *args, **kwargs):
        storage_replaced()
        return super().register_forward_pre_hook(*args, **kwargs)

    def register_forward_hook(self, *args, **kwargs):
        storage_replaced()
        return super().register_forward_hook(*args, **kwargs)


class StackedExperts(nn.Module):
    """Every expert's SwiGLU weights, stacked; ``forward(x, router_logits)`` is one fused call.

    After ``quantize_w8a8`` (or ``load_int8``) the weights are int8 per output channel
    (``w13_scale [E, 2I]``, ``w2_scale [E, H]``), packed for the ``fused_moe_w8a8`` op, and
    activations are quantized per token inside it."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, top_k: int, renormalize: bool,
                 ops: KernelOps, dtype: torch.dtype, int8: bool = False) -> None:
        super().__init__()
        e, h, i = num_experts, hidden_size, intermediate_size
        self.num_experts, self.intermediate_size = e, i
        self.top_k, self.renormalize = top_k, renormalize
        self.ops = ops
        self.int8 = int8  # pre-quantized: the checkpoint's int8 experts and their scales load as they are
        self.int8_kernel = None  # the fused_moe_w8a8 implementation the packed experts are for
        if int8:
            self.register_buffer("w13", torch.zeros(e, 2 * i, h, dtype=torch.int8))
            self.register_buffer("w2", torch.zeros(e, h, i, dtype=torch.int8))
            self.register_buffer("w13_scale", torch.zeros(e, 2 * i))
            self.register_buffer("w2_scale", torch.zeros(e, h))
        else:
            self.w13 = nn.Parameter(torch.empty(e, 2 * i, h, dtype=dtype), requires_grad=False)
            self.w2 = nn.Parameter(torch.empty(e, h, i, dtype=dtype), requires_grad=False)
            self.register_buffer("w13_scale", None)  # (int8 weights only)
            self.register_buffer("w2_scale", None)
        self._loaded: set[tuple[int, str]] = set()

    def load_stacked(self, name: str, tensor: torch.Tensor) -> None:
        """``name`` below this module, e.g. ``3.gate_proj.weight`` (pre-quantized: also
        ``3.gate_proj.weight_scale [rows, 1]``), or every expert's at once (GGUF:
        ``gate_exps.weight`` [E, I, H], ``up_exps``, ``down_exps`` [E, H, I]); raises
        ValueError naming a tensor that fits nowhere here."""
        parts = name.split(".")
        if len(parts) == 2 and parts[0] in _STACKED and parts[1] == "weight" and not self.int8:
            i, (target, shard) = self.intermediate_size, _STACKED[parts[0]]
            dest = self.w13.data[:, shard * i : (shard + 1) * i] if target == "w13" else self.w2.data
            if tuple(tensor.shape) != tuple(dest.shape):
                raise ValueError(f"experts.{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(dest.shape)}")
            dest.copy_(tensor)
            proj = {"gate_exps": "gate_proj", "up_exps": "up_proj", "down_exps": "down"}[parts[0]]
            self._loaded |= {(e, proj) for e in range(self.num_experts)}
            return
        kinds = ("weight", "weight_scale") if self.int8 else ("weight",)
        if len(parts) != 3 or not parts[0].isdigit() or parts[1] not in _EXPERT_PROJECTIONS or parts[2] not in kinds:
            raise ValueError(f"experts.{name}: not an expert projection {' or '.join(kinds)} this layer has")
        expert, (target, shard) = int(parts[0]), _EXPERT_PROJECTIONS[parts[1]]
        if expert >= self.num_experts:
            raise ValueError(f"experts.{name}: expert {expert} >= num_experts {self.num_experts}")
        i, scale = self.intermediate_size, parts[2] == "weight_scale"
        if scale:
            dest = self.w13_scale[expert, shard * i : (shard + 1) * i] if target == "w13" else self.w2_scale[expert]
            tensor = tensor.reshape(-1) if tensor.dim() == 2 and tensor.shape[1] == 1 else tensor
        else:
            dest = self.w13.data[expert, shard * i : (shard + 1) * i] if target == "w13" else self.w2.data[expert]
            if self.int8 and tensor.dtype is not torch.int8:
                raise ValueError(f"experts.{name}: a pre-quantized checkpoint's expert weight must be int8, "
                                 f"got {tensor.dtype}")
        if tuple(tensor.shape) != tuple(dest.shape):
            raise ValueError(f"experts.{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(dest.shape)}")
        dest.copy_(tensor)
        self._loaded.add((expert, (parts[1] if target == "w13" else "down") + ("_scale" if scale else "")))

    def missing_tensors(self) -> list[str]:
        """The expert projections no checkpoint tensor filled (checked after loading), named
        below this module as the HF checkpoint names them (``5.up_proj.weight``)."""
        out = []
        for e in range(self.num_experts):
            for kind, suffix in (("weight", ""), ("weight_scale", "_scale"))[: 2 if self.int8 else 1]:
                gate = (e, "gate_proj" + suffix) in self._loaded or (e, "w1" + suffix) in self._loaded
                up = (e, "up_proj" + suffix) in self._loaded or (e, "w3" + suffix) in self._loaded
                down = (e, "down" + suffix) in self._loaded
                out += [f"{e}.{p}.{kind}" for p, ok in (("gate_proj", gate), ("up_proj", up), ("down_proj", down))
                        if not ok]
        return out

    def finish_loading(self) -> None:
        """After the checkpoint: pre-quantized int8 experts are packed for their kernel."""
        if self.int8 and self.int8_kernel is None:
            self.load_int8(self.w13, self.w13_scale, self.w2, self.w2_scale)

    def quantize_w8a8(self) -> None:
        """Online W8A8: int8 weights per output channel of each expert, fp32 scales; the float
        weights are dropped and the int8 experts packed once for ``fused_moe_w8a8``."""
        q13, s13 = quantize_weight_per_channel(self.w13.data.reshape(-1, self.w13.shape[-1]))
        q2, s2 = quantize_weight_per_channel(self.w2.data.reshape(-1, self.w2.shape[-1]))
        e = self.num_experts
        del self.w13, self.w2
        self.load_int8(q13.view(e, -1, q13.shape[-1]), s13.view(e, -1), q2.view(e, -1, q2.shape[-1]), s2.view(e, -1))

    def load_int8(self, q13: torch.Tensor, s13: torch.Tensor, q2: torch.Tensor, s2: torch.Tensor) -> None:
        """Int8 experts ``q13 [E, 2I, H]``, ``q2 [E, H, I]`` with fp32 scales ``[E, 2I]``, ``[E, H]``,
        packed in the layout of the kernel-table ``fused_moe_w8a8`` that will run them
        (``self.int8_kernel``; ``int8_experts()`` gives them back unpacked)."""
        kernel = self.ops.fused_moe_w8a8
        for name in ("w13", "w2"):
            self._parameters.pop(name, None)
        self.register_buffer("w13", kernel.pack(q13.contiguous()))
        self.register_buffer("w2", kernel.pack(q2.contiguous()))
        self.int8, self.int8_kernel = True, kernel
        self.register_buffer("w13_scale", s13.float().contiguous())
        self.register_buffer("w2_scale", s2.float().contiguous())
        storage_replaced()

    def int8_experts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(``q13 [E, 2I, H]``, ``w13_scale``, ``q2 [E, H, I]``, ``w2_scale``) of int8 experts."""
        if self.int8_kernel is None:
            raise ValueError("the experts are not packed int8")
        i, h = self.intermediate_size, self.w2_scale.shape[1]
        return (self.int8_kernel.unpack(self.w13, 2 * i, h), self.w13_scale,
                self.int8_kernel.unpack(self.w2, h, i), self.w2_scale)

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        if self.int8_kernel is not None:
            return self.int8_kernel(x, router_logits, self.w13, self.w2, self.top_k, self.renormalize,
                                    self.w13_scale, self.w2_scale)
        return self.ops.fused_moe(x, router_logits, self.w13, self.w2, self.top_k, self.renormalize)


class SparseMoeBlock(nn.Module):
    """``experts(x, gate(x))`` (+ ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``)."""

    def __init__(self, gate: Router, experts: StackedExperts, shared_expert: nn.Module | None = None,
                 shared_expert_gate: Router | None = None) -> None:
        super().__init__()
        self.gate = gate
        self.experts = experts
        self.shared_expert = shared_expert
        self.shared_expert_gate = shared_expert_gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, self.gate(x))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
