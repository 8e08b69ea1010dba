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

import inspect
import logging
import os
from collections.abc import Callable
from functools import lru_cache

import torch

from anycore.kernels.build import ExtensionInfo, load_extension
from anycore.kernels.ops import FUSED_OPS, OP_SPECS, KernelOps, OpSpec, spec
from anycore.platform import selection
from anycore.platform.features import CpuFeatures, detect

__all__ = ["host_features", "implementations", "make_op", "native_op", "plan",
           "select_ops"]

log = logging.getLogger("anycore.kernels")


@lru_cache(maxsize=1)
def host_features() -> CpuFeatures:
    return detect()


def select_ops(
    features: CpuFeatures | None = None,
    overrides: str | dict[str, str] | None = None,
    threads: int | None = None,
    extension: ExtensionInfo | None = None,
    specs: tuple[OpSpec, ...] = OP_SPECS,
) -> KernelOps:
    """The kernel table for this process. ``overrides`` defaults to ``$ANYCORE_KERNELS``;
    ``specs`` (the registry, ``anycore.kernels.ops.OP_SPECS``) is the ops it binds."""
    features = features or host_features()
    if threads:
        torch.set_num_threads(threads)
    if overrides is None:
        overrides = os.environ.get(selection.ENV_OVERRIDE, "")
    sel = plan(features, overrides, extension, specs)
    ext = extension or (load_extension() if _needs_extension(sel) else None)
    fns = {c.op: make_op(c.op, c.impl, ext, specs) for c in sel.choices}
    native_index = {c.op: ext.variants.index(c.impl) for c in sel.choices
                    if ext is not None and c.impl in ext.variants}
    stack = stack_weights = greedy = step_logits = None
    if all(op in native_index for op in FUSED_OPS):
        stack, stack_weights = _bind_decoder_stack([native_index[op] for op in FUSED_OPS])
        greedy = torch.ops.anycore.decode_greedy.default
        step_logits = torch.ops.anycore.decode_logits.default
    gguf_rows = _bind_gguf_embedding(native_index["gguf_linear"]) if "gguf_linear" in native_index else None
    for c in sel.choices:
        log.info("kernel %s -> %s (%s)", c.op, c.impl, c.reason)
    log.info("kernel decoder_stack -> %s", "native" if stack else "op by op (some op is not native)")
    for w in sel.warnings:
        log.warning("kernels: %s", w)
    return KernelOps(fns, decoder_stack=stack, stack_weights=stack_weights,
                     decode_greedy=greedy, decode_logits=step_logits, gguf_embedding=gguf_rows,
                     native_index=native_index, choices=sel.as_dict(),
                     reasons={c.op: c.reason for c in sel.choices})


def plan(features: CpuFeatures, overrides, extension: ExtensionInfo | None = None,
         specs: tuple[OpSpec, ...] = OP_SPECS) -> selection.Selection:
    """The selection for ``features``; loads the extension only if some op may use it."""
    names = tuple(s.name for s in specs)
    forced = (selection.parse_overrides(overrides, names) if isinstance(overrides, str)
              else dict(overrides or {}))
    all_python = all(forced.get(op) in (selection.TORCH_NATIVE, selection.REFERENCE) for op in names)
    ext = extension if extension is not None else (None if all_python else load_extension())
    available = None
    if ext is not None and ext.available and ext.arch == features.arch:
        available = ext.variants
    error = "" if ext is None else ext.error
    if ext is not None and ext.available and ext.arch != features.arch:
        error = f"extension built for {ext.arch}, features are {features.arch}"
    return selection.select(features, available, forced, error, names)


def _needs_extension(sel: selection.Selection) -> bool:
    return any(c.impl not in (selection.TORCH_NATIVE, selection.REFERENCE) for c in sel.choices)


def make_op(op: str, impl: str, ext: ExtensionInfo | None = None,
            specs: tuple[OpSpec, ...] = OP_SPECS) -> Callable:
    """``op``'s implementation ``impl``: torch-native, reference or a native variant's name."""
    s = spec(op, specs)
    if impl == selection.TORCH_NATIVE:
        return s.torch_native
    if impl == selection.REFERENCE:
        return s.reference
    return native_op(op, impl, ext, specs)


def native_op(op: str, impl: str, ext: ExtensionInfo | None = None,
              specs: tuple[OpSpec, ...] = OP_SPECS) -> Callable:
    """The extension's ``impl`` variant of ``op``; raises if the running CPU or build lacks it."""
    s = spec(op, specs)
    v = selection.variant(impl)
    if v is None or op not in v.ops:
        raise ValueError(f"no native variant {impl!r} of {op}")
    host = host_features()
    if not selection.usable(v, host):
        raise RuntimeError(f"{impl} needs {selection.lacking(v, host)}; this CPU lacks it")
    ext = ext or load_extension()
    if not ext.available or impl not in ext.variants:
        raise RuntimeError(f"{impl} is not in the built extension ({ext.error or ', '.join(ext.variants)})")
    idx = ext.variants.index(impl)
    return s.bind(idx, impl) if s.bind is not None else _bind_guarded(s, idx)


def _bind_guarded(s: OpSpec, idx: int) -> Callable:
    """``torch.ops.anycore.<op>(*args, idx)`` when ``s.native_when(*args)``, else torch-native.

    Arguments are positional (the native schema's order is the reference's, the variant index
    last); trailing arguments the caller leaves out take the reference's defaults, so the native
    op always receives the index in its own slot.
    """
    native = getattr(torch.ops.anycore, s.name).default
    fallback, when = s.torch_native, s.native_when
    params = list(inspect.signature(s.reference).parameters.values())
    n = len(params)
    defaults = tuple(p.default for p in params if p.default is not inspect.Parameter.empty)

    def op(*args):
        if len(args) < n:
            args += defaults[len(args) - n:]
        if when is None or when(*args):
            return native(*args, idx)
        return fallback(*args)

    op.__name__ = op.__qualname__ = s.name
    op.__doc__ = s.doc
    op.__signature__ = inspect.signature(s.reference)  # type: ignore[attr-defined]
    return op


def _bind_decoder_stack(op_impls: list[int]) -> tuple[Callable, Callable]:
    """(decoder_stack, stack_weights) with the five non-linear ops' variant indices bound."""

    def stack_weights(weights, linear_impls):
        return torch.classes.anycore.StackWeights(weights, linear_impls, op_impls)

    return torch.ops.anycore.decoder_stack.default, stack_weights


def _bind_gguf_embedding(idx: int) -> Callable:
    """``gguf_embedding(blocks, qtype, ids, dtype)`` on variant ``idx``'s dequantizer (bf16 or fp32 rows)."""
    native = torch.ops.anycore.gguf_embedding.default

    def gguf_embedding(blocks: torch.Tensor, qtype: int, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        rows = native(blocks, qtype, ids, dtype is torch.bfloat16, idx)
        return rows if rows.dtype is dtype else rows.to(dtype)

    return gguf_embedding


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
