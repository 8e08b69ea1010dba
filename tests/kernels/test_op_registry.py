"""The op registry (anycore.kernels.ops.OP_SPECS) is the one list of ops: every derived table
agrees with it, a half-added op is caught, and an op registered from outside (a toy op, here)
is selected, bound, listed and reported like the built-in ones.

What adding an op takes (csrc/README.md, "Adding an op"): an ``OpSpec`` and its code. The toy
op below is the whole Python side of a torch-native-only op: one function and one spec, nothing
edited in selection, dispatch or KernelOps.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from anycore.kernels import dispatch
from anycore.kernels.build import load_extension
from anycore.kernels.ops import FAMILIES, OP_NAMES, OP_SPECS, KernelOps, OpSpec, ops_of, torch_native_ops
from anycore.platform import selection as sel
from anycore.platform.features import CpuFeatures

pytestmark = pytest.mark.arm64  # cheap: the emulated Arm64 lane checks its own variants' tables


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """GeGLU (Gemma's MLP activation): ``gelu_tanh(x[:, :d]) * x[:, d:]``."""
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


TOY = OpSpec("gelu_and_mul", reference=gelu_and_mul, torch_native=gelu_and_mul, doc="gelu_and_mul(x [.., 2d])")
WITH_TOY = OP_SPECS + (TOY,)


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def registry_problems(specs: tuple[OpSpec, ...], variants=sel.VARIANTS, ext=None) -> list[str]:
    """Everything that makes ``specs`` (with the variant table and, when given, the built
    extension) inconsistent: each problem is what a half-added op would leave behind."""
    out = []
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        out.append(f"duplicate op names in {names}")
    declared = {op for v in variants for op in v.ops}
    out += [f"{op}: declared by a variant but not in the registry" for op in sorted(declared - set(names))]
    for s in specs:
        want = _params(s.reference)
        if _params(s.torch_native) != want:
            out.append(f"{s.name}: torch-native takes {_params(s.torch_native)}, reference {want}")
        if s.native_when is not None and _params(s.native_when) != want:
            out.append(f"{s.name}: native_when takes {_params(s.native_when)}, reference {want}")
        if s.family and s.family not in FAMILIES:
            out.append(f"{s.name}: unknown kernel family {s.family!r}")
        if s.family and s.name not in declared:
            out.append(f"{s.name}: family {s.family!r} but no variant declares it")
        if not s.family and s.name in declared:
            out.append(f"{s.name}: declared by a variant but has no kernel family")
        if s.family and ext is not None and ext.available:
            native = getattr(torch.ops.anycore, s.name, None)
            if native is None:
                out.append(f"{s.name}: no native op torch.ops.anycore.{s.name}")
                continue
            args = native.default._schema.arguments
            got = [a.name for a in args[: len(want) + 1]]
            if got != want + ["impl"] or any(not a.has_default_value() for a in args[len(want) + 1:]):
                out.append(f"{s.name}: native schema {native.default._schema} is not the reference's "
                           f"arguments {want} then `int impl`")
    return out


def test_every_op_is_complete():
    ext = load_extension()
    assert registry_problems(OP_SPECS, ext=ext) == []
    assert sel.OPS == OP_NAMES
    assert sorted(op for f in FAMILIES for op in ops_of(f)) == sorted(s.name for s in OP_SPECS if s.family)
    s = sel.select(CpuFeatures("x86_64"), None)
    assert [c.op for c in s.choices] == list(OP_NAMES)
    native = torch_native_ops()
    assert all(getattr(native, s.name) is s.torch_native for s in OP_SPECS)


def test_a_half_added_op_is_caught():
    ext = load_extension()
    no_variant = OpSpec("gelu_and_mul", gelu_and_mul, gelu_and_mul, family="elementwise")
    problems = registry_problems(OP_SPECS + (no_variant,), ext=ext)
    assert "gelu_and_mul: family 'elementwise' but no variant declares it" in problems
    if ext.available:
        assert "gelu_and_mul: no native op torch.ops.anycore.gelu_and_mul" in problems
    bad_native = OpSpec("gelu_and_mul", gelu_and_mul, lambda x, approximate: x)
    assert registry_problems(OP_SPECS + (bad_native,)) == [
        "gelu_and_mul: torch-native takes ['x', 'approximate'], reference ['x']"]
    extra = sel.VARIANTS + (sel.Variant("extra", "any", (), 1, "x.cpp", (), ("gelu_and_mul",)),)
    assert registry_problems(OP_SPECS, variants=extra) == ["gelu_and_mul: declared by a variant but not in the registry"]


def test_declared_ops_have_their_own_kernels():
    """A variant never claims an op its table leaves null (null entries run generic's kernel)."""
    ext = load_extension()
    if not ext.available:
        pytest.skip(f"extension unavailable: {ext.error}")
    for idx, name in enumerate(ext.variants):
        filled = set(torch.ops.anycore.variant_kernels(idx))
        declared = set(sel.variant(name).ops)
        assert declared <= filled, (name, sorted(declared - filled))


def test_toy_op_is_selected_bound_and_listed():
    x = torch.randn(3, 16)
    ops = dispatch.select_ops(overrides="", specs=WITH_TOY)
    assert ops.gelu_and_mul is gelu_and_mul
    torch.testing.assert_close(ops.gelu_and_mul(x), gelu_and_mul(x))
    assert ops.choices["gelu_and_mul"] == "torch-native"
    host = dispatch.host_features().arch
    assert f"no native variant of gelu_and_mul on {host}" in ops.reasons["gelu_and_mul"]
    # the other ops are bound as without it
    assert {k: v for k, v in ops.choices.items() if k != "gelu_and_mul"} == dispatch.select_ops(overrides="").choices
    # what `anycore doctor` lists: the plan's choices
    assert [c.op for c in dispatch.plan(dispatch.host_features(), "", specs=WITH_TOY).choices] == [
        *OP_NAMES, "gelu_and_mul"]
    assert dispatch.implementations("gelu_and_mul") == [("torch-native", "")]
    assert dispatch.make_op("gelu_and_mul", "reference", specs=WITH_TOY) is gelu_and_mul
    with pytest.raises(ValueError, match="no kernel op 'gelu_and_mul'"):
        dispatch.make_op("gelu_and_mul", "torch-native")  # not in the default registry


def test_toy_op_overrides():
    s = sel.select(CpuFeatures("x86_64", frozenset({"avx2", "fma", "f16c"})), ("generic", "avx2"),
                   "gelu_and_mul=generic,*=torch-native", ops=(*OP_NAMES, "gelu_and_mul"))
    assert s.as_dict() == {op: "torch-native" for op in (*OP_NAMES, "gelu_and_mul")}
    assert sel.select(CpuFeatures("x86_64"), None, "gelu_and_mul=generic", ops=("gelu_and_mul",)).warnings == (
        "ANYCORE_KERNELS: gelu_and_mul=generic refused (generic does not implement gelu_and_mul); using torch-native",)
    ops = dispatch.select_ops(overrides="gelu_and_mul=reference", specs=WITH_TOY,
                              extension=load_extension())
    assert ops.choices["gelu_and_mul"] == "reference" and ops.reasons["gelu_and_mul"] == "forced by override"


def test_kernel_ops_attributes_are_the_registry():
    ops = torch_native_ops(WITH_TOY)
    assert ops.gelu_and_mul is gelu_and_mul and ops.rms_norm is OP_SPECS[0].torch_native
    with pytest.raises(AttributeError, match="no op 'gelu'"):
        _ = ops.gelu
    assert not hasattr(KernelOps(impls={}), "rms_norm")


def test_bound_native_ops_follow_the_guard():
    """A bound native op runs the kernel when native_when accepts the arguments, else torch-native
    (here: fp64 has no kernel), and fills in the reference's defaults (linear's bias)."""
    usable = [impl for impl, why in dispatch.implementations("linear") if not why and impl != "torch-native"]
    if not usable:
        pytest.skip("no native linear on this host")
    linear = dispatch.make_op("linear", usable[0])
    assert linear.__name__ == "linear" and _params(linear) == ["x", "weight", "bias"]
    w = torch.randn(8, 32, dtype=torch.bfloat16)
    x = torch.randn(1, 32, dtype=torch.bfloat16)
    idx = load_extension().variants.index(usable[0])
    assert torch.equal(linear(x, w), torch.ops.anycore.linear(x, w, None, idx))
    xd, wd = x.double(), w.double()
    assert torch.equal(linear(xd, wd), F.linear(xd, wd))
