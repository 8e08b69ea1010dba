"""Llama-family decoder: Llama, SmolLM, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm).

The Mixture-of-Experts models (models/moe.py) are this decoder with a sparse MLP in some layers
(``make_mlp``) and, for OLMoE, q/k norms over the whole projection (``ModelConfig.qk_norm_full``).

Architecture only: the blocks live in anycore.layers, weight loading in models/weight_loading.py,
and the native paths (one-call layer stack, multi-step greedy) in engine/native_executor.py,
which reads the structure this file declares (``native_layers``, ``attention_geometry``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from anycore.config import ModelConfig
from anycore.engine.native_executor import AttentionGeometry, LayersFn, NativeLayer, NativeSparseMlp
from anycore.kernels.ops import KernelOps
from anycore.layers.attention import PagedAttention
from anycore.layers.embedding import LogitsHead, VocabEmbedding
from anycore.layers.forward_batch import ForwardBatch
from anycore.layers.linear import Linear, LinearMethod
from anycore.layers.moe import SparseMoeBlock
from anycore.layers.norm import RMSNorm
from anycore.layers.quant.smoothing import SmoothPair, gqa_rows
from anycore.layers.rotary import RotaryTable
from anycore.models.registry import register
from anycore.models.weight_loading import load_weights

MakeLinear = Callable[[int, "int | list[int]", bool], Linear]

class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, ops: KernelOps, dtype: torch.dtype, linear: MakeLinear) -> None:
        super().__init__()
        d = cfg.head_dim
        self.q_size, self.kv_size = cfg.num_heads * d, cfg.num_kv_heads * d
        self.head_dim = d
        self.qkv_proj = linear(cfg.hidden_size, [self.q_size, self.kv_size, self.kv_size], cfg.attention_bias)
        self.o_proj = linear(self.q_size, cfg.hidden_size, False)
        # per head (Qwen3), or over the whole q / k projection (OLMoE: qk_norm_full)
        self.qk_norm_full = cfg.qk_norm_full
        q_width, k_width = (self.q_size, self.kv_size) if cfg.qk_norm_full else (d, d)
        self.q_norm = RMSNorm(q_width, cfg.rms_norm_eps, ops, dtype) if cfg.qk_norm else None
        self.k_norm = RMSNorm(k_width, cfg.rms_norm_eps, ops, dtype) if cfg.qk_norm else None
        self.clip_qkv = cfg.clip_qkv
        self.attn = PagedAttention(cfg.num_heads, cfg.num_kv_heads, d, layer_idx, ops)
        self.ops = ops

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None and self.qk_norm_full:
            q, k = self.q_norm(q.contiguous()), self.k_norm(k.contiguous())
        elif self.q_norm is not None:
            t = x.shape[0]
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(t, -1)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(t, -1)
        if self.clip_qkv is not None:
            c = self.clip_qkv
            q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
        q = self.ops.apply_rotary(q, cos, sin, self.head_dim)
        k = self.ops.apply_rotary(k, cos, sin, self.head_dim)
        return self.o_proj(self.attn(q, k, v, batch))


class MLP(nn.Module):
    """Gated MLP: down(act(gate) * up), ``activation`` the kernel op that fuses act-and-mul
    (SwiGLU's silu_and_mul; Gemma's GeGLU is gelu_tanh_and_mul), ``width`` the intermediate
    size (default the config's; Qwen2-MoE's shared expert has its own)."""

    def __init__(self, cfg: ModelConfig, ops: KernelOps, linear: MakeLinear, activation: str = "silu_and_mul",
                 width: int | None = None) -> None:
        super().__init__()
        width = width or cfg.intermediate_size
        self.gate_up_proj = linear(cfg.hidden_size, [width] * 2, False)
        self.down_proj = linear(width, cfg.hidden_size, False)
        self.ops = ops
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(getattr(self.ops, self.activation)(self.gate_up_proj(x)))


def _is_swiglu(mlp: nn.Module) -> bool:
    return isinstance(mlp, MLP) and mlp.activation == "silu_and_mul"


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, ops: KernelOps, dtype: torch.dtype, linear: MakeLinear,
                 mlp: nn.Module) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, ops, dtype, linear)
        self.mlp = mlp  # (dense SwiGLU, or a sparse MoE block: anycore/layers/moe.py)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops, dtype)

    def native_layer(self) -> NativeLayer | None:
        """The layer in the native stack's slots, or None when it has a block they lack (an MLP
        other than SwiGLU or a sparse MLP of SwiGLU experts)."""
        attn, mlp = self.self_attn, self.mlp
        sparse = None
        if isinstance(mlp, SparseMoeBlock):
            shared = mlp.shared_expert
            if shared is not None and not _is_swiglu(shared):
                return None
            sparse = NativeSparseMlp(mlp.gate, mlp.experts, mlp.shared_expert_gate)
            gate_up, down = (shared.gate_up_proj, shared.down_proj) if shared is not None else (None, None)
        elif _is_swiglu(mlp):
            gate_up, down = mlp.gate_up_proj, mlp.down_proj
        else:
            return None
        return NativeLayer(self.input_layernorm, attn.qkv_proj, attn.q_norm, attn.k_norm, attn.o_proj,
                           self.post_attention_layernorm, gate_up, down, sparse, attn.clip_qkv)

    def forward(self, hidden, residual, cos, sin, batch: ForwardBatch):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, cos, sin, batch)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


@register("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
class LlamaForCausalLM(nn.Module):
    # our merged module -> the checkpoint projections stacked in it, in shard order
    merged_shards = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(
        self, cfg: ModelConfig, ops: KernelOps, dtype: torch.dtype, max_positions: int,
        linear_method: Callable[[], LinearMethod] | None = None,
    ) -> None:
        super().__init__()
        self.config = cfg

        def linear(in_features: int, out_sizes: int | list[int], bias: bool) -> Linear:
            return Linear(in_features, out_sizes, bias, dtype, ops, linear_method() if linear_method else None)

        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, dtype, ops)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, ops, dtype, linear, self.make_mlp(cfg, i, ops, dtype, linear))
                                    for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops, dtype)
        self.lm_head = LogitsHead(
            cfg.vocab_size, cfg.hidden_size, dtype, self.embed_tokens if cfg.tie_word_embeddings else None, ops
        )
        self.rotary = RotaryTable(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, max_positions)

    def make_mlp(self, cfg: ModelConfig, layer_idx: int, ops: KernelOps, dtype: torch.dtype,
                 linear: MakeLinear) -> nn.Module:
        """Layer ``layer_idx``'s MLP (an architecture with other MLPs overrides this)."""
        return MLP(cfg, ops, linear)

    def forward(self, batch: ForwardBatch, layers: LayersFn | None = None) -> torch.Tensor:
        """Final hidden states of the rows in ``batch.logits_indices``. ``layers`` replaces the
        op-by-op layer loop (the runner passes the native stack when it applies)."""
        cos, sin = self.rotary.lookup(batch.positions)
        hidden = self.embed_tokens(batch.input_ids)
        capture = batch.capture_layers
        if capture:  # (intermediate layers: the op-by-op loop, the native stack runs them all in one call)
            layers = None
        hidden, residual = (layers or self._run_layers)(hidden, cos, sin, batch)
        idx = batch.logits_indices
        if capture == ():  # the final normed state of every row (rows are normed independently)
            batch.captured, _ = self.norm(hidden, residual)
            return batch.captured[idx]
        hidden, _ = self.norm(hidden[idx], residual[idx])
        return hidden

    def _run_layers(self, hidden, cos, sin, batch: ForwardBatch):
        residual = None
        capture = batch.capture_layers or ()
        taken: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if i in capture:
                taken[i] = hidden if residual is None else hidden + residual
            hidden, residual = layer(hidden, residual, cos, sin, batch)
        if capture:
            taken[len(self.layers)] = hidden + residual
            batch.captured = torch.cat([taken[i] for i in capture], dim=-1)
        return hidden, residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    # ---- declared structure (the native executor, quantization) -------------------------------
    def native_layers(self) -> list[NativeLayer] | None:
        """Every layer's native slots; None (op by op) when some layer has none."""
        layers = [layer.native_layer() for layer in self.layers]
        return None if any(layer is None for layer in layers) else layers

    def attention_geometry(self) -> AttentionGeometry:
        attn = self.layers[0].self_attn.attn
        return AttentionGeometry(attn.num_heads, attn.num_kv_heads, attn.head_dim, self.config.rms_norm_eps,
                                 attn.scale)

    def smooth_pairs(self) -> list[SmoothPair]:
        """Where activation smoothing can be folded (see anycore.layers.quant.smoothing)."""
        cfg = self.config
        o_from_v = gqa_rows(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)  # o input channel -> v row
        pairs = []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            v_start = attn.q_size + attn.kv_size
            v_bias = attn.qkv_proj.bias[v_start:] if attn.qkv_proj.bias is not None else None
            pairs.append(SmoothPair(attn.qkv_proj, layer.input_layernorm.weight))
            if isinstance(mlp, MLP):  # (a sparse MLP: MoeForCausalLM.sparse_mlp_smoothing)
                up_rows = mlp.gate_up_proj.weight[mlp.down_proj.in_features :]
                pairs += [SmoothPair(mlp.gate_up_proj, layer.post_attention_layernorm.weight),
                          SmoothPair(mlp.down_proj, up_rows)]
            pairs.append(SmoothPair(attn.o_proj, attn.qkv_proj.weight[v_start:], v_bias, o_from_v))
        return pairs

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_weights(self, weights, self.merged_shards, self.config.tie_word_embeddings)
