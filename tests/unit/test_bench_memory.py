"""bench compare's memory phase and the quantization targets, with fake probes (no model)."""

from __future__ import annotations

import pytest

from anycore.bench import report
from anycore.bench.compare import memory_phase, offline_phase
from anycore.bench.peers.base import PeerUnavailable, Runner
from anycore.config import EngineConfig
from tests.unit.bench_helpers import compare_context

MB = 1 << 20


def _fake_rss(load_mb: float, gen_mb: float, import_mb: float = 200.0) -> dict:
    def point(mb: float) -> dict:
        return {"VmRSS": mb * MB, "VmHWM": (mb + 50) * MB, "RssAnon": mb * 0.8 * MB, "RssFile": mb * 0.2 * MB}

    return {"import": point(import_mb), "load": point(load_mb), "generate": point(gen_mb), "weight_bytes": 1e8}


def test_memory_phase_rows_and_skips(tmp_path, monkeypatch):
    seen = []

    def anycore_rss(config, n):
        seen.append((config.quantization, n))
        return _fake_rss(400, 410) if config.quantization not in (None, "none") else _fake_rss(600, 620)

    def llama_rss(path, threads, n):
        raise PeerUnavailable("llama_cpp not importable")

    monkeypatch.setattr(memory_phase, "anycore_rss", anycore_rss)
    monkeypatch.setattr(memory_phase, "llama_cpp_rss", llama_rss)
    monkeypatch.setattr(memory_phase, "gguf_variant", lambda src, qt, cache: src)
    c = compare_context(tmp_path, "--gguf-types", "Q8_0", "--memory-gen-tokens", "8",
                        config=EngineConfig(threads=2, quantization="w8a8_int8"))
    written = []
    monkeypatch.setattr(c.results, "checkpoint", lambda error=None: written.append(len(c.results.measurements)))
    memory_phase.run_memory(c, tmp_path / "m.gguf")
    assert written == [4]
    assert seen == [("none", 8), ("w8a8_int8", 8)]
    assert "llama.cpp Q8_0 memory" in c.results.skipped
    rows = {(m["workload"], m["engine"]): m for m in c.results.measurements}
    assert rows[("RSS after load", "anycore bf16")]["median"] == pytest.approx(600)
    gen = rows[("RSS after load + 8 tok", "anycore w8a8_int8")]
    assert gen["median"] == pytest.approx(410) and gen["import_mb"] == pytest.approx(200)
    assert not gen["higher_is_better"] and gen["unit"] == "MB"
    targets = report.quantization_targets(c.results.measurements, "w8a8_int8")
    t = next(t for t in targets if t["workload"] == "RSS after load + 8 tok")
    assert t["ratio"] == pytest.approx(410 / 620) and t["ratio_above_import"] == pytest.approx(210 / 420)
    assert t["met"] is False


def test_memory_models_are_measured_on_anycore_only_and_tagged(tmp_path, monkeypatch):
    seen = []

    def anycore_rss(config, n):
        seen.append((config.model, config.quantization))
        big = config.model is not None and config.model.endswith("big")
        return _fake_rss(1800, 1900) if config.quantization not in (None, "none") and big else _fake_rss(3500, 3600) if big else _fake_rss(500, 510)

    def llama_rss(path, threads, n):
        seen.append(("llama", path.name))
        return _fake_rss(300, 310)

    monkeypatch.setattr(memory_phase, "anycore_rss", anycore_rss)
    monkeypatch.setattr(memory_phase, "llama_cpp_rss", llama_rss)
    monkeypatch.setattr(memory_phase, "gguf_variant", lambda src, qt, cache: src)
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text("{}")  # an HF folder, as far as the argument check looks
    c = compare_context(tmp_path, "--gguf-types", "Q8_0", "--memory-gen-tokens", "8", "--memory-models", str(big),
                        config=EngineConfig(threads=2, quantization="w8a8_int8"))
    written = []
    monkeypatch.setattr(c.results, "checkpoint", lambda error=None: written.append(len(c.results.measurements)))
    memory_phase.run_memory(c, tmp_path / "m.gguf")
    assert written == [6, 10]  # after the run's model, after the bigger one
    assert seen == [(None, "none"), (None, "w8a8_int8"), ("llama", "m.gguf"), (str(big), "none"), (str(big), "w8a8_int8")]
    rows = {(m["workload"], m["engine"]): m for m in c.results.measurements}
    assert rows[("RSS after load + 8 tok [big]", "anycore w8a8_int8")]["median"] == pytest.approx(1900)
    assert ("RSS after load + 8 tok [big]", "llama.cpp Q8_0") not in rows
    targets = report.quantization_targets(c.results.measurements, "w8a8_int8")
    t = next(t for t in targets if t["workload"] == "RSS after load + 8 tok [big]")
    assert t["ratio"] == pytest.approx(1900 / 3600) and t["met"] is True


def test_targets_against_llama_cpp_q8_0():
    def cell(workload, engine, median, limit=None):
        return report.measurement(workload, engine, "tok/s", True, [median], [{"other_cores": 0.0}], limit)

    ms = [cell("decode b=1", "anycore bf16", 60), cell("decode b=1", "anycore w8a8_int8", 220, limit=400),
          cell("decode b=1", "llama.cpp Q8_0", 160), cell("prefill 512", "anycore w8a8_int8", 1500),
          cell("prefill 512", "llama.cpp Q8_0", 900)]
    got = {(t["workload"], t["versus"]): t for t in report.quantization_targets(ms, "w8a8_int8")}
    assert got[("decode b=1", "llama.cpp Q8_0")]["ratio"] == pytest.approx(220 / 160)
    assert got[("decode b=1", "llama.cpp Q8_0")]["met"] is True
    assert got[("prefill 512", "llama.cpp Q8_0")]["met"] is False
    assert got[("decode b=1", "bandwidth limit")]["ratio"] == pytest.approx(0.55)
    assert report.quantization_targets(ms, None) == []
    text = report.format_table({"measurements": ms, "targets": list(got.values()), "meta": {"quantization": "w8a8_int8"}})
    assert "wanted >= 2.0 NOT met" in text and "wanted >= 1.3 met" in text


def test_gguf_targets_are_against_llama_cpp_on_the_same_file():
    """A GGUF served in its own blocks runs the model file itself (here Q4_1): its decode target
    is llama.cpp on that file, never a re-quantized copy such as Q8_0, and has no prefill target."""
    def cell(workload, engine, median):
        return report.measurement(workload, engine, "tok/s", True, [median], [{"other_cores": 0.0}], None)

    ms = [cell("decode b=1", "anycore gguf", 250), cell("decode b=1", "llama.cpp Q4_1", 100),
          cell("decode b=1", "llama.cpp Q8_0", 80), cell("prefill 512", "anycore gguf", 2800),
          cell("prefill 512", "llama.cpp Q4_1", 300), cell("prefill 512", "llama.cpp Q8_0", 560)]
    got = [(t["workload"], t["versus"], t["ratio"]) for t in report.quantization_targets(ms, "gguf", "Q4_1")]
    assert got == [("decode b=1", "llama.cpp Q4_1", pytest.approx(2.5))]


def test_noisy_repeat_is_measured_again(tmp_path, monkeypatch):
    from anycore.bench.load import LoadReport

    class FakeRunner(Runner):
        def __init__(self, name, *_, **__):
            super().__init__(name, "bf16", 1_000_000, {})
            self.calls = 0
            self.draws: list[int] = []

        def decode(self, n, rng):
            self.calls += 1
            self.draws.append(rng.randrange(10**9))  # stands for the prompt
            return float(self.calls)

    others = iter([0.9, 0.0, 0.0, 0.9, 0.9])  # anycore: noisy then quiet; 2nd repeat quiet; ...

    class FakeMonitor:
        def __enter__(self):
            self.report = LoadReport(wall_s=1.0, other_cores=next(others, 0.0))
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(offline_phase, "LoadMonitor", lambda *a, **k: FakeMonitor())
    c = compare_context(tmp_path, "--peers", "none", "--repeats", "3", "--workloads", "decode", "--retry-noisy", "1")
    runners = []
    monkeypatch.setattr(offline_phase, "AnycoreRunner",
                        lambda *a, **k: runners.append(FakeRunner(*a, **k)) or runners[-1])
    offline_phase.run_offline(c, tmp_path / "m.gguf", {})
    (m,) = c.results.measurements
    draws = runners[0].draws
    assert draws[0] != draws[1]  # a retry never reuses the discarded attempt's prompt (prefix cache)
    # repeat 0: attempt 1 discarded (0.9), attempt 2 kept; repeat 1 kept; repeat 2: 0.9 then 0.9, the last kept
    assert m["values"] == [2.0, 3.0, 5.0] and m["discarded_noisy"] == 2
    assert m["noisy"]  # the kept last attempt was still busy: the cell says so


def test_int8_head_variant_joins_the_run(tmp_path):
    """--quantize-lm-head adds the quantized engine a second time with an int8 head; bf16 and
    the plain quantized engine never get the flag (bf16 could not even be configured with it)."""
    c = compare_context(tmp_path, "--kernels-off",
                        config=EngineConfig(threads=2, quantization="w8a8_int8", quantize_lm_head=True))
    offline = dict(c.anycore_engines(offline=True))
    assert list(offline) == ["anycore bf16", "anycore bf16 torch-native", "anycore w8a8_int8",
                             "anycore w8a8_int8 +int8 head"]
    assert [(e.quantization, e.quantize_lm_head, e.kernels) for e in offline.values()] == [
        ("none", False, None), ("none", False, "torch-native"), ("w8a8_int8", False, None), ("w8a8_int8", True, None)]
    assert list(dict(c.anycore_engines(offline=False))) == ["anycore bf16", "anycore w8a8_int8",
                                                            "anycore w8a8_int8 +int8 head"]
    ms = [report.measurement("decode b=1", name, "tok/s", True, [v], [{"other_cores": 0.0}])
          for name, v in (("anycore w8a8_int8", 100), ("anycore w8a8_int8 +int8 head", 130), ("llama.cpp Q8_0", 80))]
    got = {t["engine"]: t for t in report.quantization_targets(ms, "w8a8_int8")}
    assert got["anycore w8a8_int8"]["met"] is False and got["anycore w8a8_int8 +int8 head"]["met"] is True
