"""Mixture-of-Experts decoders: Qwen3-MoE, Qwen2-MoE (shared expert), Mixtral, OLMoE.

The Llama-family decoder (models/llama.py) with a sparse MLP in the layers ``ModelConfig.moe``
names (anycore/layers/moe.py: router, stacked experts in one ``fused_moe`` call, Qwen2-MoE's
sigmoid-gated shared expert); the other layers keep the dense SwiGLU MLP. Attention differs only
by config: Qwen3-MoE per-head q/k norm, Qwen2-MoE q/k/v bias, OLMoE q/k norm over the whole
projection (``qk_norm_full``) and optional ``clip_qkv``.

The native decoder stack runs these layers too (its sparse-MLP slots, csrc/common/decoder_layout.h):
router, experts and shared expert in the same kernels and order as SparseMoeBlock, so the same bits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from anycore.config import ModelConfig
from anycore.kernels.ops import KernelOps
from anycore.layers.linear import LinearMethod
from anycore.layers.moe import Router, SparseMoeBlock, StackedExperts
from anycore.layers.quant.compressed_tensors import W8A8_INT8
from anycore.layers.quant.moe_smoothing import SparseMlpSmoothing
from anycore.layers.quant.smoothing import SmoothPair
from anycore.models.llama import MLP, LlamaForCausalLM, MakeLinear
from anycore.models.registry import register
from anycore.models.weight_loading import load_weights


@register("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM", "OlmoeForCausalLM")
class MoeForCausalLM(LlamaForCausalLM):
    def __init__(self, cfg: ModelConfig, ops: KernelOps, dtype: torch.dtype, max_positions: int,
                 linear_method: Callable[[], LinearMethod] | None = None) -> None:
        # a pre-quantized W8A8 checkpoint (compressed-tensors) has int8 experts with their scales:
        # allocated as such (before Module.__init__: make_mlp runs inside the base constructor)
        method = linear_method() if linear_method is not None else None
        self.prequantized_experts = getattr(method, "name", None) == W8A8_INT8 and getattr(method, "prequantized", False)
        super().__init__(cfg, ops, dtype, max_positions, linear_method)

    def make_mlp(self, cfg: ModelConfig, layer_idx: int, ops: KernelOps, dtype: torch.dtype,
                 linear: MakeLinear) -> nn.Module:
        moe = cfg.moe
        if moe is None or layer_idx not in moe.moe_layers:
            return super().make_mlp(cfg, layer_idx, ops, dtype, linear)
        h = cfg.hidden_size
        experts = StackedExperts(moe.num_experts, h, moe.expert_intermediate_size, moe.top_k, moe.norm_topk_prob,
                                 ops, dtype, int8=self.prequantized_experts)
        shared = shared_gate = None
        if moe.shared_expert_intermediate_size:
            shared = MLP(cfg, ops, linear, width=moe.shared_expert_intermediate_size)  # Qwen2-MoE's shared expert
            shared_gate = Router(h, 1, ops, dtype)
        return SparseMoeBlock(Router(h, moe.num_experts, ops, dtype), experts, shared, shared_gate)

    def smooth_pairs(self) -> list[SmoothPair]:
        """The dense pairs, plus each shared expert's up rows -> down (the norm side of a sparse
        MLP is ``sparse_mlp_smoothing``'s)."""
        pairs = super().smooth_pairs()
        for layer in self.layers:
            shared = getattr(layer.mlp, "shared_expert", None)
            if shared is not None:
                pairs.append(SmoothPair(shared.down_proj, shared.gate_up_proj.weight[shared.down_proj.in_features :]))
        return pairs

    def sparse_mlp_smoothing(self) -> list[SparseMlpSmoothing]:
        """Every sparse MLP with the norm that feeds it (anycore.layers.quant.moe_smoothing)."""
        return [SparseMlpSmoothing(layer.mlp, layer.post_attention_layernorm.weight.data) for layer in self.layers
                if isinstance(layer.mlp, SparseMoeBlock)]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # Mixtral names its sparse MLP block_sparse_moe (experts w1/w3/w2: StackedExperts maps them)
        renamed = ((name.replace(".block_sparse_moe.", ".mlp."), t) for name, t in weights)
        load_weights(self, renamed, self.merged_shards, self.config.tie_word_embeddings)
        for module in self.modules():
            if isinstance(module, StackedExperts):
                module.finish_loading()
