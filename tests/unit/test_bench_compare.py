"""bench compare orchestration without heavy work: fake runners, a missing peer, the noise monitor."""

from __future__ import annotations

import builtins
import sys
import time

import pytest

from anycore.bench.compare import offline_phase
from anycore.bench.compare.args import apply_quick
from anycore.bench.load import LoadMonitor
from anycore.bench.peers import base, gguf_files, llama_cpp
from anycore.config import EngineConfig
from tests.unit.bench_helpers import compare_args, compare_context


class FakeRunner(base.Runner):
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
    monkeypatch.setattr(offline_phase, "AnycoreRunner", FakeRunner)
    monkeypatch.setattr(offline_phase, "TransformersRunner", FakeRunner)
    monkeypatch.setattr(offline_phase, "gguf_variant", lambda src, qt, cache: src)  # pretend the copies exist
    monkeypatch.setattr(gguf_files, "gguf_type", lambda p: "Q4_1")
    with pytest.raises(base.PeerUnavailable, match="llama_cpp not importable"):
        base.require("llama_cpp", "pip install -e .[bench]")
    ctx = compare_context(tmp_path, "--gguf-types", "Q4_1,Q8_0", "--hf-dtypes", "bf16")
    runners = offline_phase.load_runners(ctx, tmp_path / "m.gguf")
    assert [r.name for r in runners] == ["anycore bf16", "transformers bf16"]
    assert set(ctx.results.skipped) == {"llama.cpp Q4_1", "llama.cpp Q8_0"}
    assert "not importable" in ctx.results.skipped["llama.cpp Q8_0"]


def test_offline_interleaves_records_and_checkpoints(tmp_path, monkeypatch):
    FakeRunner.calls = []
    monkeypatch.setattr(offline_phase, "AnycoreRunner", FakeRunner)
    monkeypatch.setattr(offline_phase, "TransformersRunner", FakeRunner)
    probes = iter([1.5, 2.5])  # the bandwidth probed again before each decode round
    monkeypatch.setattr(offline_phase.hardware, "memory_bandwidth",
                        lambda threads, cache, passes=8: {"gb_s": next(probes), "passes": passes})
    ctx = compare_context(tmp_path, "--peers", "transformers", "--hf-dtypes", "bf16,fp32", "--repeats", "2",
                          "--workloads", "decode,prefill")
    written = []
    monkeypatch.setattr(ctx.results, "checkpoint", lambda error=None: written.append(len(ctx.results.measurements)))
    offline_phase.run_offline(ctx, tmp_path / "m.gguf",
                              {"bandwidth_gb_s": 1.0, "peak": {"bf16": 1.0}, "prefill_flops_per_token": 1e9})
    order = ["anycore bf16", "transformers bf16", "transformers fp32"]
    assert FakeRunner.calls == order * 2 + order * 2  # decode rounds A B C A B C, then prefill rounds
    assert written == [3, 6]  # the JSON rewritten after each workload
    ms = ctx.results.measurements
    dec = [m for m in ms if m["workload"].startswith("decode")]
    assert [m["engine"] for m in dec] == order
    assert dec[0]["bandwidth_rounds_gb_s"] == [1.5, 2.5]
    assert dec[0]["limit"] == pytest.approx(2000.0)  # median 2 GB/s over 1 MB of weights
    assert all(len(m["values"]) == 2 and len(m["loads"]) == 2 for m in dec)
    pre = [m for m in ms if m["workload"].startswith("prefill")]
    assert pre[0]["limit"] == pytest.approx(1000.0)  # 1 TFLOP/s over 1 GFLOP per token


def test_quick_shrinks_the_run(tmp_path):
    a = compare_args(tmp_path, "--quick")
    apply_quick(a)
    assert a.repeats == 1 and a.decode_tokens == 32 and a.concurrency == "1,4"


def test_anycore_runner_draws_the_peers_prompts():
    """anycore and the peers see the same token ids for the same seed (same draws, same order)."""
    import random

    from anycore.bench.peers.anycore_runner import shared_prompts

    assert shared_prompts(random.Random(3))(20) == base.random_prompt(random.Random(3), 20)


def test_llama_server_without_build_is_unavailable(tmp_path):
    from anycore.bench.peers.llama_server_build import ensure_llama_server

    with pytest.raises(base.PeerUnavailable, match="not built"):
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
    with pytest.raises(base.PeerUnavailable, match="signal 4"):
        llama_cpp.probe_llama_cpp(tmp_path / "m.gguf", 1)


def test_llama_server_build_folder_depends_on_extra_args():
    from anycore.bench.peers.llama_server_build import _build_name

    assert _build_name("") == "build"
    assert _build_name("-DGGML_NATIVE=OFF") != _build_name("-DGGML_NATIVE=OFF -DGGML_AVX512=ON")


def test_short_lived_child_counts_as_own_load():
    import subprocess

    with LoadMonitor(interval=5.0) as m:  # no sample while the child lives
        subprocess.run([sys.executable, "-c", "import time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass"],
                       check=True)
    assert m.report.own_cores * m.report.wall_s > 0.25


def test_threads_resolved_for_every_engine(tmp_path):
    ctx = compare_context(tmp_path, config=EngineConfig(threads=None))
    assert ctx.threads >= 1 and all(c.threads == ctx.threads for _, c in ctx.anycore_engines(offline=True))


def test_prefill_limit_counts_the_wider_float_gemm_where_it_is_faster():
    # an AVX2-only host: torch's bf16 and int8 GEMMs crawl, fp32 runs (a Zen 3's probe)
    avx2 = {"fp32": 0.146, "bf16": 0.0009, "int8": 0.0019}
    assert offline_phase.prefill_peak(avx2, "bf16") == 0.146
    assert offline_phase.prefill_peak(avx2, "int8") == 0.146
    assert offline_phase.prefill_peak(avx2, "fp32") == 0.146
    # a host with native bf16 / int8 GEMMs keeps each class's own, faster rate
    avx512 = {"fp32": 0.20, "bf16": 0.91, "int8": 1.90}
    assert offline_phase.prefill_peak(avx512, "bf16") == 0.91
    assert offline_phase.prefill_peak(avx512, "int8") == 1.90
    assert offline_phase.prefill_peak(avx512, "fp32") == 0.20
    assert offline_phase.prefill_peak({}, "bf16") is None
    assert offline_phase.prefill_peak({"int8": 1.0}, "fp32") is None
