"""The kernel-op registry: one ``OpSpec`` per op, and the table of implementations a model calls.

``OP_SPECS`` is the one list of ops; everything else is derived from it: ``OP_NAMES``, the ops
each native variant declares (``anycore.platform.selection``, by kernel family), the
torch-native table (``torch_native_ops``), the binding of a native variant and of the reference
(``anycore.kernels.dispatch``) and the attributes of ``KernelOps`` (``ops.rms_norm``).

A model never imports a kernel directly; it receives a ``KernelOps`` and calls through it, so
the dispatch layer can swap native variants in and tests can run the same model on the
reference ops.

Native calling convention: ``torch.ops.anycore.<name>`` takes the reference's arguments in the
reference's order, then the variant index (``int impl``; csrc/common/ops.cpp); the binding calls
it when the spec's ``native_when`` accepts the arguments and the torch-native implementation
otherwise. tests/kernels/test_op_registry.py checks each schema against the reference's
signature. Adding an op: csrc/README.md, "Adding an op".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from anycore.kernels import gguf, int8, moe, moe_int8, reference, shm_all_reduce, torch_native
from anycore.kernels.tree_attention import tree_attention_reference, tree_attention_torch

# C++ kernel families (csrc/common/kernel_table.h ANYCORE_<FAMILY>_KERNELS, int8_impl.h, gguf_impl.h):
# a native variant declares ops by family in anycore/platform/selection.py
FAMILIES = ("elementwise", "attention", "gemv", "int8", "gguf")
_NATIVE_DTYPES = (torch.float32, torch.bfloat16)
_MAX_HEAD_DIM = 512  # kMaxHeadDim, csrc/common/kernel_table.h
_MAX_ATTN_ROWS = 64  # kMaxAttnRows there: the largest GQA group (heads per kv head)


@functools.cache
def native_linear_max_rows() -> int:
    """Rows up to which the native bf16 linear runs rather than F.linear (oneDNN) on this host:
    the extension's own rule (csrc/common/decoder_layout.h native_linear_max_rows: 16, or 8 on
    x86 with AMX-BF16), so the `linear` op and the native stack cannot disagree. Asked only when
    a native linear is bound, i.e. once the extension is loaded."""
    return int(torch.ops.anycore.native_linear_max_rows())


@dataclass(frozen=True)
class OpSpec:
    """One kernel op: its oracle, its portable implementation, and how a native variant runs it."""

    name: str
    reference: Callable  # the oracle every implementation is tested against (kernels/reference.py)
    torch_native: Callable  # the fallback on every CPU, same signature (the reference where fast enough)
    # the C++ kernel family with a native kernel for this op; "" = torch-native only
    family: str = ""
    # native_when(*args) -> True when the native kernel takes these arguments (dtypes, shapes);
    # else the torch-native implementation runs. None: always native.
    native_when: Callable[..., bool] | None = None
    # bind(variant index, variant name) -> the op, for ops whose native form is not one
    # guarded call (w8a8_linear: an Int8Linear with the variant's own weight packer)
    bind: Callable[[int, str], Callable] | None = None
    doc: str = ""


def _native_floats(x: torch.Tensor, *same: torch.Tensor) -> bool:
    """fp32/bf16 input, and the other tensors in the same dtype."""
    return x.dtype in _NATIVE_DTYPES and all(t.dtype == x.dtype for t in same)


def _linear_native_when(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    # Native only for bf16 with at most native_linear_max_rows() rows (decode GEMV, small decode
    # batches; measured faster than F.linear/oneDNN on x86, see selection.py for why Arm uses
    # it). More rows, fp32, or odd layouts go to F.linear.
    return (x.dtype is torch.bfloat16 and weight.dtype is torch.bfloat16
            and x.numel() <= native_linear_max_rows() * x.shape[-1]
            and weight.is_contiguous() and x.stride(-1) == 1)


def _fused_moe_native_when(x, router_logits, w13, w2, top_k, renormalize, w13_scale=None, w2_scale=None) -> bool:
    # csrc/common/fused_moe.cpp: float experts in the activation dtype (the variant's GEMV for
    # bf16 experts with at most native_linear_max_rows() rows, at::mm otherwise), or int8 experts
    # with fp32 scales (at::_int_mm: the torch-native steps without the Python between them)
    if x.dim() != 2 or x.dtype not in _NATIVE_DTYPES:
        return False
    if w13_scale is None:
        return _native_floats(x, w13, w2) and w13.is_contiguous() and w2.is_contiguous()
    return (w13.dtype is torch.int8 and w2.dtype is torch.int8 and w2_scale is not None
            and w13_scale.dtype is torch.float32 and w2_scale.dtype is torch.float32)
def _tree_native_when(q, k_cache, v_cache, q_start_loc, seq_lens, slot_table, mask, scale) -> bool:
    # csrc/common/ops.cpp tree_attention: q, K and V of one float dtype, 3-D with contiguous head
    # dims, a GQA group the kernel's rows hold, a 2-D bool mask; anything else goes to SDPA
    if q.dim() != 3 or k_cache.dim() != 3 or not _native_floats(q, k_cache, v_cache):
        return False
    heads, kv = q.shape[1], k_cache.shape[1]
    return (q.shape[-1] <= _MAX_HEAD_DIM and kv > 0 and heads % kv == 0 and heads // kv <= _MAX_ATTN_ROWS
            and q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
            and mask.dtype is torch.bool and mask.dim() == 2)


def _gguf_native_when(x: torch.Tensor, qweight: torch.Tensor, qtype: int, bias: torch.Tensor | None = None) -> bool:
    return x.dtype in _NATIVE_DTYPES and qtype in gguf.FORMATS and qweight.dtype is torch.uint8


OP_SPECS: tuple[OpSpec, ...] = (
    OpSpec("rms_norm", reference.rms_norm, reference.rms_norm, "elementwise",
           lambda x, weight, eps: _native_floats(x, weight), doc="rms_norm(x, weight, eps)"),
    OpSpec("add_rms_norm", reference.add_rms_norm, reference.add_rms_norm, "elementwise",
           lambda x, residual, weight, eps: _native_floats(x, residual, weight),
           doc="add_rms_norm(x, residual, weight, eps) -> (normed, x + residual)"),
    OpSpec("apply_rotary", reference.apply_rotary, reference.apply_rotary, "elementwise",
           lambda x, cos, sin, head_dim: _native_floats(x), doc="apply_rotary(x, cos, sin, head_dim)"),
    OpSpec("silu_and_mul", reference.silu_and_mul, reference.silu_and_mul, "elementwise",
           lambda x: _native_floats(x), doc="silu_and_mul(x [.., 2d]) -> [.., d]"),
    OpSpec("paged_attention", reference.paged_attention, torch_native.paged_attention, "attention",
           lambda q, k_cache, v_cache, q_start_loc, seq_lens, slot_table, scale:
               _native_floats(q) and q.shape[-1] <= _MAX_HEAD_DIM,
           doc="paged_attention(q, k_cache, v_cache, q_start_loc, seq_lens, slot_table, scale)"),
    OpSpec("linear", reference.linear, torch_native.linear, "gemv", _linear_native_when,
           doc="linear(x, weight, bias=None): F.linear's semantics (native for bf16 decode GEMV)"),
    OpSpec("w8a8_linear", int8.REFERENCE_W8A8, int8.TORCH_NATIVE_W8A8, "int8", bind=int8.native_int8_linear,
           doc="w8a8_linear(x, packed, w_scale, bias=None), an Int8Linear: its pack(qweight [N, K]) makes "
               "`packed` once at load in the implementation's own layout (anycore.kernels.int8)"),
    OpSpec("fused_moe", moe.fused_moe_reference, moe.fused_moe_torch, "gemv", _fused_moe_native_when,
           doc="fused_moe(x [T, H], router_logits [T, E], w13 [E, 2I, H], w2 [E, H, I], top_k, renormalize, "
               "w13_scale=None, w2_scale=None): one MoE layer's routed experts, combined (anycore.kernels.moe); "
               "int8 weights when the scales are given"),
    OpSpec("fused_moe_w8a8", moe_int8.REFERENCE_MOE_W8A8, moe_int8.TORCH_NATIVE_MOE_W8A8, "int8",
           bind=moe_int8.native_int8_moe,
           doc="fused_moe_w8a8(x, router_logits, w13, w2, top_k, renormalize, w13_scale, w2_scale), an Int8Moe: "
               "its pack(qweight int8 [E, N, K]) makes the packed experts once at load in the implementation's "
               "own layout, run on its int8 kernels (anycore.kernels.moe_int8)"),
    # Gemma 3's ops (the native decoder stack cannot express Gemma's layers, so those models
    # run op by op, on these kernels where native)
    OpSpec("gemma_rms_norm", reference.gemma_rms_norm, reference.gemma_rms_norm, "elementwise",
           lambda x, weight, eps: _native_floats(x, weight),
           doc="gemma_rms_norm(x, weight, eps): normed * (1 + weight) in fp32, cast to x's dtype"),
    OpSpec("gelu_tanh_and_mul", reference.gelu_tanh_and_mul, reference.gelu_tanh_and_mul, "elementwise",
           lambda x: _native_floats(x), doc="gelu_tanh_and_mul(x [.., 2d]) -> [.., d] (GeGLU)"),
    OpSpec("paged_attention_window", reference.paged_attention_window, torch_native.paged_attention_window,
           "attention",
           lambda q, k_cache, v_cache, q_start_loc, seq_lens, slot_table, scale, window, softcap:
               _native_floats(q) and q.shape[-1] <= _MAX_HEAD_DIM,
           doc="paged_attention_window(q, k_cache, v_cache, q_start_loc, seq_lens, slot_table, scale, window, "
               "softcap): sliding-window (window > 0) and/or soft-capped (softcap > 0) paged attention"),
    # speculative tree verification (anycore/spec/tree.py): paged_attention's kernel with a mask.
    # Measured on x86 (avx512_bf16), SmolLM2 shapes (9 q / 3 kv heads, dim 64, bf16 KV), one
    # request, 500 cached keys, random trees of 10/16/20 rows, min of 300 calls: 1 thread native
    # 102/156/190 us vs torch-native (SDPA) 472/578/677 us; 2 threads 71/104/121 vs 304/367/533 us.
    # The mask costs ~2% over the causal kernel on the same shape (154 vs 150 us).
    OpSpec("tree_attention", tree_attention_reference, tree_attention_torch, "attention", _tree_native_when,
           doc="tree_attention(q, k_cache, v_cache, q_start_loc, seq_lens, slot_table, mask [T, max new] bool, "
               "scale): paged attention whose new tokens see each other only where mask says "
               "(anycore.kernels.tree_attention)"),
    OpSpec("gguf_linear", reference.gguf_linear, gguf.gguf_linear_torch, "gguf", _gguf_native_when,
           doc="gguf_linear(x, qweight, qtype, bias=None): qweight the GGUF file's blocks uint8 [N, K/32 * "
               "block bytes] of ggml type qtype (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K; anycore.kernels.gguf), int8 activations"),
    # one portable C++ kernel (csrc/common/shm_all_reduce.cpp, no per-ISA table), bound by the
    # tensor-parallel group (anycore/distributed/shm.py), not by a variant
    OpSpec("shm_all_reduce", shm_all_reduce.shm_all_reduce, shm_all_reduce.shm_all_reduce,
           doc="shm_all_reduce(x, segment, rank, world, timeout_s): x summed in place over the ranks of one host "
               "through a shared-memory segment (anycore.kernels.shm_all_reduce)"),
)
OP_NAMES: tuple[str, ...] = tuple(s.name for s in OP_SPECS)
# the ops the native decoder stack calls besides the projections, in its op_impls order
# (csrc/common/decoder_layout.h OpIndex)
FUSED_OPS = ("rms_norm", "add_rms_norm", "apply_rotary", "silu_and_mul", "paged_attention")


def ops_of(family: str, specs: tuple[OpSpec, ...] = OP_SPECS) -> tuple[str, ...]:
    """The ops with a native kernel in ``family``, in registry order."""
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r} (known: {', '.join(FAMILIES)})")
    return tuple(s.name for s in specs if s.family == family)


def spec(name: str, specs: tuple[OpSpec, ...] = OP_SPECS) -> OpSpec:
    found = next((s for s in specs if s.name == name), None)
    if found is None:
        raise ValueError(f"no kernel op {name!r} (ops: {', '.join(s.name for s in specs)})")
    return found


@dataclass(frozen=True)
class KernelOps:
    """The bound implementations, one per op, read as attributes (``ops.rms_norm(x, w, eps)``)
    with the signatures of ``anycore.kernels.reference``, plus the fused native entry points."""

    impls: Mapping[str, Callable]  # op name -> implementation, one per OpSpec
    # decoder_stack(hidden, stack_weights, k_pool, v_pool, slot_mapping, cos, sin, q_start_loc,
    # seq_lens, slot_table, num_heads, num_kv_heads, head_dim, eps, scale, tree_mask=None): every
    # layer in one native call (the pools whole, csrc/common/decoder_layer.cpp; tree_mask: a tree
    # verify's, as tree_attention takes it), with stack_weights(weights, linear_impls) made once
    # from the layers' weights and variant indices concatenated (in the order
    # anycore/engine/native_executor.py reads from the extension); None unless all five
    # non-linear ops are native (FUSED_OPS)
    decoder_stack: Callable | None = None
    stack_weights: Callable | None = None
    # decode_greedy(token, start, steps, embed, stack_weights, k_pool, v_pool, slot_row, cos_table,
    # sin_table, final_norm, head, head_impl, num_heads, num_kv_heads, head_dim, eps, final_eps,
    # scale) -> int64 [steps]: one request's greedy tokens, several in one native call
    # (csrc/common/decode_greedy.cpp); bound with decoder_stack
    decode_greedy: Callable | None = None
    # decode_logits(tokens int64 [n], start, <decode_greedy's arguments without steps>) -> fp32
    # [n, vocab]: one such step's logits (n > 1: a causal extend), for a request decoding alone that
    # samples or verifying a chain draft alone (csrc/common/decode_greedy.cpp)
    decode_logits: Callable | None = None
    # gguf_embedding(blocks, qtype, ids, dtype) -> [len(ids), hidden] of dtype: a GGUF table's rows
    # dequantized natively by gguf_linear's variant (VocabEmbedding's lookup; csrc/common/decode_greedy.cpp)
    gguf_embedding: Callable | None = None
    # op name -> variant index in the extension, for native choices (the fused layer needs them)
    native_index: dict[str, int] = field(default_factory=dict)
    # op name -> human-readable implementation name (for logs and `anycore doctor`)
    choices: dict[str, str] = field(default_factory=dict)
    # op name -> why that implementation was chosen (see anycore.platform.selection)
    reasons: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Callable:
        # only reached for names that are not fields: the ops
        impls = self.__dict__.get("impls", {})
        if name in impls:
            return impls[name]
        raise AttributeError(f"KernelOps has no op {name!r} (ops: {', '.join(impls)})")


def torch_native_ops(specs: tuple[OpSpec, ...] = OP_SPECS) -> KernelOps:
    """The portable torch-native table: runs on every architecture."""
    return KernelOps(impls={s.name: s.torch_native for s in specs},
                     choices={s.name: "torch-native" for s in specs})
