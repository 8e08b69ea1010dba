"""The bandwidth probe of `anycore bench compare`: it compiles, runs the threads it was asked for and
reports every variant. No assertion on the measured rate beyond > 0: the machine is shared."""

from __future__ import annotations

import shutil

import pytest

from anycore.bench import hardware

needs_cc = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")),
                              reason="no C compiler")


@needs_cc
@pytest.mark.parametrize("threads", [1, 2])
def test_probe_runs_the_threads_it_was_asked_for(tmp_path, threads):
    bw = hardware.memory_bandwidth(threads, tmp_path, mib=16, passes=1)
    assert bw["method"] == "C vector read (OpenMP)", bw  # the OpenMP build, not a fallback
    assert bw["threads"] == threads and bw["mib"] == 16
    assert bw["gb_s"] > 0
    assert set(bw["variants_gb_s"]) == {"no-prefetch", "prefetch-1k", "prefetch-4k", "prefetch-16k"}
    assert bw["best_variant"] in bw["variants_gb_s"]
    assert bw["gb_s"] == pytest.approx(max(bw["variants_gb_s"].values()), rel=1e-3)  # the best variant counts


@needs_cc
def test_probe_binary_is_cached_per_source(tmp_path, monkeypatch):
    # an older probe under the old cache name must not be picked up
    old = tmp_path / "stream_read-x"
    old.write_text("#!/bin/sh\necho 999 2 stale\n")
    old.chmod(0o755)
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x")
    exe = hardware._compile_stream(tmp_path)
    assert exe is not None and exe != old and exe.name.startswith("stream_read-x-")
    mtime = exe.stat().st_mtime_ns
    assert hardware._compile_stream(tmp_path) == exe and exe.stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert "-O3" in (tmp_path / (exe.name + ".flags")).read_text()
    edited = tmp_path / "stream_read.c"
    edited.write_text(hardware.STREAM_SOURCE.read_text() + "\n/* edited */\n")
    monkeypatch.setattr(hardware, "STREAM_SOURCE", edited)
    assert hardware._compile_stream(tmp_path) != exe  # an edited probe gets its own binary


@needs_cc
def test_without_its_source_numpy_is_the_fallback(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "STREAM_SOURCE", tmp_path / "missing.c")
    assert hardware._compile_stream(tmp_path) is None


def test_without_a_compiler_numpy_is_the_fallback(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware.shutil, "which", lambda name: None)
    bw = hardware.memory_bandwidth(2, tmp_path, mib=8)
    assert bw["method"].startswith("numpy") and bw["threads"] == 1 and bw["gb_s"] > 0


def test_parse_probe_output():
    out = "26.5 2 prefetch-4k\nno-prefetch 24.0\nprefetch-4k 26.5\n123456\n"
    assert hardware._parse_stream(out) == (26.5, 2, "prefetch-4k", {"no-prefetch": 24.0, "prefetch-4k": 26.5})


def test_cpu_model_is_a_string():
    assert isinstance(hardware.cpu_model(), str) and hardware.cpu_model()

