"""CPU feature detection on AArch64, checked against what the emulated CPU really offers.

The Arm64 lane (scripts/arm64-lane.sh) runs this once per QEMU CPU model and passes what that
model must report:

- ``ANYCORE_EXPECT_FEATURES``: comma-separated flags among ``ARM_FEATURES`` (an exact match over
  that vocabulary: a feature reported but absent is as wrong as one missed);
- ``ANYCORE_EXPECT_SVE_BITS``: the SVE vector length in bits, 0 without SVE.

Without these variables (a native Arm64 machine) the detection is still compared with the
kernel's own answer read independently through getauxval/prctl.
"""

from __future__ import annotations

import ctypes
import os
import platform

import pytest

from anycore.platform import selection
from anycore.platform.features import detect

pytestmark = [
    pytest.mark.arm64,
    pytest.mark.skipif(platform.machine().lower() not in ("aarch64", "arm64"), reason="needs aarch64"),
]

# The features the kernels and the selection table care about.
ARM_FEATURES = ("asimd", "asimddp", "i8mm", "bf16", "sve", "sve2", "svebf16")
# Linux arm64 uapi hwcap bits, written out again here so that the test does not trust the
# table it checks.
HWCAP = {"asimd": 1 << 1, "asimddp": 1 << 20, "sve": 1 << 22}
HWCAP2 = {"sve2": 1 << 1, "svebf16": 1 << 12, "i8mm": 1 << 13, "bf16": 1 << 14}


def _expected() -> frozenset[str] | None:
    raw = os.environ.get("ANYCORE_EXPECT_FEATURES")
    if raw is None:
        return None
    names = frozenset(f.strip() for f in raw.split(",") if f.strip())
    unknown = names - set(ARM_FEATURES)
    assert not unknown, f"ANYCORE_EXPECT_FEATURES names features outside {ARM_FEATURES}: {sorted(unknown)}"
    return names


def _kernel_features() -> frozenset[str]:
    libc = ctypes.CDLL(None)
    libc.getauxval.restype = ctypes.c_ulong
    libc.getauxval.argtypes = [ctypes.c_ulong]
    hwcap, hwcap2 = libc.getauxval(16), libc.getauxval(26)  # AT_HWCAP, AT_HWCAP2
    return frozenset(
        [n for n, bit in HWCAP.items() if hwcap & bit] + [n for n, bit in HWCAP2.items() if hwcap2 & bit]
    )


def _kernel_sve_bits() -> int:
    libc = ctypes.CDLL(None)
    libc.prctl.restype = ctypes.c_int
    ret = libc.prctl(51, 0, 0, 0, 0)  # PR_SVE_GET_VL; fails (EINVAL) without SVE
    return (ret & 0xFFFF) * 8 if ret > 0 else 0


def _relevant(flags) -> frozenset[str]:
    return frozenset(flags) & frozenset(ARM_FEATURES)


def test_reports_aarch64():
    assert detect().arch == "aarch64"


def test_features_match_kernel_auxv():
    assert _relevant(detect().flags) == _kernel_features()


def test_no_foreign_flags():
    """Under QEMU user-mode /proc/cpuinfo is the x86 host's (its ``flags`` line): an aarch64
    process must not report those as its own (on aarch64 the kernel's auxv is authoritative)."""
    x86_only = {"sse2", "sse4_2", "avx", "avx2", "avx512f", "fma", "f16c", "popcnt", "amx_tile"}
    assert not detect().flags & x86_only


def test_features_match_emulated_cpu():
    expected = _expected()
    if expected is None:
        pytest.skip("ANYCORE_EXPECT_FEATURES not set (only the Arm64 lane knows the CPU model)")
    cpu = os.environ.get("ANYCORE_EXPECT_CPU", "?")
    # First the lane itself: does QEMU grant what the lane thinks this CPU model has?
    assert _kernel_features() == expected, f"QEMU_CPU={cpu}: the kernel auxv disagrees with the lane's table"
    got = _relevant(detect().flags)
    assert got == expected, (
        f"QEMU_CPU={cpu}: missing {sorted(expected - got)}, unexpected {sorted(got - expected)}"
    )


def test_sve_vector_length():
    features = detect()
    raw = os.environ.get("ANYCORE_EXPECT_SVE_BITS")
    expected = int(raw) if raw else _kernel_sve_bits()
    assert features.sve_vector_bits == expected
    assert (features.sve_vector_bits > 0) == ("sve" in features.flags)


def test_selection_never_picks_a_variant_the_cpu_lacks():
    """Whatever the built extension offers, no op may land on an instruction set not granted."""
    features = detect()
    every_arm_variant = [v.name for v in selection.buildable_variants("aarch64")]
    chosen = selection.select(features, every_arm_variant).as_dict()
    for op, impl in chosen.items():
        variant = selection.variant(impl)
        if variant is not None:
            assert features.has(*variant.requires), f"{op} -> {impl} needs {variant.requires}"
    if "sve" not in features.flags:
        assert "sve" not in chosen.values()
    if features.sve_vector_bits != 256:  # fixed 256-bit code: wrong results elsewhere, not SIGILL
        assert "sve256" not in chosen.values()


def test_bf16_and_sve256_variants_are_chosen_where_they_apply():
    """neon_bf16 on every CPU with bf16, sve256 where SVE is 256 bits wide (QEMU max with
    sve-default-vector-length=32); the lane's kernel tests then run those variants."""
    features = detect()
    chosen = selection.select(features, [v.name for v in selection.buildable_variants("aarch64")]).as_dict()
    if features.sve_vector_bits == 256 and features.has("bf16", "svebf16"):
        expected = "sve256"
    elif features.has("bf16"):
        expected = "neon_bf16"
    else:
        expected = "neon"
    assert chosen["linear"] == chosen["paged_attention"] == expected
    if expected == "sve256":
        assert chosen["rms_norm"] == chosen["silu_and_mul"] == "sve256"
    elif "sve" in features.flags:
        assert chosen["rms_norm"] == chosen["silu_and_mul"] == "sve"  # vector-length agnostic
