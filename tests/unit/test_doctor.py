"""`anycore doctor` reports the CPU, the per-op choice and warnings, for real and injected CPUs."""

from __future__ import annotations

import pytest

from anycore.doctor import run_doctor
from anycore.platform.features import CpuFeatures
from anycore.platform.selection import OPS


@pytest.mark.arm64
def test_doctor_on_this_machine():
    report = run_doctor()
    for op in OPS:
        assert op in report
    assert "CPU" in report and "extension" in report and "threads" in report


def test_doctor_with_injected_cpu_and_override():
    f = CpuFeatures("x86_64", frozenset({"avx2", "fma", "f16c"}), model_name="FakeCPU", numa_nodes=2)
    report = run_doctor(f, overrides="paged_attention=torch-native")
    assert "FakeCPU" in report and "NUMA" in report
    line = next(ln for ln in report.splitlines() if ln.strip().startswith("paged_attention"))
    assert "torch-native" in line and "forced by override" in line
