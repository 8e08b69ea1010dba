"""The selection table picks the documented implementation for hand-made CPUs."""

from __future__ import annotations

import pytest

from anycore.kernels.ops import spec
from anycore.platform import selection as sel
from anycore.platform.features import CpuFeatures, detect

X86_AVX2 = CpuFeatures("x86_64", frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"}))
X86_AVX512 = CpuFeatures("x86_64", X86_AVX2.flags | {"avx512f", "avx512bw", "avx512vl", "avx512dq"})
X86_AVX512_BF16 = CpuFeatures("x86_64", X86_AVX512.flags | {"avx512_bf16", "avx512_vnni"})
X86_AMX = CpuFeatures("x86_64", X86_AVX512_BF16.flags | {"amx_tile", "amx_bf16", "amx_int8"})
ARM_NEON = CpuFeatures("aarch64", frozenset({"fp", "asimd"}))
ARM_DOTPROD = CpuFeatures("aarch64", ARM_NEON.flags | {"asimddp"})
ARM_BF16 = CpuFeatures("aarch64", ARM_DOTPROD.flags | {"i8mm", "bf16"})  # e.g. Apple M2: no SVE
_SVE_BF16 = ARM_BF16.flags | {"sve", "sve2", "svebf16", "svei8mm"}
ARM_SVE128 = CpuFeatures("aarch64", _SVE_BF16, sve_vector_bits=128)  # Neoverse N2/V2, Graviton4, Grace
ARM_SVE256 = CpuFeatures("aarch64", _SVE_BF16, sve_vector_bits=256)  # Neoverse V1, Graviton3
ARM_SVE512 = CpuFeatures("aarch64", _SVE_BF16, sve_vector_bits=512)  # QEMU max, no shipping server
ARM_A64FX = CpuFeatures("aarch64", ARM_NEON.flags | {"sve"}, sve_vector_bits=512)  # SVE without bf16/dotprod
ARM_SVE_I8MM = ARM_SVE256
RISCV = CpuFeatures("riscv64", frozenset({"rv64imafdc"}))

ALL_X86 = ("generic", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx")
ALL_ARM = ("generic", "neon", "neon_bf16", "dotprod", "i8mm", "sve", "sve256")


def _expect(op_impl: str, **per_op: str) -> dict[str, str]:
    # ops without a kernel family (torch-native only) are torch-native everywhere
    out = {op: op_impl if spec(op).family else "torch-native" for op in sel.OPS}
    out.update(per_op)
    # fused_moe_w8a8 runs on the int8 kernels: wherever w8a8_linear does (the same skip rule)
    out["fused_moe_w8a8"] = out["w8a8_linear"]
    # tree_attention and paged_attention_window are paged_attention's kernel with a mask / a
    # window: they run wherever paged_attention does
    out["tree_attention"] = out["paged_attention_window"] = out["paged_attention"]
    # the hand-written sve variant has only the Llama element-wise ops (selection.py): Gemma's
    # run on the vector variant that takes paged_attention there
    if op_impl == "sve":
        out["gemma_rms_norm"] = out["gelu_tanh_and_mul"] = out["paged_attention"]
    return out


@pytest.mark.arm64
@pytest.mark.parametrize(
    "features, available, expected",
    [
        (X86_AVX2, ALL_X86, _expect("avx2")),
        (X86_AVX512, ALL_X86, _expect("avx512", w8a8_linear="avx2", gguf_linear="avx2")),
        (X86_AVX512_BF16, ALL_X86, _expect("avx512_bf16", w8a8_linear="avx512_vnni", gguf_linear="avx512_vnni")),
        (X86_AMX, ALL_X86, _expect("avx512_bf16", w8a8_linear="amx", gguf_linear="avx512_vnni")),
        (ARM_NEON, ALL_ARM, _expect("neon", w8a8_linear="generic", gguf_linear="generic")),
        (ARM_DOTPROD, ALL_ARM, _expect("neon", w8a8_linear="dotprod", gguf_linear="dotprod")),
        (ARM_BF16, ALL_ARM, _expect("neon_bf16", w8a8_linear="i8mm", gguf_linear="dotprod")),
        (ARM_SVE128, ALL_ARM, _expect("sve", paged_attention="neon_bf16", linear="neon_bf16", fused_moe="neon_bf16",
                                         w8a8_linear="i8mm", gguf_linear="dotprod")),
        (ARM_SVE256, ALL_ARM, _expect("sve256", w8a8_linear="i8mm", gguf_linear="dotprod")),
        (ARM_SVE512, ALL_ARM, _expect("sve", paged_attention="neon_bf16", linear="neon_bf16", fused_moe="neon_bf16",
                                         w8a8_linear="i8mm", gguf_linear="dotprod")),
        (ARM_A64FX, ALL_ARM, _expect("sve", paged_attention="neon", linear="neon", fused_moe="neon", w8a8_linear="generic",
                                        gguf_linear="generic")),
        (RISCV, ("generic",), _expect("generic", linear="torch-native", fused_moe="torch-native", w8a8_linear="generic",
                                      gguf_linear="generic")),
        (X86_AVX512, None, _expect("torch-native")),
        (ARM_SVE_I8MM, None, _expect("torch-native")),
    ],
    ids=["avx2", "avx512", "avx512_bf16", "amx", "neon", "dotprod", "bf16", "sve128", "sve256", "sve512", "a64fx",
         "riscv", "x86_noext", "arm_noext"],
)
def test_documented_choice(features, available, expected):
    s = sel.select(features, available)
    assert s.as_dict() == expected
    assert all(c.reason for c in s.choices)


def test_amx_reason_mentions_reserved_variant():
    s = sel.select(X86_AMX, ALL_X86)
    reason = next(c.reason for c in s.choices if c.op == "paged_attention")
    assert "amx present but has no paged_attention" in reason


def test_lacking_feature_never_chosen_even_when_forced():
    s = sel.select(X86_AVX2, ALL_X86, "rms_norm=avx512,silu_and_mul=avx512_bf16")
    assert s.impl("rms_norm") == "avx2" and s.impl("silu_and_mul") == "avx2"
    assert any("CPU lacks" in w for w in s.warnings)
    s = sel.select(ARM_DOTPROD, ALL_ARM, "linear=neon_bf16,paged_attention=neon_bf16")
    assert s.impl("linear") == "neon" and s.impl("paged_attention") == "neon"
    assert sum("neon_bf16 refused (CPU lacks bf16)" in w for w in s.warnings) == 2


def test_override_parsing_and_all_torch_native():
    assert sel.parse_overrides("torch-native") == {op: "torch-native" for op in sel.OPS}
    assert sel.parse_overrides(" rms_norm=generic , *=reference") == {op: "reference" for op in sel.OPS}
    s = sel.select(X86_AVX512, ALL_X86, "paged_attention=generic,apply_rotary=reference")
    assert s.impl("paged_attention") == "generic" and s.impl("apply_rotary") == "reference"
    assert s.impl("rms_norm") == "avx512"
    s = sel.select(X86_AVX512, ALL_X86, "bogus=generic,rms_norm=nosuch")
    assert len(s.warnings) == 2 and s.impl("rms_norm") == "avx512"


@pytest.mark.arm64
def test_sve_length_pseudo_flag_follows_the_vector_length():
    assert ARM_SVE256.has("sve256") and not ARM_SVE128.has("sve256") and ARM_SVE128.has("sve128")
    # written by hand with the wrong length, or without SVE: dropped
    assert not CpuFeatures("aarch64", frozenset({"asimd", "sve", "sve256"}), sve_vector_bits=128).has("sve256")
    assert not CpuFeatures("aarch64", frozenset({"asimd", "sve256"}), sve_vector_bits=256).has("sve256")
    assert "sve2" in ARM_SVE128.flags  # SVE2 is a real flag, not a length


@pytest.mark.arm64
@pytest.mark.parametrize("features", [ARM_SVE128, ARM_SVE512, ARM_A64FX, ARM_BF16], ids=["sve128", "sve512", "a64fx",
                                                                                       "no_sve"])
def test_sve256_refused_on_another_vector_length(features):
    """Fixed 256-bit code on another length computes garbage (no SIGILL): never bound, even forced."""
    s = sel.select(features, ALL_ARM, "*=sve256")
    assert "sve256" not in s.as_dict().values()
    assert s.as_dict() == sel.select(features, ALL_ARM).as_dict()
    refused = [w for w in s.warnings if "sve256 refused (CPU lacks" in w]
    assert len(refused) == len(sel.variant("sve256").ops)  # w8a8_linear: "does not implement"
    if features.sve_vector_bits:
        assert f"sve256 (SVE vector length {features.sve_vector_bits} bits, needs 256)" in refused[0]
    reason = next(c.reason for c in s.choices if c.op == "paged_attention")
    assert "sve256: CPU lacks" in reason
    assert sel.select(ARM_SVE256, ALL_ARM, "*=sve256").impl("paged_attention") == "sve256"


def test_sve256_needs_bf16_too():
    no_bf16 = CpuFeatures("aarch64", ARM_DOTPROD.flags | {"sve"}, sve_vector_bits=256)
    assert sel.select(no_bf16, ALL_ARM).as_dict() == _expect("sve", paged_attention="neon", linear="neon",
                                                             fused_moe="neon", w8a8_linear="dotprod",
                                                             gguf_linear="dotprod")
    s = sel.select(ARM_SVE256, ("generic", "neon", "neon_bf16", "sve"))  # built without sve256
    assert s.as_dict() == _expect("sve", paged_attention="neon_bf16", linear="neon_bf16", fused_moe="neon_bf16",
                                  w8a8_linear="generic", gguf_linear="generic")
    assert any("sve256 usable on this CPU but the extension was built without it" in w for w in s.warnings)


def test_variant_missing_from_build_warns_and_falls_back():
    s = sel.select(ARM_SVE_I8MM, ("generic", "neon"))
    assert s.impl("rms_norm") == "neon"
    assert any("sve usable on this CPU but the extension was built without it" in w for w in s.warnings)


def test_linear_is_native_on_x86_and_arm_only():
    assert sel.select(ARM_NEON, ALL_ARM).impl("linear") == "neon"
    s = sel.select(ARM_DOTPROD, ALL_ARM)
    reason = next(c.reason for c in s.choices if c.op == "linear")
    assert s.impl("linear") == "neon" and "neon_bf16: CPU lacks bf16" in reason
    assert sel.select(ARM_BF16, ("generic", "neon")).impl("linear") == "neon"  # built without neon_bf16
    s = sel.select(RISCV, ("generic",))
    reason = next(c.reason for c in s.choices if c.op == "linear")
    assert s.impl("linear") == "torch-native" and "no native variant of linear on riscv64" in reason
    s = sel.select(X86_AVX2, ALL_X86)
    assert s.impl("linear") == "avx2" and "avx512: CPU lacks" in next(c.reason for c in s.choices
                                                                      if c.op == "linear")
    assert sel.select(X86_AVX2, ("generic",)).impl("linear") == "torch-native"  # generic has no linear
    s = sel.select(ARM_NEON, ALL_ARM, "linear=torch-native")  # F.linear on request
    assert s.impl("linear") == "torch-native" and not s.warnings


@pytest.mark.arm64
@pytest.mark.parametrize(
    "features, available, expected",
    [
        (X86_AVX512_BF16, ("generic", "avx2", "avx512", "avx512_bf16"), "avx2"),  # built without vnni
        (X86_AVX512_BF16, ("generic", "avx512", "avx512_bf16"), "torch-native"),  # nor avx2
        (X86_AMX, ("generic", "avx2", "avx512", "avx512_vnni", "avx512_bf16"), "avx512_vnni"),  # no amx build
        (CpuFeatures("x86_64", X86_AVX512.flags | {"avx512_vnni"}), ALL_X86, "avx512_vnni"),  # Cascade Lake
        (ARM_SVE_I8MM, ("generic", "neon", "dotprod", "sve"), "dotprod"),
        (CpuFeatures("aarch64", ARM_NEON.flags | {"i8mm"}), ALL_ARM, "i8mm"),
    ],
    ids=["vnni_not_built", "vnni_avx2_not_built", "amx_not_built", "vnni_without_bf16", "i8mm_not_built", "i8mm_without_dotprod"],
)
def test_w8a8_linear_choice(features, available, expected):
    assert sel.select(features, available).impl("w8a8_linear") == expected


def test_w8a8_linear_overrides_and_reasons():
    s = sel.select(X86_AMX, ALL_X86, "w8a8_linear=torch-native")
    assert s.impl("w8a8_linear") == "torch-native" and s.impl("rms_norm") == "avx512_bf16"
    assert sel.select(X86_AMX, ALL_X86, "w8a8_linear=avx512_vnni").impl("w8a8_linear") == "avx512_vnni"
    s = sel.select(X86_AVX512, ALL_X86, "w8a8_linear=avx512_vnni")  # CPU lacks VNNI: refused
    assert s.impl("w8a8_linear") == "avx2" and any("CPU lacks avx512_vnni" in w for w in s.warnings)
    s = sel.select(X86_AVX512, ("generic", "avx512"))
    reason = next(c.reason for c in s.choices if c.op == "w8a8_linear")
    assert s.impl("w8a8_linear") == "torch-native"
    assert "generic: slower than torch-native for w8a8_linear on x86_64" in reason
    assert sel.select(X86_AVX2, ALL_X86, "w8a8_linear=generic").impl("w8a8_linear") == "generic"
    s = sel.select(X86_AVX512_BF16, ALL_X86, "rms_norm=avx512_vnni")  # variant lacks the op: refused
    assert s.impl("rms_norm") == "avx512_bf16" and any("does not implement rms_norm" in w for w in s.warnings)
    s = sel.select(ARM_DOTPROD, ALL_ARM)
    reason = next(c.reason for c in s.choices if c.op == "w8a8_linear")
    assert "i8mm: CPU lacks i8mm" in reason
    assert sel.select(ARM_SVE_I8MM, None).impl("w8a8_linear") == "torch-native"


def test_variant_table_is_consistent():
    names = [v.name for v in sel.VARIANTS]
    assert len(names) == len(set(names))
    for v in sel.VARIANTS:
        assert set(v.ops) <= set(sel.OPS)
        assert bool(v.source) == bool(v.ops), v.name
        assert "-march=native" not in v.cflags
        for flag in v.cflags:  # fixed-length SVE code must require that length
            if flag.startswith("-msve-vector-bits="):
                assert f"sve{flag.split('=')[1]}" in v.requires, v.name
    for arch in ("x86_64", "aarch64", "riscv64"):
        assert any(v.name == "generic" for v in sel.buildable_variants(arch))


def test_ops_come_from_the_registry_by_family():
    from anycore.kernels.ops import OP_NAMES, ops_of

    assert sel.OPS == OP_NAMES
    assert sel.variant("generic").ops == ops_of("elementwise") + ops_of("attention") + ops_of("int8") + ops_of("gguf")
    for name in ("avx512", "avx512_bf16", "neon", "neon_bf16", "sve256"):  # vector variants with the GEMV
        assert sel.variant(name).ops == ops_of("elementwise") + ops_of("attention") + ops_of("gemv"), name
    for name in ("avx512_vnni", "dotprod"):  # int8 dot products: W8A8 and the GGUF blocks
        assert sel.variant(name).ops == ops_of("int8") + ops_of("gguf") == ("w8a8_linear", "fused_moe_w8a8",
                                                                            "gguf_linear"), name
    for name in ("amx", "i8mm"):
        assert sel.variant(name).ops == ops_of("int8") == ("w8a8_linear", "fused_moe_w8a8"), name
    assert sel.variant("sve").ops == ("rms_norm", "add_rms_norm", "apply_rotary", "silu_and_mul")


def test_an_op_without_native_variants_is_torch_native_everywhere():
    ops = (*sel.OPS, "gelu_and_mul")  # e.g. a registered torch-native-only op
    for features, available in ((X86_AMX, ALL_X86), (ARM_SVE256, ALL_ARM), (RISCV, ("generic",)), (X86_AVX2, None)):
        s = sel.select(features, available, ops=ops)
        assert s.impl("gelu_and_mul") == "torch-native"
        assert {c.op: c.impl for c in s.choices if c.op != "gelu_and_mul"} == sel.select(features, available).as_dict()
    reason = next(c.reason for c in sel.select(X86_AMX, ALL_X86, ops=ops).choices if c.op == "gelu_and_mul")
    assert reason == "no native variant of gelu_and_mul on x86_64"
    assert sel.parse_overrides("*=reference", ops) == {op: "reference" for op in ops}


@pytest.mark.arm64
def test_detect_on_this_machine():
    f = detect()
    assert f.arch in ("x86_64", "aarch64") or f.arch
    assert f.cores >= 1 and f.numa_nodes >= 1
    if f.arch == "x86_64":
        assert "sse2" in f.flags
    if f.arch == "aarch64":
        assert "asimd" in f.flags
        assert ("sve" in f.flags) == (f.sve_vector_bits > 0)
