"""bench compare results: measurement records, anycore/peer ratios, table, JSON and charts from a fake result."""

from __future__ import annotations

import json

import pytest

from anycore.bench import report


def _fake_result():
    quiet = [{"other_cores": 0.02}]
    ms = [
        report.measurement("decode b=1", "anycore bf16", "tok/s", True, [100.0, 102.0, 98.0], quiet * 3, limit=200.0),
        report.measurement("decode b=1", "llama.cpp Q8_0", "tok/s", True, [50.0, 50.0, 50.0], quiet * 3),
        report.measurement("decode b=1", "transformers bf16", "tok/s", True, [40.0, 60.0], [{"other_cores": 0.5}] * 2),
        report.measurement("serve c=1 TTFT p50", "anycore-server bf16", "ms", False, [80.0], quiet),
        report.measurement("serve c=1 TTFT p50", "llama-server Q8_0", "ms", False, [100.0], quiet),
        report.measurement("prefill 512", "llama.cpp Q8_0", "tok/s", True, [900.0], quiet),  # no anycore cell
    ]
    report.add_ratios(ms)
    return {"meta": {"cpu_model": "Test CPU", "threads": 2}, "hardware": {"bandwidth": {"gb_s": 40.0},
            "peak_gemm_tflops": {"bf16": 0.9}}, "skipped": {"llama-server": "not built"}, "measurements": ms}


def test_measurement_fields():
    m = report.measurement("decode", "anycore bf16", "tok/s", True, [90.0, 100.0, 110.0], [{"other_cores": 0.0}] * 3,
                           limit=400.0, extra_field=1)
    assert m["median"] == 100.0 and m["fraction_of_limit"] == 0.25 and m["extra_field"] == 1
    assert m["noisy"] is False  # cv 10% is on the threshold, not over it


def test_ratios_reference_first_anycore_engine():
    ms = _fake_result()["measurements"]
    by = {(m["workload"], m["engine"]): m for m in ms}
    assert by[("decode b=1", "anycore bf16")]["ratio"] is None
    assert by[("decode b=1", "anycore bf16")]["ratio_ref"] == "anycore bf16"
    assert by[("decode b=1", "llama.cpp Q8_0")]["ratio"] == pytest.approx(2.0)
    assert by[("serve c=1 TTFT p50", "llama-server Q8_0")]["ratio"] == pytest.approx(0.8)  # latency: < 1 favours anycore
    assert by[("prefill 512", "llama.cpp Q8_0")]["ratio"] is None


def test_table_lists_every_cell_with_flags_and_skips():
    text = report.format_table(_fake_result())
    assert "anycore/this" in text.splitlines()[0]
    row = next(ln for ln in text.splitlines() if "llama.cpp Q8_0" in ln and "decode" in ln)
    assert "2.00" in row and "50.0" in row
    noisy = next(ln for ln in text.splitlines() if "transformers bf16" in ln)
    assert "NOISY" in noisy and "other load" in noisy and "cv" in noisy
    assert "50%" in next(ln for ln in text.splitlines() if "anycore bf16" in ln)  # of limit
    assert "skipped llama-server: not built" in text
    assert "1 of 6 measurements flagged NOISY" in text
    assert "Test CPU" in text


def test_json_round_trip(tmp_path):
    res = _fake_result()
    path = tmp_path / "sub" / "r.json"
    report.write_json_atomic(res, path)
    report.write_json_atomic(res, path)  # rewritten in place, as after every workload
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.json"]  # no temporary file left
    back = json.loads(path.read_text())
    assert back["measurements"][1]["ratio"] == pytest.approx(2.0)
    assert report.format_table(back) == report.format_table(res)


def test_charts_written(tmp_path):
    pytest.importorskip("matplotlib")
    from anycore.bench.charts import write_charts

    paths = write_charts(_fake_result(), tmp_path / "r")
    names = sorted(p.name for p in paths)
    assert names == ["r-decode.png", "r-prefill.png", "r-serving.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_limits_measured_under_load_are_flagged():
    res = _fake_result()
    assert "NOISY limits" not in report.format_table(res)
    res["hardware"]["load"] = {"other_cores": 1.2}
    assert "NOISY limits: other processes used 1.20 cores" in report.format_table(res)
