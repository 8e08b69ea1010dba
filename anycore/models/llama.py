"""Llama-family decoder: Llama, SmolLM, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm).

Architecture only; the blocks live in anycore.layers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import torch
from torch import nn

from anycore.config import ModelConfig
from anycore.kernels.ops import KernelOps
from anycore.layers.attention import PagedAttention
from anycore.layers.embedding import LogitsHead, VocabEmbedding
from anycore.layers.forward_batch import ForwardBatch
from anycore.layers.linear import Linear, LinearMethod
from anycore.layers.norm import RMSNorm
from anycore.layers.quant.smoothing import SmoothPair, gqa_rows
from anycore.layers.rotary import RotaryTable
from anycore.models.registry import register

MakeLinear = Callable[[int, "int | list[int]", bool], Linear]

# checkpoint projection -> (our merged module, shard index)
_MERGED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, ops: KernelOps, dtype: torch.dtype, linear: MakeLinear) -> None:
        super().__init__()
        d = cfg.head_dim
        self.q_size, self.kv_size = cfg.num_heads * d, cfg.num_kv_heads * d
        self.head_dim = d
        self.qkv_proj = linear(cfg.hidden_size, [self.q_size, self.kv_size, self.kv_size], cfg.attention_bias)
        self.o_proj = linear(self.q_size, cfg.hidden_size, False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps, ops, dtype) if cfg.qk_norm else None
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps, ops, dtype) if cfg.qk_norm else None
        self.attn = PagedAttention(cfg.num_heads, cfg.num_kv_heads, d, layer_idx, ops)
        self.ops = ops

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None:
            t = x.shape[0]
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(t, -1)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(t, -1)
        q = self.ops.apply_rotary(q, cos, sin, self.head_dim)
        k = self.ops.apply_rotary(k, cos, sin, self.head_dim)
        return self.o_proj(self.attn(q, k, v, batch))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: KernelOps, linear: MakeLinear) -> None:
        super().__init__()
        self.gate_up_proj = linear(cfg.hidden_size, [cfg.intermediate_size] * 2, False)
        self.down_proj = linear(cfg.intermediate_size, cfg.hidden_size, False)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))


@dataclass
class _FusedCall:
    """A layer's arguments for ``ops.decoder_layer``, built once (see DecoderLayer._fused_call).

    Invariant: valid while ``Linear.generation`` is the one it was built at (no Linear has since
    had its method swapped, a hook added or weight storage moved); weights updated in place are
    seen."""

    generation: int
    dtype: torch.dtype
    weights: list
    linear_impls: list[int]


_pre_hooks, _post_hooks = attrgetter("_forward_pre_hooks"), attrgetter("_forward_hooks")


def _hooked(linears) -> bool:
    return any(map(_pre_hooks, linears)) or any(map(_post_hooks, linears))


@dataclass
class _FusedStack:
    """Every layer's _FusedCall concatenated for ``ops.decoder_stack``; valid while each layer's
    call is: no Linear has changed method or gained a hook since (``Linear.generation``, checked
    per forward; walking the 120 projections cost ~0.1 ms a decode step with cold caches)."""

    dtype: torch.dtype
    generation: int
    native: Any  # ops.stack_weights(weights, linear_impls): converted for the native call once

    def valid(self) -> bool:
        return self.generation == Linear.generation


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, ops: KernelOps, dtype: torch.dtype, linear: MakeLinear) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, ops, dtype, linear)
        self.mlp = MLP(cfg, ops, linear)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops, dtype)
        self.ops = ops
        self._fused: _FusedCall | None = None

    def fused_args(self, dtype: torch.dtype) -> tuple[list, list[int]] | None:
        """(weights, linear variant indices) for ``ops.decoder_layer``, or None to run unfused:
        no fused kernel, a dtype it lacks, or a projection without a native equivalent."""
        if self.ops.decoder_layer is None or dtype not in (torch.float32, torch.bfloat16):
            return None
        attn, mlp = self.self_attn, self.mlp
        projections = [p.fused_args() for p in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
        if any(p is None for p in projections):
            return None
        (qkv, qkv_i), (o, o_i), (gate_up, gate_up_i), (down, down_i) = projections  # type: ignore[misc]
        q_norm = attn.q_norm.weight if attn.q_norm is not None else None
        k_norm = attn.k_norm.weight if attn.k_norm is not None else None
        # order: csrc/common/decoder_layer.cpp WeightIndex
        weights = [self.input_layernorm.weight, *qkv, q_norm, k_norm, *o, self.post_attention_layernorm.weight,
                   *gate_up, *down]
        return weights, [qkv_i, o_i, gate_up_i, down_i]

    def _fused_call(self, dtype: torch.dtype) -> _FusedCall | None:
        """The cached fused_args, rebuilt when Linear.generation moved (a method swapped by online
        quantization, a hook, moved storage) or the dtype changed; None while any projection has
        hooks."""
        if self.ops.decoder_layer is None:
            return None
        call = self._fused
        if call is not None and call.dtype == dtype and call.generation == Linear.generation:
            return call
        self._fused = None
        attn, mlp = self.self_attn, self.mlp
        if _hooked((attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)):
            # hooked (calibration): nothing is cached either, since a cache made now would keep
            # the float weights alive while online quantization replaces them
            return None
        generation = Linear.generation  # read first: a change while building leaves the call stale
        args = self.fused_args(dtype)
        if args is None:
            return None
        self._fused = _FusedCall(generation, dtype, *args)
        return self._fused

    def forward(self, hidden, residual, cos, sin, batch: ForwardBatch):
        fused = self._fused_call(hidden.dtype)
        if fused is not None:
            attn = self.self_attn.attn
            i = attn.layer_idx
            return self.ops.decoder_layer(
                hidden, residual, fused.weights, fused.linear_impls, batch.k_cache[i], batch.v_cache[i],
                batch.slot_mapping, cos, sin, batch.q_start_loc, batch.seq_lens, batch.slot_table,
                attn.num_heads, attn.num_kv_heads, attn.head_dim, self.input_layernorm.eps, attn.scale,
            )
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

        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, ops, dtype, linear) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops, dtype)
        self.lm_head = LogitsHead(
            cfg.vocab_size, cfg.hidden_size, dtype, self.embed_tokens if cfg.tie_word_embeddings else None, ops
        )
        self.rotary = RotaryTable(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, max_positions)
        self.ops = ops
        self._stack: _FusedStack | None = None

    def _fused_stack(self, dtype: torch.dtype) -> _FusedStack | None:
        """All layers as one native call, or None (some layer runs unfused: no fused kernel, a
        projection without a native multiply, or a hooked projection)."""
        if self.ops.decoder_stack is None:
            return None
        stack = self._stack
        if stack is not None and stack.dtype == dtype and stack.valid():
            return stack
        self._stack = None  # (an invalid stack must not keep replaced weights alive)
        generation = Linear.generation  # read first: a change while building leaves the stack stale
        calls = [layer._fused_call(dtype) for layer in self.layers]
        if any(c is None for c in calls):
            return None
        native = self.ops.stack_weights([w for c in calls for w in c.weights], [i for c in calls for i in c.linear_impls])
        self._stack = _FusedStack(dtype, generation, native)
        return self._stack

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Final hidden states of the rows in ``batch.logits_indices``."""
        cos, sin = self.rotary.lookup(batch.positions)
        hidden = self.embed_tokens(batch.input_ids)
        stack = self._fused_stack(hidden.dtype) if batch.k_pool is not None else None
        if stack is not None:
            attn = self.layers[0].self_attn.attn
            hidden, residual = self.ops.decoder_stack(
                hidden, stack.native, batch.k_pool, batch.v_pool, batch.slot_mapping, cos, sin,
                batch.q_start_loc, batch.seq_lens, batch.slot_table, attn.num_heads, attn.num_kv_heads,
                attn.head_dim, self.layers[0].input_layernorm.eps, attn.scale,
            )
        else:
            residual = None
            for layer in self.layers:
                hidden, residual = layer(hidden, residual, cos, sin, batch)
        idx = batch.logits_indices
        hidden, _ = self.norm(hidden[idx], residual[idx])
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def can_decode_greedy(self) -> bool:
        """Whether ``decode_greedy`` can run: the layers as one native stack, a native head."""
        return self._greedy_args() is not None

    def decode_greedy(self, token: int, start: int, steps: int, slot_row: torch.Tensor, k_pool: torch.Tensor,
                      v_pool: torch.Tensor) -> list[int] | None:
        """The next ``steps`` greedy tokens of one request whose last token ``token`` sits at
        position ``start``, in one native call (``ops.decode_greedy``: per token the forward, the
        logits and their argmax, as ``forward``, ``compute_logits`` and the sampler run them);
        ``slot_row`` int64 ``[1, >= start + steps]`` holds the request's KV slots by position.
        None when this model cannot (see can_decode_greedy)."""
        args = self._greedy_args()
        if args is None:
            return None
        stack, embed, head, impl = args
        attn = self.layers[0].self_attn.attn
        vocab, hidden = embed[0].shape if len(embed) < 3 else self.embed_tokens.table_shape
        tokens = self.ops.decode_greedy(
            token, start, steps, embed, impl, vocab, hidden, stack.native, k_pool, v_pool, slot_row, self.rotary.cos,
            self.rotary.sin, self.norm.weight, head, impl, attn.num_heads, attn.num_kv_heads, attn.head_dim,
            self.layers[0].input_layernorm.eps, self.norm.eps, attn.scale,
        )
        return tokens.tolist()

    def _greedy_args(self) -> tuple[_FusedStack, list, list, int] | None:
        """(stack, embedding tensors, head tensors, variant index of the head's kernel) for
        ``ops.decode_greedy``: the tensors VocabEmbedding.forward and LogitsHead.forward use, when
        the activations are bf16, the layers run as one native stack and the head's multiply is
        native (a tied int8 table is read through the head's kernel too)."""
        ops, h, emb = self.ops, self.lm_head, self.embed_tokens
        if ops.decode_greedy is None or emb.dtype != torch.bfloat16:
            return None
        if h.int8_kernel is not None:
            impl = ops.native_index.get("w8a8_linear")
            if impl is None or h.int8_kernel is not ops.w8a8_linear:
                return None
            head = [h.qweight_packed, h.w_scale, h.inv_smooth]
        else:
            impl = ops.native_index.get("linear")
            weight = h.tied_to.weight if h.tied_to is not None else h.weight
            if impl is None or h.matmul is not ops.linear or weight.dtype != torch.bfloat16 or not weight.is_contiguous():
                return None
            head = [weight]
        if emb.shared_head is not None:
            if emb.shared_head is not h:
                return None
            embed = head
        elif emb.is_int8:
            embed = [emb.qweight, emb.row_scale]
        else:
            embed = [emb.weight]
        stack = self._fused_stack(torch.bfloat16)
        return None if stack is None else (stack, embed, head, impl)

    def smooth_pairs(self) -> list[SmoothPair]:
        """Where activation smoothing can be folded (see anycore.layers.quant.smoothing)."""
        cfg = self.config
        o_from_v = gqa_rows(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)  # o input channel -> v row
        pairs = []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            up_rows = mlp.gate_up_proj.weight[mlp.down_proj.in_features :]
            v_start = attn.q_size + attn.kv_size
            v_bias = attn.qkv_proj.bias[v_start:] if attn.qkv_proj.bias is not None else None
            pairs += [
                SmoothPair(attn.qkv_proj, layer.input_layernorm.weight),
                SmoothPair(mlp.gate_up_proj, layer.post_attention_layernorm.weight),
                SmoothPair(mlp.down_proj, up_rows),
                SmoothPair(attn.o_proj, attn.qkv_proj.weight[v_start:], v_bias, o_from_v),
            ]
        return pairs

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            path = name.removeprefix("model.")
            module_path, kind = path.rsplit(".", 1)
            parent, _, leaf = module_path.rpartition(".")
            if leaf in _MERGED:
                merged, shard = _MERGED[leaf]
                layer = self.get_submodule(f"{parent}.{merged}")
                layer.load(kind, tensor, shard)
                loaded.add(f"{parent}.{merged}.{kind}#{shard}")
                continue
            try:
                module = self.get_submodule(module_path)
            except AttributeError:
                raise ValueError(f"checkpoint tensor {name!r} matches no parameter of {type(self).__name__}") from None
            if isinstance(module, Linear):
                module.load(kind, tensor)
            else:
                param = getattr(module, kind)
                if tuple(param.shape) != tuple(tensor.shape):
                    raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
                param.data.copy_(tensor)
            loaded.add(module_path + "." + kind)
        self._check_complete(loaded)
        for module in self.modules():
            if isinstance(module, Linear):
                module.method.process_weights_after_loading(module)

    def _check_complete(self, loaded: set[str]) -> None:
        missing = []
        for name, module in self.named_modules():
            if isinstance(module, Linear):
                kinds = module.param_kinds()
                shards = range(len(module.out_sizes))
                for kind in kinds:
                    keys = [f"{name}.{kind}#{s}" for s in shards] if len(module.out_sizes) > 1 else [f"{name}.{kind}"]
                    missing += [k for k in keys if k not in loaded]
            elif isinstance(module, (RMSNorm, VocabEmbedding)) or (isinstance(module, LogitsHead) and module.tied_to is None):
                if f"{name}.weight" not in loaded:
                    missing.append(f"{name}.weight")
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:4]}")
