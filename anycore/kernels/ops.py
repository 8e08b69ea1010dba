"""The kernel table: one implementation per op, chosen once at start-up.

A model never imports a kernel directly; it receives a ``KernelOps`` and calls through it, so
the dispatch layer (``anycore.kernels.dispatch``) can swap native variants in and tests can run
the same model on the reference ops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from anycore.kernels import torch_native

OP_NAMES = ("rms_norm", "add_rms_norm", "apply_rotary", "silu_and_mul", "paged_attention", "linear",
            "w8a8_linear")
# the ops the fused decoder layer calls besides the projections, in its op_impls order
FUSED_OPS = ("rms_norm", "add_rms_norm", "apply_rotary", "silu_and_mul", "paged_attention")


@dataclass(frozen=True)
class KernelOps:
    """Callables with the signatures of ``anycore.kernels.reference``."""

    rms_norm: Callable
    add_rms_norm: Callable
    apply_rotary: Callable
    silu_and_mul: Callable
    paged_attention: Callable
    # linear(x, weight, bias=None) with F.linear's semantics (native only for bf16 decode GEMV)
    linear: Callable = torch_native.linear
    # w8a8_linear(x, packed, w_scale, bias=None), an ``Int8Linear``: its ``pack(qweight [N, K])``
    # makes ``packed`` once at load in the implementation's own layout (anycore.kernels.int8)
    w8a8_linear: Callable = torch_native.w8a8_linear
    # decoder_layer(hidden, residual, weights, linear_impls, k_cache, v_cache, slot_mapping, cos,
    # sin, q_start_loc, seq_lens, slot_table, num_heads, num_kv_heads, head_dim, eps, scale):
    # a whole Llama-family layer in one native call (csrc/common/decoder_layer.cpp), composed of
    # the ops above; None unless all five non-linear ops are native (see FUSED_OPS)
    decoder_layer: Callable | None = None
    # decoder_stack(hidden, stack_weights, k_pool, v_pool, slot_mapping, cos, sin, q_start_loc,
    # seq_lens, slot_table, num_heads, num_kv_heads, head_dim, eps, scale): every layer in one
    # native call (the pools whole), with stack_weights(weights, linear_impls) made once from the
    # layers' weights and variant indices concatenated; both bound exactly when decoder_layer is
    decoder_stack: Callable | None = None
    stack_weights: Callable | None = None
    # decode_greedy(token, start, steps, embed, stack_weights, k_pool, v_pool, slot_row, cos_table,
    # sin_table, final_norm, head, head_impl, num_heads, num_kv_heads, head_dim, eps, final_eps,
    # scale) -> int64 [steps]: one request's greedy tokens, several in one native call
    # (csrc/common/decode_greedy.cpp); bound with decoder_stack
    decode_greedy: Callable | None = None
    # op name -> variant index in the extension, for native choices (the fused layer needs them)
    native_index: dict[str, int] = field(default_factory=dict)
    # op name -> human-readable implementation name (for logs and `anycore doctor`)
    choices: dict[str, str] = field(default_factory=dict)
    # op name -> why that implementation was chosen (see anycore.platform.selection)
    reasons: dict[str, str] = field(default_factory=dict)


def torch_native_ops() -> KernelOps:
    """The portable torch-native table: runs on every architecture."""
    return KernelOps(
        rms_norm=torch_native.rms_norm,
        add_rms_norm=torch_native.add_rms_norm,
        apply_rotary=torch_native.apply_rotary,
        silu_and_mul=torch_native.silu_and_mul,
        paged_attention=torch_native.paged_attention,
        linear=torch_native.linear,
        w8a8_linear=torch_native.w8a8_linear,
        choices={name: "torch-native" for name in OP_NAMES},
    )
