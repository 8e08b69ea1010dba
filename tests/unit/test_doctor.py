"""`anycore doctor` reports the CPU, the per-op choice and warnings, for real and injected CPUs."""

from __future__ import annotations

import dataclasses
import re

import pytest

from anycore.doctor import extension_origin, run_doctor
from anycore.kernels.build import ExtensionInfo
from anycore.platform.features import CpuFeatures
from anycore.platform.selection import OPS


@pytest.mark.arm64
def test_doctor_on_this_machine():
    report = run_doctor()
    for op in OPS:
        assert op in report
    assert "CPU" in report and "threads" in report
    origin = next(ln for ln in report.splitlines() if ln.startswith("extension "))
    assert origin.split(" ", 1)[1].lstrip().startswith(
        ("prebuilt in the wheel (", "JIT cache (", "ANYCORE_EXT_DIR (", "unavailable (")), origin


def test_doctor_says_where_the_extension_came_from():
    wheel = ExtensionInfo(available=True, path="/site/anycore/_native/lib.so", origin="prebuilt", cached=True)
    assert extension_origin(wheel) == "prebuilt in the wheel (/site/anycore/_native/lib.so)"
    jit = ExtensionInfo(available=True, path="/home/u/.cache/anycore/ext/ab/lib.so", origin="jit", cached=True)
    assert extension_origin(jit) == "JIT cache (/home/u/.cache/anycore/ext/ab/lib.so; cached)"
    fresh = dataclasses.replace(jit, cached=False, build_seconds=31.5)
    assert extension_origin(fresh) == "JIT cache (/home/u/.cache/anycore/ext/ab/lib.so; compiled now, in 31.5s)"
    missing = ExtensionInfo(available=False, error="no C++ compiler 'g++'")
    assert extension_origin(missing) == "unavailable (no C++ compiler 'g++')"


def test_doctor_with_injected_cpu_and_override():
    f = CpuFeatures("x86_64", frozenset({"avx2", "fma", "f16c"}), model_name="FakeCPU", numa_nodes=2)
    report = run_doctor(f, overrides="paged_attention=torch-native")
    assert "FakeCPU" in report and "NUMA" in report
    line = next(ln for ln in report.splitlines() if ln.strip().startswith("paged_attention"))
    assert "torch-native" in line and "forced by override" in line


@pytest.mark.arm64
def test_doctor_on_arm_reports_the_sve_length_and_the_untimed_linear():
    from anycore.kernels.build import load_extension

    sve128 = CpuFeatures("aarch64", frozenset({"asimd", "asimddp", "bf16", "sve", "svebf16"}), sve_vector_bits=128)
    report = run_doctor(sve128)
    assert "SVE       128-bit vectors (sve256: not used, built for another length)" in report
    for op in ("paged_attention", "linear"):
        line = next(ln for ln in report.splitlines() if ln.strip().startswith(op))
        assert "sve256: CPU lacks sve256 (SVE vector length 128 bits, needs 256)" in line
    ext = load_extension()
    if ext.available and ext.arch == "aarch64":  # on Arm the injected CPU gets the real extension
        assert re.search(r"^\s*linear\s+neon_bf16\s", report, re.M), report  # (column width follows the op names)
        assert "not timed against torch's oneDNN/ACL on Arm hardware" in report
    sve256 = CpuFeatures("aarch64", sve128.flags, sve_vector_bits=256)
    assert "SVE       256-bit vectors (sve256: for this length)" in run_doctor(sve256)
