"""The backend-selection table: which implementation runs each kernel op, and why.

``VARIANTS`` is the one place that declares the native variants per architecture: the CPU
flags each needs, the translation unit and compiler flags that build it (read by
``anycore.kernels.build``), and the ops it implements, by kernel family (``ELEMENTWISE``, ...:
the ops of the registry ``anycore.kernels.ops.OP_SPECS`` in that family, so an op added there
is declared by every variant that builds its family). An op with no native variant on an
architecture is replaced there by its torch-native implementation; a variant declared with no
ops is reserved (its ISA is detected and reported, but nothing is built for it yet).

``select()`` is pure: give it a ``CpuFeatures`` (hand-made in tests), the variant names the
built extension provides (``None`` when there is no extension) and overrides, and it returns
one ``Choice`` per op. A variant whose flags the CPU lacks is never chosen, even when forced
by an override: running it would die with SIGILL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from anycore.kernels.ops import OP_NAMES, ops_of
from anycore.platform.features import CpuFeatures, is_sve_length_flag

OPS = OP_NAMES
# the registry's ops by C++ kernel family (csrc/common/kernel_table.h, int8_impl.h)
ELEMENTWISE, ATTENTION, GEMV, INT8, GGUF = (
    ops_of(f) for f in ("elementwise", "attention", "gemv", "int8", "gguf"))
# what a vector variant (kernels_impl.h ANYCORE_DEFINE_TABLE) declares; `linear` (GEMV) only
# where it beats torch (see below), so not in generic
_VECTOR_OPS = ELEMENTWISE + ATTENTION + GEMV
TORCH_NATIVE = "torch-native"
REFERENCE = "reference"
ENV_OVERRIDE = "ANYCORE_KERNELS"
# `linear` (bf16 GEMV for decode, at most native_linear_max_rows() rows, kernels/ops.py; F.linear beyond) runs on:
# - x86-64: the AVX-512 variants, measured faster than torch's F.linear (oneDNN) there for bf16
#   decode; avx2 too: where oneDNN has no bf16 GEMM (AVX2-only CPUs such as Zen 3) its bf16
#   F.linear is 1.3-2x slower than avx2's GEMV at 1-16 rows (1536 x 576, 2 threads, Zen 3).
# - aarch64: neon (every Arm CPU), neon_bf16 (BFDOT), sve256 (SVE BFDOT). Chosen because a native multiply for every
#   projection lets the whole decode step run as one native call (decoder_stack / the decode
#   team; on x86 kernels on vs off measured 4.2-4.7x for bf16 decode), NOT because it was timed
#   against torch's oneDNN/ACL GEMV on Arm hardware: the Arm kernels have only run under QEMU,
#   where nothing can be timed. `ANYCORE_KERNELS=linear=torch-native` restores F.linear (the
#   stack then calls at::linear for the projections, and the decode team stays off).
# Elsewhere (generic, other architectures) torch-native (F.linear) replaces it.
# `w8a8_linear` (W8A8 INT8 GEMM/GEMV, weight pre-packed per variant) runs on the int8 dot-product
# variants (avx512_vnni: VPDPBUSD; dotprod: SDOT; i8mm: SMMLA), on avx2 (VPMADDUBSW: x86
# without VNNI, where torch._int_mm has no fast kernel: 387 ms for 512 x 576 x 1536 on Zen 3,
# avx2's 4.3 ms) and on generic C++ elsewhere; without the extension torch-native
# (torch._int_mm) replaces it.
# `gguf_linear` (GGUF Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K blocks, int8 activations per 32-block)
# runs on the int8 dot-product variants that have it (avx512_vnni: VPDPBUSD; dotprod: SDOT), on
# avx2 (VPMADDUBSW, x86 without VNNI) and generic C++ elsewhere; without the extension
# torch-native (blocks decoded per call) replaces it.
# (op, arch) -> variants never picked automatically there (an override still can): measured
# slower than torch-native. x86 generic int8 is baseline SSE2 C++ (no int8 dot product), some
# 10-100x behind torch._int_mm's oneDNN kernels on the SmolLM2 shapes.
# fused_moe_w8a8 runs on the same int8 kernels, so the same rule.
AUTO_SKIP: Mapping[tuple[str, str], tuple[str, ...]] = {("w8a8_linear", "x86_64"): ("generic",),
                                                        ("fused_moe_w8a8", "x86_64"): ("generic",)}


@dataclass(frozen=True)
class Variant:
    name: str
    arch: str  # 'x86_64' | 'aarch64' | 'any'
    requires: tuple[str, ...]  # CPU flags (features.py spelling)
    rank: int  # higher wins among usable variants
    source: str = ""  # translation unit under csrc/, '' for a reserved variant
    cflags: tuple[str, ...] = ()  # flags for that translation unit only
    ops: tuple[str, ...] = ()
    note: str = ""


_X86_AVX2 = ("-mavx2", "-mfma", "-mf16c")
_X86_AVX512 = _X86_AVX2 + ("-mavx512f", "-mavx512bw", "-mavx512vl")

VARIANTS: tuple[Variant, ...] = (
    Variant("generic", "any", (), 0, "generic/generic.cpp", (), ELEMENTWISE + ATTENTION + INT8 + GGUF,
            "portable C++ at the architecture's baseline ISA"),
    # x86-64
    Variant("avx2", "x86_64", ("avx2", "fma", "f16c"), 10, "x86/avx2.cpp", _X86_AVX2,
            ELEMENTWISE + ATTENTION + GEMV + INT8 + GGUF,
            "AVX2+FMA intrinsics; W8A8 and GGUF blocks on VPMADDUBSW"),
    Variant("avx512", "x86_64", ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl"), 20,
            "x86/avx512.cpp", _X86_AVX512, _VECTOR_OPS, "AVX-512 intrinsics, bf16 converted in software"),
    Variant("avx512_vnni", "x86_64", ("avx512f", "avx512bw", "avx512vl", "avx512_vnni"), 25,
            "x86/avx512_vnni.cpp", _X86_AVX512 + ("-mavx512vnni",), INT8 + GGUF,
            "VPDPBUSD int8 GEMM/GEMV (u8 activations + 128, column-sum correction); GGUF blocks"),
    Variant("avx512_bf16", "x86_64",
            ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni"), 30,
            "x86/avx512_bf16.cpp", _X86_AVX512 + ("-mavx512bf16", "-mavx512vnni"), _VECTOR_OPS,
            "AVX-512 with native bf16 conversion and VDPBF16PS dot products"),
    Variant("amx", "x86_64", ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_tile", "amx_int8"), 40,
            "x86/amx.cpp", _X86_AVX512 + ("-mavx512vnni", "-mamx-tile", "-mamx-int8"), INT8,
            "AMX-INT8 TDPBUSD tiles for M >= 32, VPDPBUSD below (same packed layout)"),
    # aarch64
    Variant("neon", "aarch64", ("asimd",), 10, "aarch64/neon.cpp", ("-march=armv8-a",), _VECTOR_OPS,
            "Advanced SIMD intrinsics"),
    Variant("neon_bf16", "aarch64", ("asimd", "bf16"), 12, "aarch64/neon_bf16.cpp",
            ("-march=armv8.2-a+bf16",), _VECTOR_OPS,
            "Neon with BFDOT bf16 dot products (linear, attention q.k); element-wise ops as neon"),
    Variant("dotprod", "aarch64", ("asimd", "asimddp"), 15, "aarch64/dotprod.cpp",
            ("-march=armv8.2-a+dotprod",), INT8 + GGUF, "SDOT int8 GEMM/GEMV; GGUF blocks"),
    Variant("i8mm", "aarch64", ("asimd", "i8mm"), 16, "aarch64/i8mm.cpp",
            ("-march=armv8.2-a+i8mm",), INT8, "SMMLA int8 GEMM/GEMV (2x8 blocks)"),
    # its kernels are written by hand (aarch64/sve.cpp), not over a vector type: it lists its
    # ops, so a new element-wise op is not claimed for it before it has an SVE kernel
    Variant("sve", "aarch64", ("sve",), 20, "aarch64/sve.cpp", ("-march=armv8.2-a+sve",),
            ("rms_norm", "add_rms_norm", "apply_rotary", "silu_and_mul"),
            "vector-length-agnostic SVE; paged_attention and linear stay on neon/neon_bf16"),
    # Compiled for exactly 256-bit vectors (-msve-vector-bits=256): on another SVE length its code
    # runs without faulting and computes wrong results, so it requires the `sve256` pseudo-flag
    # (features.py: SVE with sve_vector_bits == 256), which an override cannot get around either.
    # svebf16: SVE BFDOT (HWCAP2_SVEBF16; every 256-bit SVE CPU with bf16 so far, Graviton3).
    Variant("sve256", "aarch64", ("sve", "bf16", "svebf16", "sve256"), 25, "aarch64/sve256.cpp",
            ("-march=armv8.2-a+sve+bf16", "-msve-vector-bits=256"), _VECTOR_OPS,
            "fixed-length 256-bit SVE (Neoverse V1 / Graviton3), SVE BFDOT bf16 dot products"),
)


def variants_for_arch(arch: str) -> tuple[Variant, ...]:
    """Variants that apply to ``arch`` (including the portable one)."""
    return tuple(v for v in VARIANTS if v.arch in (arch, "any"))


def buildable_variants(arch: str) -> tuple[Variant, ...]:
    """Variants with a translation unit to compile for ``arch``."""
    return tuple(v for v in variants_for_arch(arch) if v.source)


def variant(name: str) -> Variant | None:
    return next((v for v in VARIANTS if v.name == name), None)


@dataclass(frozen=True)
class Choice:
    op: str
    impl: str  # a variant name, TORCH_NATIVE or REFERENCE
    reason: str


@dataclass(frozen=True)
class Selection:
    choices: tuple[Choice, ...]
    warnings: tuple[str, ...]

    def impl(self, op: str) -> str:
        return next(c.impl for c in self.choices if c.op == op)

    def as_dict(self) -> dict[str, str]:
        return {c.op: c.impl for c in self.choices}


def parse_overrides(text: str | None, ops: tuple[str, ...] = OPS) -> dict[str, str]:
    """``"torch-native"`` / ``"generic"`` (every op) or ``"op=impl,op=impl"`` (``*`` = every op
    of ``ops``)."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        op, sep, impl = part.partition("=")
        if not sep:
            op, impl = "*", part
        op, impl = op.strip(), impl.strip()
        for name in ops if op in ("*", "all") else (op,):
            out[name] = impl
    return out


def usable(v: Variant, features: CpuFeatures) -> bool:
    return v.arch in (features.arch, "any") and features.has(*v.requires)


def lacking(v: Variant, features: CpuFeatures) -> str:
    """What ``features`` lacks for ``v``, for messages: ``bf16``, or ``sve256 (SVE vector length
    128 bits, needs 256)`` for a vector-length pseudo-flag."""
    if v.arch not in (features.arch, "any"):
        return f"the architecture ({v.arch})"
    out = []
    for name in features.missing(v.requires):
        if is_sve_length_flag(name) and features.sve_vector_bits:
            name = f"{name} (SVE vector length {features.sve_vector_bits} bits, needs {name[3:]})"
        elif is_sve_length_flag(name):
            name = f"{name} (needs {name[3:]}-bit SVE vectors)"
        out.append(name)
    return ", ".join(out)


def select(
    features: CpuFeatures,
    available: Iterable[str] | None,
    overrides: Mapping[str, str] | str | None = None,
    ext_error: str = "",
    ops: tuple[str, ...] = OPS,
) -> Selection:
    """One choice per op of ``ops`` (the registry's by default). ``available``: variant names in
    the built extension, or ``None``."""
    avail = None if available is None else frozenset(available)
    if isinstance(overrides, str) or overrides is None:
        overrides = parse_overrides(overrides, ops)
    warnings: list[str] = []
    for op in overrides:
        if op not in ops:
            warnings.append(f"override for unknown op {op!r} ignored")
    choices = []
    for op in ops:
        auto = _auto(op, features, avail, ext_error)
        forced = overrides.get(op)
        if forced is None:
            choices.append(auto)
            continue
        problem = _override_problem(op, forced, features, avail)
        if problem:
            warnings.append(f"{ENV_OVERRIDE}: {op}={forced} refused ({problem}); using {auto.impl}")
            choices.append(auto)
        else:
            choices.append(Choice(op, forced, "forced by override"))
    warnings += _missing_variant_warnings(features, avail)
    return Selection(tuple(choices), tuple(warnings))


def _auto(op: str, features: CpuFeatures, avail, ext_error: str) -> Choice:
    skipped: list[str] = []
    candidates = sorted(
        (v for v in variants_for_arch(features.arch) if op in v.ops), key=lambda v: -v.rank
    )
    for v in candidates:
        if v.name in AUTO_SKIP.get((op, features.arch), ()):
            skipped.append(f"{v.name}: slower than {TORCH_NATIVE} for {op} on {features.arch}")
        elif not usable(v, features):
            skipped.append(f"{v.name}: CPU lacks {lacking(v, features)}")
        elif avail is None:
            skipped.append(f"{v.name}: extension unavailable{f' ({ext_error})' if ext_error else ''}")
            break
        elif v.name not in avail:
            skipped.append(f"{v.name}: not in the built extension")
        else:
            better = _reserved_better(op, features, v.rank)
            why = f"best usable variant ({', '.join(v.requires) or 'baseline ISA'})"
            return Choice(op, v.name, "; ".join([why, *better, *skipped]))
    if not candidates:
        skipped.append(f"no native variant of {op} on {features.arch}")
    return Choice(op, TORCH_NATIVE, "; ".join(skipped) or "fallback")


def _reserved_better(op: str, features: CpuFeatures, rank: int) -> list[str]:
    """Usable higher-ranked variants that do not implement ``op`` (e.g. AMX, i8mm)."""
    return [
        f"{v.name} present but has no {op}"
        for v in variants_for_arch(features.arch)
        if v.rank > rank and op not in v.ops and usable(v, features)
    ]


def _override_problem(op: str, impl: str, features: CpuFeatures, avail) -> str:
    if impl in (TORCH_NATIVE, REFERENCE):
        return ""
    v = variant(impl)
    if v is None:
        return "unknown implementation"
    if op not in v.ops:
        return f"{impl} does not implement {op}"
    if not usable(v, features):
        return f"CPU lacks {lacking(v, features)}"
    if avail is None or impl not in avail:
        return "not in the built extension"
    return ""


def _missing_variant_warnings(features: CpuFeatures, avail) -> list[str]:
    if avail is None:
        return []
    return [
        f"{v.name} usable on this CPU but the extension was built without it"
        for v in buildable_variants(features.arch)
        if usable(v, features) and v.name not in avail
    ]
