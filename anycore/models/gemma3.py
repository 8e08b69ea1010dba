"""Gemma 3 text decoder (transformers' Gemma3ForCausalLM, model_type gemma3_text).

What differs from the Llama family (anycore/models/llama.py):
- RMSNorm scales by ``1 + weight`` in fp32 before casting back (``ops.gemma_rms_norm``), and
  each layer has four of them: around attention (pre and post) and around the MLP (pre and post),
  each branch normed before it is added to the residual; q and k are normed per head;
- the MLP is GeGLU with the tanh GELU (``ops.gelu_tanh_and_mul``);
- embeddings are multiplied by sqrt(hidden_size), rounded to the embedding dtype first;
- attention scale ``query_pre_attn_scalar ** -0.5``; sliding layers see only the last
  ``sliding_window`` keys (``ops.paged_attention_window``) and use their own RoPE base
  (``rope_local_base_freq``, no scaling), global layers ``rope_theta`` with ``rope_scaling``;
- optional tanh soft-capping of the final logits; tied embeddings. (``attn_logit_softcapping``
  is refused: transformers' Gemma 3 never applies it; the attention op can, for Gemma 2.)

The native decoder stack (csrc/common/decoder_layer.cpp) has one Llama layer shape: one norm
before attention and one before the MLP, SiLU, unwindowed attention, (x * w) norms. It cannot
express these layers, so ``native_layers()`` returns None and the NativeExecutor runs this model
op by op (the engine logs it, ``anycore doctor`` says which architectures do).

Sliding layers and the KV pool: a sliding layer's attention reads only the K/V of the last
``sliding_window`` positions (``paged_attention_window`` gathers only those slots, and a
decode-only batch runs the plain ``paged_attention`` op over a slot table cut to each request's
window, ``anycore.layers.attention.decode_window_view``), and keeps only those: the engine gives
the sliding layers a window pool of their own, whose slots go back as the window moves
(anycore/cache/swa.py; the attention layer picks the window pool's slot table for them). This
file needs nothing for it beyond declaring which layers slide (``layer_sliding_windows``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from anycore.config import ModelConfig
from anycore.engine.native_executor import LayersFn, NativeLayer
from anycore.kernels.ops import KernelOps
from anycore.layers.attention import PagedAttention
from anycore.layers.embedding import LogitsHead, VocabEmbedding
from anycore.layers.forward_batch import ForwardBatch
from anycore.layers.linear import Linear, LinearMethod
from anycore.layers.norm import RMSNorm
from anycore.layers.rotary import RotaryTable
from anycore.models.llama import MLP
from anycore.models.registry import register
from anycore.models.weight_loading import load_weights

MakeLinear = Callable[[int, "int | list[int]", bool], Linear]


class GemmaRMSNorm(RMSNorm):
    """RMSNorm with a zero-centred weight: ``norm(x) * (1 + weight)`` in fp32 (HF Gemma3RMSNorm).
    A subclass of RMSNorm so weight loading checks it like every norm; it never takes a residual."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if residual is not None:
            raise ValueError("GemmaRMSNorm takes no residual (Gemma adds the residual after its post-norms)")
        return self.ops.gemma_rms_norm(x, self.weight, self.eps)


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, ops: KernelOps, dtype: torch.dtype, linear: MakeLinear) -> None:
        super().__init__()
        d = cfg.head_dim
        self.q_size, self.kv_size = cfg.num_heads * d, cfg.num_kv_heads * d
        self.head_dim = d
        self.qkv_proj = linear(cfg.hidden_size, [self.q_size, self.kv_size, self.kv_size], cfg.attention_bias)
        self.o_proj = linear(self.q_size, cfg.hidden_size, cfg.attention_bias)
        self.q_norm = GemmaRMSNorm(d, cfg.rms_norm_eps, ops, dtype)
        self.k_norm = GemmaRMSNorm(d, cfg.rms_norm_eps, ops, dtype)
        window = cfg.layer_sliding_windows[layer_idx] if cfg.layer_sliding_windows else None
        scale = (cfg.query_pre_attn_scalar or d) ** -0.5
        self.attn = PagedAttention(cfg.num_heads, cfg.num_kv_heads, d, layer_idx, ops, scale=scale,
                                   sliding_window=window)
        self.ops = ops

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(-1, self.head_dim)).view(t, -1)
        k = self.k_norm(k.reshape(-1, self.head_dim)).view(t, -1)
        q = self.ops.apply_rotary(q, cos, sin, self.head_dim)
        k = self.ops.apply_rotary(k, cos, sin, self.head_dim)
        return self.o_proj(self.attn(q, k, v, batch))


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, ops: KernelOps, dtype: torch.dtype, linear: MakeLinear) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Gemma3Attention(cfg, layer_idx, ops, dtype, linear)
        self.mlp = MLP(cfg, ops, linear, activation="gelu_tanh_and_mul")
        self.input_layernorm = GemmaRMSNorm(h, eps, ops, dtype)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps, ops, dtype)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps, ops, dtype)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps, ops, dtype)
        self.is_sliding = self.self_attn.attn.sliding_window is not None

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(hidden), cos, sin, batch)
        hidden = hidden + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(hidden))
        return hidden + self.post_feedforward_layernorm(mlp)


@register("Gemma3ForCausalLM")
class Gemma3ForCausalLM(nn.Module):
    op_by_op_reason = ("the native decoder stack cannot express Gemma 3 layers (four (1 + w) norms, GeGLU, "
                       "sliding-window attention)")
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
        # transformers keeps sqrt(hidden) as an fp32 tensor and casts it to the table's dtype
        # before multiplying (bf16: sqrt(640) = 25.298 becomes 25.25)
        self.embed_scale = torch.tensor(cfg.hidden_size**0.5, dtype=torch.float32).to(dtype)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg, i, ops, dtype, linear) for i in range(cfg.num_layers))
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops, dtype)
        self.lm_head = LogitsHead(
            cfg.vocab_size, cfg.hidden_size, dtype, self.embed_tokens if cfg.tie_word_embeddings else None, ops
        )
        self.rotary = RotaryTable(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, max_positions)  # global layers
        self.rotary_local = (
            RotaryTable(cfg.head_dim, cfg.rope_local_theta or cfg.rope_theta, None, max_positions)
            if any(layer.is_sliding for layer in self.layers) else None
        )

    def forward(self, batch: ForwardBatch, layers: LayersFn | None = None) -> torch.Tensor:
        """Final hidden states of the rows in ``batch.logits_indices``; always op by op."""
        if layers is not None:
            raise ValueError("Gemma3ForCausalLM declares no native layout; it cannot run a native layer stack")
        rope_global = self.rotary.lookup(batch.positions)
        rope_local = self.rotary_local.lookup(batch.positions) if self.rotary_local is not None else None
        hidden = self.embed_tokens(batch.input_ids) * self.embed_scale
        for layer in self.layers:
            cos, sin = rope_local if layer.is_sliding else rope_global
            hidden = layer(hidden, cos, sin, batch)
        return self.norm(hidden[batch.logits_indices])

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcapping
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def native_layers(self) -> list[NativeLayer] | None:
        return None  # see the module docstring: op by op

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_weights(self, weights, self.merged_shards, self.config.tie_word_embeddings)
