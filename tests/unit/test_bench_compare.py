"""bench compare orchestration without heavy work: fake runners, a missing peer, the noise monitor."""

from __future__ import annotations

import argparse
import builtins
import sys
import time
from pathlib import Path

import pytest

from anycore.bench import compare as cmp
from anycore.bench import peers_offline
from anycore.bench.load import LoadMonitor
from anycore.config import EngineConfig


def _args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cmp.add_compare_args(p)
    return p.parse_args(["--out", str(tmp_path / "r.json"), "--cache-dir", str(tmp_path / "cache"),
                         "--settle", "0", *argv])


class FakeRunner(peers_offline.Runner):
    calls: list[str] = []

    def __init__(self, name: str, *_: object, **__: object) -> None:
        super().__init__(name, "bf16", 1_000_000, {})

    def decode(self, n, rng):
        FakeRunner.calls.append(self.name)
        return 100.0 if self.name.startswith("anycore") else 50.0

    def prefill(self, n, rng):
        FakeRunner.calls.append(self.name)
        return 1000.0


def test_missing_llama_cpp_is_skipped_not_an_error(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_llama(name, *a, **kw):
        if name == "llama_cpp" or name.startswith("llama_cpp."):
            raise ImportError("No module named 'llama_cpp'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_llama)
    for name in [m for m in sys.modules if m == "llama_cpp" or m.startswith("llama_cpp.")]:
        monkeypatch.delitem(sys.modules, name)  # an earlier test may have imported it for real
    monkeypatch.setattr(cmp, "AnycoreRunner", FakeRunner)
    monkeypatch.setattr(cmp, "TransformersRunner", FakeRunner)
    monkeypatch.setattr(cmp, "gguf_variant", lambda src, qt, cache: src)  # pretend the copies exist
    monkeypatch.setattr(peers_offline, "gguf_type", lambda p: "Q4_1")
    with pytest.raises(peers_offline.PeerUnavailable, match="llama_cpp not importable"):
        peers_offline.require("llama_cpp", "pip install -e .[bench]")
    c = cmp.Compare(_args(tmp_path, "--gguf-types", "Q4_1,Q8_0", "--hf-dtypes", "bf16"), EngineConfig(threads=2))
    runners = c._runners(tmp_path / "m.gguf")
    assert [r.name for r in runners] == ["anycore bf16", "transformers bf16"]
    assert set(c.skipped) == {"llama.cpp Q4_1", "llama.cpp Q8_0"}
    assert "not importable" in c.skipped["llama.cpp Q8_0"]


def test_offline_interleaves_and_records(tmp_path, monkeypatch):
    FakeRunner.calls = []
    monkeypatch.setattr(cmp, "AnycoreRunner", FakeRunner)
    monkeypatch.setattr(cmp, "TransformersRunner", FakeRunner)
    args = _args(tmp_path, "--peers", "transformers", "--hf-dtypes", "bf16,fp32", "--repeats", "2",
                 "--workloads", "decode,prefill")
    probes = iter([1.5, 2.5])  # the bandwidth probed again before each decode round
    monkeypatch.setattr(cmp.hardware, "memory_bandwidth",
                        lambda threads, cache, passes=8: {"gb_s": next(probes), "passes": passes})
    c = cmp.Compare(args, EngineConfig(threads=2))
    c.offline(tmp_path / "m.gguf", {"bandwidth_gb_s": 1.0, "peak": {"bf16": 1.0}, "prefill_flops_per_token": 1e9})
    order = ["anycore bf16", "transformers bf16", "transformers fp32"]
    assert FakeRunner.calls == order * 2 + order * 2  # decode rounds A B C A B C, then prefill rounds
    dec = [m for m in c.measurements if m["workload"].startswith("decode")]
    assert [m["engine"] for m in dec] == order
    assert dec[0]["bandwidth_rounds_gb_s"] == [1.5, 2.5]
    assert dec[0]["limit"] == pytest.approx(2000.0)  # median 2 GB/s over 1 MB of weights
    assert all(len(m["values"]) == 2 and len(m["loads"]) == 2 for m in dec)
    pre = [m for m in c.measurements if m["workload"].startswith("prefill")]
    assert pre[0]["limit"] == pytest.approx(1000.0)  # 1 TFLOP/s over 1 GFLOP per token


def test_quick_shrinks_the_run(tmp_path):
    a = _args(tmp_path, "--quick")
    cmp.apply_quick(a)
    assert a.repeats == 1 and a.decode_tokens == 32 and a.concurrency == "1,4"


def test_unknown_workload_rejected(tmp_path):
    with pytest.raises(SystemExit):
        cmp.Compare(_args(tmp_path, "--workloads", "decode,bogus"), EngineConfig())


def test_llama_server_without_build_is_unavailable(tmp_path):
    from anycore.bench.peers_server import ensure_llama_server

    with pytest.raises(peers_offline.PeerUnavailable, match="not built"):
        ensure_llama_server(tmp_path, build=False)


def test_load_monitor_reports_own_and_other_cores():
    with LoadMonitor(interval=0.05) as m:
        t0 = time.process_time()
        while time.process_time() - t0 < 0.2:  # burn CPU in our own process
            pass
    r = m.report
    assert r.wall_s > 0.15 and r.own_cores * r.wall_s > 0.15  # >= 0.2 s burned, less sampling slack
    assert r.other_cores >= 0 and r.other_cores_max >= r.other_cores
    assert set(r.as_dict()) == {"wall_s", "other_cores", "other_cores_max", "own_cores"}


def test_llama_cpp_crash_in_probe_is_a_skip(tmp_path, monkeypatch):
    import subprocess

    def sigill(*a, **kw):
        return subprocess.CompletedProcess(a[0], -4, "", "")

    monkeypatch.setattr(subprocess, "run", sigill)
    with pytest.raises(peers_offline.PeerUnavailable, match="signal 4"):
        peers_offline.probe_llama_cpp(tmp_path / "m.gguf", 1)


def test_llama_server_build_folder_depends_on_extra_args():
    from anycore.bench.peers_server import _build_name

    assert _build_name("") == "build"
    assert _build_name("-DGGML_NATIVE=OFF") != _build_name("-DGGML_NATIVE=OFF -DGGML_AVX512=ON")


def test_short_lived_child_counts_as_own_load():
    import subprocess
    import sys

    with LoadMonitor(interval=5.0) as m:  # no sample while the child lives
        subprocess.run([sys.executable, "-c", "import time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass"],
                       check=True)
    assert m.report.own_cores * m.report.wall_s > 0.25
