"""Binds each kernel op to one implementation, once, at start-up.

``select_ops()`` asks ``anycore.platform.selection`` what to run (given the CPU features, the
variants in the built extension and ``ANYCORE_KERNELS`` overrides), logs the choices and
returns a ``KernelOps`` of callables with the signatures of ``anycore.kernels.reference``.

Safety rule: a native variant is bound only after checking the *running* CPU has every flag
it needs (``native_op`` raises otherwise), whatever features were injected for selection; a
variant the CPU lacks would die with SIGILL, not raise (or, for sve256 on a CPU whose SVE vector
length is not 256 bits, silently compute wrong results).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import lru_cache

import torch

from anycore.kernels import reference, torch_native
from anycore.kernels.build import ExtensionInfo, load_extension
from anycore.kernels.int8 import Int8Linear
from anycore.kernels.ops import FUSED_OPS, OP_NAMES, KernelOps
from anycore.platform import selection
from anycore.platform.features import CpuFeatures, detect

log = logging.getLogger("anycore.kernels")

_NATIVE_DTYPES = (torch.float32, torch.bfloat16)
# rows up to which the native bf16 linear beats oneDNN (one VDPBF16PS tile of activation rows;
# measured on x86: 1 thread, SmolLM2 decode shapes, native 26/28/35 ms vs oneDNN 48/49/50 ms at
# 1/2/4 rows, 56 vs 48 ms at 8). The Arm variants use the same limit
# (their tiles are 4 activation rows too); not timed on Arm hardware.
NATIVE_LINEAR_MAX_ROWS = 4


@lru_cache(maxsize=1)
def host_features() -> CpuFeatures:
    return detect()


def select_ops(
    features: CpuFeatures | None = None,
    overrides: str | dict[str, str] | None = None,
    threads: int | None = None,
    extension: ExtensionInfo | None = None,
) -> KernelOps:
    """The kernel table for this process. ``overrides`` defaults to ``$ANYCORE_KERNELS``."""
    features = features or host_features()
    if threads:
        torch.set_num_threads(threads)
    if overrides is None:
        overrides = os.environ.get(selection.ENV_OVERRIDE, "")
    sel = plan(features, overrides, extension)
    ext = extension or (load_extension() if _needs_extension(sel) else None)
    fns = {c.op: make_op(c.op, c.impl, ext) for c in sel.choices}
    native_index = {c.op: ext.variants.index(c.impl) for c in sel.choices
                    if ext is not None and c.impl in ext.variants}
    fused = stack = stack_weights = greedy = None
    if all(op in native_index for op in FUSED_OPS):
        fused, stack, stack_weights = _bind_decoder_layer([native_index[op] for op in FUSED_OPS])
        greedy = torch.ops.anycore.decode_greedy.default
    for c in sel.choices:
        log.info("kernel %s -> %s (%s)", c.op, c.impl, c.reason)
    log.info("kernel decoder_layer -> %s", "fused native" if fused else "unfused (some op is not native)")
    for w in sel.warnings:
        log.warning("kernels: %s", w)
    return KernelOps(**fns, decoder_layer=fused, decoder_stack=stack, stack_weights=stack_weights,
                     decode_greedy=greedy, native_index=native_index, choices=sel.as_dict(),
                     reasons={c.op: c.reason for c in sel.choices})


def plan(features: CpuFeatures, overrides, extension: ExtensionInfo | None = None) -> selection.Selection:
    """The selection for ``features``; loads the extension only if some op may use it."""
    forced = selection.parse_overrides(overrides) if isinstance(overrides, str) else dict(overrides or {})
    all_python = all(forced.get(op) in (selection.TORCH_NATIVE, selection.REFERENCE) for op in OP_NAMES)
    ext = extension if extension is not None else (None if all_python else load_extension())
    available = None
    if ext is not None and ext.available and ext.arch == features.arch:
        available = ext.variants
    error = "" if ext is None else ext.error
    if ext is not None and ext.available and ext.arch != features.arch:
        error = f"extension built for {ext.arch}, features are {features.arch}"
    return selection.select(features, available, forced, error)


def _needs_extension(sel: selection.Selection) -> bool:
    return any(c.impl not in (selection.TORCH_NATIVE, selection.REFERENCE) for c in sel.choices)


def make_op(op: str, impl: str, ext: ExtensionInfo | None = None) -> Callable:
    if impl == selection.TORCH_NATIVE:
        return getattr(torch_native, op)
    if impl == selection.REFERENCE:
        return getattr(reference, op, None) or getattr(torch_native, op)
    return native_op(op, impl, ext)


def native_op(op: str, impl: str, ext: ExtensionInfo | None = None) -> Callable:
    """The extension's ``impl`` variant of ``op``; raises if the running CPU or build lacks it."""
    v = selection.variant(impl)
    if v is None or op not in v.ops:
        raise ValueError(f"no native variant {impl!r} of {op}")
    host = host_features()
    if not selection.usable(v, host):
        raise RuntimeError(f"{impl} needs {selection.lacking(v, host)}; this CPU lacks it")
    ext = ext or load_extension()
    if not ext.available or impl not in ext.variants:
        raise RuntimeError(f"{impl} is not in the built extension ({ext.error or ', '.join(ext.variants)})")
    return _bind(op, ext.variants.index(impl), impl)


def _bind(op: str, idx: int, impl: str = "") -> Callable:
    native = getattr(torch.ops.anycore, op).default
    fallback = getattr(torch_native, op)

    if op == "rms_norm":
        def rms_norm(x, weight, eps):
            if x.dtype not in _NATIVE_DTYPES or weight.dtype != x.dtype:
                return fallback(x, weight, eps)
            return native(x, weight, eps, idx)
        return rms_norm
    if op == "add_rms_norm":
        def add_rms_norm(x, residual, weight, eps):
            if x.dtype not in _NATIVE_DTYPES or weight.dtype != x.dtype or residual.dtype != x.dtype:
                return fallback(x, residual, weight, eps)
            return native(x, residual, weight, eps, idx)
        return add_rms_norm
    if op == "apply_rotary":
        def apply_rotary(x, cos, sin, head_dim):
            if x.dtype not in _NATIVE_DTYPES:
                return fallback(x, cos, sin, head_dim)
            return native(x, cos, sin, head_dim, idx)
        return apply_rotary
    if op == "silu_and_mul":
        def silu_and_mul(x):
            if x.dtype not in _NATIVE_DTYPES:
                return fallback(x)
            return native(x, idx)
        return silu_and_mul
    if op == "linear":
        # Native only for bf16 with at most NATIVE_LINEAR_MAX_ROWS rows (decode GEMV, small decode
        # batches; measured faster than F.linear/oneDNN on x86, see selection.py for why Arm
        # uses it). More rows, fp32, or odd layouts go to F.linear.
        # csrc/common/decoder_layer.cpp `project` applies the same rule.
        def linear(x, weight, bias=None):
            if (x.dtype is torch.bfloat16 and weight.dtype is torch.bfloat16
                    and x.numel() <= NATIVE_LINEAR_MAX_ROWS * x.shape[-1]
                    and weight.is_contiguous() and x.stride(-1) == 1):
                return native(x, weight, bias, idx)
            return fallback(x, weight, bias)
        return linear
    if op == "paged_attention":
        def paged_attention(q, k_cache, v_cache, q_start_loc, seq_lens, slot_table, scale):
            if q.dtype not in _NATIVE_DTYPES or q.shape[-1] > 512:
                return fallback(q, k_cache, v_cache, q_start_loc, seq_lens, slot_table, scale)
            return native(q, k_cache, v_cache, q_start_loc, seq_lens, slot_table, scale, idx)
        return paged_attention
    if op == "w8a8_linear":
        return _bind_w8a8(idx, impl)
    raise ValueError(op)


def _bind_decoder_layer(op_impls: list[int]) -> tuple[Callable, Callable, Callable]:
    """(decoder_layer, decoder_stack, stack_weights) with the five non-linear ops' variant
    indices bound."""
    layer, stack = torch.ops.anycore.decoder_layer.default, torch.ops.anycore.decoder_stack.default

    def decoder_layer(hidden, residual, weights, linear_impls, k_cache, v_cache, slot_mapping, cos, sin,
                      q_start_loc, seq_lens, slot_table, num_heads, num_kv_heads, head_dim, eps, scale):
        return layer(hidden, residual, weights, linear_impls, op_impls, k_cache, v_cache, slot_mapping, cos, sin,
                     q_start_loc, seq_lens, slot_table, num_heads, num_kv_heads, head_dim, eps, scale)

    def stack_weights(weights, linear_impls):
        return torch.classes.anycore.StackWeights(weights, linear_impls, op_impls)

    return decoder_layer, stack, stack_weights


def _bind_w8a8(idx: int, impl: str) -> Int8Linear:
    """The variant's packer and kernel; activations other than fp32/bf16 run in fp32."""
    lib = torch.ops.anycore

    def forward(x, packed, w_scale, bias=None):
        if x.dtype not in _NATIVE_DTYPES:
            return lib.w8a8_linear(x.float(), packed, w_scale, bias, idx).to(x.dtype)
        return lib.w8a8_linear(x, packed, w_scale, bias, idx)

    return Int8Linear(
        impl,
        pack=lambda qweight: lib.int8_pack(qweight, idx),
        unpack=lambda packed, n, k, rows=None: lib.int8_unpack(packed, n, k, idx, rows),
        forward=forward,
        acc=lambda xq, packed, n: lib.w8a8_int8_acc(xq, packed, n, idx),
    )


def implementations(op: str) -> list[tuple[str, str]]:
    """Every implementation of ``op`` for the host arch, with '' or the reason it cannot run here.

    Used by the kernel tests to run each variant against the reference (or skip it, saying why).
    """
    host = host_features()
    out: list[tuple[str, str]] = [(selection.TORCH_NATIVE, "")]
    ext = None
    for v in selection.buildable_variants(host.arch):
        if op not in v.ops:
            continue
        if not selection.usable(v, host):
            out.append((v.name, f"CPU lacks {selection.lacking(v, host)}"))
            continue
        ext = ext or load_extension()
        if not ext.available:
            out.append((v.name, f"extension unavailable: {ext.error}"))
        elif v.name not in ext.variants:
            out.append((v.name, "not in the built extension"))
        else:
            out.append((v.name, ""))
    return out
