"""The native executor: runs a model's decoder layers as one native call when it can.

A model declares its structure (``native_layers()``: per layer, the modules that fill the slots
of csrc/common/decoder_layout.h; ``attention_geometry()``) and runs op by op on its own. This
module, owned by the runner, decides per step which path runs and marshals the arguments:

- **op by op**: the model's Python forward through the kernel table (always available);
- **native stack**: every layer in one ``decoder_stack`` call (a batch-1 bf16 decode inside it
  runs in one OpenMP team, csrc/common/decode_team.cpp);
- **multi-step greedy**: ``steps`` greedy tokens of one request in one ``decode_greedy`` call
  (embedding row, the stack, final norm, logits head and argmax per token).

Invariant: the native paths compose exactly the kernels the op-by-op path calls, in the same
order with the same roundings, so all paths give bit-identical tokens, logprobs and KV pools
(tests/kernels/test_native_paths.py, test_decode_team.py, test_decode_greedy.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from anycore.kernels.ops import KernelOps
from anycore.layers.forward_batch import ForwardBatch
from anycore.layers.linear import Linear

# (hidden, cos, sin, batch) -> (hidden, residual): what runs a model's layers in its forward
LayersFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, ForwardBatch], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class NativeSparseMlp:
    """A sparse MoE MLP in the native slots (anycore/layers/moe.py): its router, its stacked
    experts and, with a shared expert (whose projections are the layer's gate_up / down), the
    shared expert's sigmoid gate."""

    router: nn.Module  # Router: weight [E, hidden] in the activation dtype
    experts: nn.Module  # StackedExperts
    shared_gate: nn.Module | None = None  # Router: weight [1, hidden]


@dataclass(frozen=True)
class NativeLayer:
    """One Llama-family decoder layer as the native stack reads it: pre-norm attention with a
    merged QKV projection (optional bias, optional q/k norm per head or over the whole
    projection, optional q/k/v clamp ``clip_qkv``), then a merged gate/up SwiGLU MLP or a sparse
    MLP (``sparse``; gate_up / down then its shared expert's, or None). Norms are RMSNorm
    modules, projections ``Linear``s."""

    input_norm: nn.Module
    qkv: Linear
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    o: Linear
    post_norm: nn.Module
    gate_up: Linear | None
    down: Linear | None
    sparse: NativeSparseMlp | None = None
    clip_qkv: float | None = None

    def projections(self) -> tuple[Linear | None, ...]:
        return self.qkv, self.o, self.gate_up, self.down


@dataclass(frozen=True)
class AttentionGeometry:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float  # the layers' RMSNorm epsilon
    scale: float


class NativeModel(Protocol):
    """What a model offers the executor (Llama-family: anycore/models/llama.py)."""

    embed_tokens: Any  # VocabEmbedding
    norm: Any  # the final RMSNorm
    lm_head: Any  # LogitsHead
    rotary: Any  # RotaryTable

    def native_layers(self) -> list[NativeLayer] | None: ...

    def attention_geometry(self) -> AttentionGeometry: ...


def native_layout() -> tuple[tuple[str, ...], int]:
    """(slot names of one layer's weights, rows up to which a bf16 projection runs the native
    GEMV), from the extension itself (csrc/common/decoder_layout.h) rather than a Python copy."""
    names = tuple(torch.ops.anycore.decoder_layout())
    return names, int(torch.ops.anycore.native_linear_max_rows())


@dataclass
class _Stack:
    """Every layer's weights converted for ``decoder_stack`` once (``ops.stack_weights``).

    Invariant: valid while ``Linear.generation`` is the one it was built at: no Linear has since
    had its method swapped, a hook added or its storage moved (checked per step in O(1); weights
    updated in place are seen)."""

    dtype: torch.dtype
    generation: int
    native: Any

    def valid(self, dtype: torch.dtype) -> bool:
        return self.dtype == dtype and self.generation == Linear.generation


class NativeExecutor:
    """Chooses and runs the native path for a model; ``enabled = False`` forces op by op (tests
    compare the paths with it)."""

    def __init__(self, model: nn.Module, ops: KernelOps) -> None:
        self.model = model
        self.ops = ops
        self.enabled = True
        self._stack: _Stack | None = None
        self._layout = native_layout() if ops.decoder_stack is not None else None
        self._geometry: AttentionGeometry | None = None

    @property
    def geometry(self) -> AttentionGeometry:
        if self._geometry is None:
            self._geometry = self.model.attention_geometry()
        return self._geometry

    def layers_path(self) -> str:
        """Which path runs the decoder layers, in words (for the engine's start-up log). Builds
        nothing: a model that declares no native layout (``native_layers()`` None) names why in
        its ``op_by_op_reason``."""
        if self.model.native_layers() is None:
            reason = getattr(self.model, "op_by_op_reason", "it declares no native layout")
            return f"op by op ({type(self.model).__name__}: {reason})"
        if self._layout is None:
            return "op by op (no native decoder stack: some fused op is not native here)"
        return "native stack (one call for all layers, where dtype and projections allow)"

    # ---- the one-call layer stack -----------------------------------------------------------
    def layers_fn(self, batch: ForwardBatch) -> LayersFn | None:
        """The native stack as the model's layer loop for this batch, or None: op by op."""
        if batch.k_pool is None:
            return None
        if batch.tree_mask is not None and not self.tree_in_stack:
            return None
        stack = self.stack(self.model.embed_tokens.dtype)
        if stack is None:
            return None
        g = self.geometry

        def run(hidden, cos, sin, b: ForwardBatch):
            return self.ops.decoder_stack(
                hidden, stack.native, b.k_pool, b.v_pool, b.slot_mapping, cos, sin, b.q_start_loc, b.seq_lens,
                b.slot_table, g.num_heads, g.num_kv_heads, g.head_dim, g.eps, g.scale, b.tree_mask)
        return run

    @property
    def tree_in_stack(self) -> bool:
        """Whether a tree verify's mask can run inside the stack: there its attention is the
        tree_attention kernel of paged_attention's variant (one kernel, csrc/common/kernel_table.h),
        so only when the registry chose that same variant for tree_attention (else op by op, where
        the chosen tree_attention runs)."""
        index = self.ops.native_index
        return "tree_attention" in index and index.get("tree_attention") == index.get("paged_attention")

    def stack(self, dtype: torch.dtype) -> _Stack | None:
        """The cached native stack, rebuilt when stale; None when some layer cannot run natively
        (no native kernels, a dtype they lack, a projection without a native multiply, a hooked
        projection: calibration hooks must observe every projection's forward)."""
        if not self.enabled or self._layout is None or dtype not in (torch.float32, torch.bfloat16):
            return None
        stack = self._stack
        if stack is not None and stack.valid(dtype):
            return stack
        self._stack = None  # (a stale stack must not keep replaced weights alive)
        generation = Linear.generation  # read first: a change while building leaves it stale
        layers = self.model.native_layers()
        if layers is None:
            return None
        weights: list[torch.Tensor | None] = []
        impls: list[int] = []
        for layer in layers:
            args = self._layer_args(layer)
            if args is None:
                return None
            weights += args[0]
            impls += args[1]
        self._stack = _Stack(dtype, generation, self.ops.stack_weights(weights, impls))
        return self._stack

    def _layer_args(self, layer: NativeLayer) -> tuple[list, list[int]] | None:
        """One layer's weights in the extension's slot order and its projections' variants."""
        slots: dict[str, torch.Tensor | None] = {
            "input_norm": layer.input_norm.weight,
            "q_norm": layer.q_norm.weight if layer.q_norm is not None else None,
            "k_norm": layer.k_norm.weight if layer.k_norm is not None else None,
            "post_norm": layer.post_norm.weight,
            "clip_qkv": torch.tensor([layer.clip_qkv], dtype=torch.float32) if layer.clip_qkv is not None else None,
        }
        impls = []
        for name, proj in zip(("qkv", "o", "gate_up", "down"), layer.projections()):
            if proj is None:  # (a sparse MLP without a shared expert)
                impls.append(-1)
                continue
            args = proj.native_args()
            if args is None:  # (no native multiply, or hooked)
                return None
            (slots[f"{name}.weight"], slots[f"{name}.scale"], slots[f"{name}.bias"]), index = args
            impls.append(index)
        sparse = self._sparse_args(layer.sparse) if layer.sparse is not None else ({}, [-1, -1])
        if sparse is None:
            return None
        slots.update(sparse[0])
        impls += sparse[1]
        names, _ = self._layout  # type: ignore[misc]
        return [slots.get(n) for n in names], impls

    def _sparse_args(self, sparse: NativeSparseMlp) -> tuple[dict, list[int]] | None:
        """A sparse MLP's slots and its (router, experts) variants, or None when its experts do
        not run on a native fused_moe here (a torch-native table, packed for another variant,
        hooked modules)."""
        ops, experts = self.ops, sparse.experts
        modules = (sparse.router, experts) + ((sparse.shared_gate,) if sparse.shared_gate is not None else ())
        if any(m._forward_pre_hooks or m._forward_hooks for m in modules):
            return None
        if experts.int8_kernel is not None:
            index = ops.native_index.get("fused_moe_w8a8")
            if index is None or experts.int8_kernel is not ops.fused_moe_w8a8:
                return None
            scales = experts.w13_scale, experts.w2_scale
        else:
            index = ops.native_index.get("fused_moe")
            if index is None or not (experts.w13.is_contiguous() and experts.w2.is_contiguous()):
                return None
            scales = None, None
        # the router and shared gate run ops.linear: its native GEMV, or F.linear (-1) as torch-native
        router_index = ops.native_index.get("linear", -1)
        slots = {
            "router.weight": sparse.router.weight,
            "experts.w13": experts.w13, "experts.w2": experts.w2,
            "experts.w13_scale": scales[0], "experts.w2_scale": scales[1],
            "experts.routing": torch.tensor([experts.top_k, int(experts.renormalize)], dtype=torch.int64),
            "shared_gate.weight": sparse.shared_gate.weight if sparse.shared_gate is not None else None,
        }
        return slots, [router_index, index]

    # ---- multi-step greedy --------------------------------------------------------------------
    def can_decode_greedy(self) -> bool:
        return self._greedy_args() is not None

    def decode_greedy(self, token: int, start: int, steps: int, slot_row: torch.Tensor, k_pool: torch.Tensor,
                      v_pool: torch.Tensor) -> list[int]:
        """The next ``steps`` greedy tokens of one request whose last token ``token`` sits at
        position ``start``; ``slot_row`` int64 ``[1, >= start + steps]`` holds its KV slots by
        position. The tokens equal what ``steps`` one-token steps (forward, logits head, argmax)
        would give."""
        return self._decode(self.ops.decode_greedy, token, start, (steps,), slot_row, k_pool, v_pool).tolist()

    def decode_logits(self, tokens: list[int], start: int, slot_row: torch.Tensor, k_pool: torch.Tensor,
                      v_pool: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[n, vocab]`` of one request's ``n`` tokens at positions ``start ..
        start + n - 1`` (one token: a decode step; more: a causal extend, e.g. a chain draft's
        verify), their KV written to ``slot_row``'s slots: the bits the forward and the logits
        head give for that one-request batch."""
        ids = torch.tensor(tokens, dtype=torch.int64)
        return self._decode(self.ops.decode_logits, ids, start, (), slot_row, k_pool, v_pool)

    def _decode(self, op: Callable, token: int | torch.Tensor, start: int, steps: tuple[int, ...],
                slot_row: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
        args = self._greedy_args()
        if args is None or op is None:
            raise RuntimeError("native decode on a model that cannot (check can_decode_greedy first)")
        stack, embed, head, impl = args
        m, g = self.model, self.geometry
        emb = m.embed_tokens
        vocab, hidden = emb.table_shape if emb.shared_head is not None or emb.gguf_qtype is not None else embed[0].shape
        return op(token, start, *steps, embed, impl, vocab, hidden, stack.native, k_pool, v_pool, slot_row,
                  m.rotary.cos, m.rotary.sin, m.norm.weight, head, impl, g.num_heads, g.num_kv_heads, g.head_dim,
                  g.eps, m.norm.eps, g.scale)

    def _greedy_args(self) -> tuple[_Stack, list, list, int] | None:
        """(stack, embedding tensors, head tensors, the head kernel's variant) for
        ``ops.decode_greedy``: the tensors VocabEmbedding.forward and LogitsHead.forward read,
        when activations are bf16, the layers run as one native stack and the head's multiply
        is native (a tied int8 table is read through the head's kernel too)."""
        ops, m = self.ops, self.model
        if not self.enabled:
            return None
        h, emb = m.lm_head, m.embed_tokens
        if ops.decode_greedy is None or emb.dtype != torch.bfloat16:
            return None
        if h.gguf_qtype is not None:
            impl = ops.native_index.get("gguf_linear")
            if impl is None or h.kernels is not ops:
                return None
            head = [h.gguf_qweight, h.gguf_qtype_tensor]
        elif h.int8_kernel is not None:
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
        elif emb.gguf_qtype is not None:
            embed = [emb.gguf_rows, emb.gguf_qtype_tensor]
        elif emb.is_int8:
            embed = [emb.qweight, emb.row_scale]
        else:
            embed = [emb.weight]
        stack = self.stack(torch.bfloat16)
        return None if stack is None else (stack, embed, head, impl)
