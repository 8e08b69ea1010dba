"""Every `anycore bench` flag is checked before any model load or measurement: a bad one ends the
command with one line on stderr and exit status 2, and nothing has started (the work is replaced
by a tripwire that fails the test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anycore import cli
from anycore.bench import hardware, offline, serving
from anycore.bench.compare import args as compare_checks
from anycore.bench.compare import run as compare_run
from anycore.engine import engine as engine_module
from tests.unit.bench_helpers import compare_args, compare_context


def _tripwire(*_a, **_k):
    raise AssertionError("work started before the arguments were checked")


@pytest.fixture
def no_work(monkeypatch):
    """Any model load or measurement fails the test."""
    monkeypatch.setattr(engine_module.Engine, "__init__", _tripwire)
    monkeypatch.setattr(compare_run, "execute", _tripwire)
    monkeypatch.setattr(hardware, "memory_bandwidth", _tripwire)
    monkeypatch.setattr(hardware, "peak_gemm", _tripwire)
    monkeypatch.setattr(offline, "run_latency", _tripwire)
    monkeypatch.setattr(offline, "run_throughput", _tripwire)
    monkeypatch.setattr(serving, "benchmark", _tripwire)


def _fails(capsys, argv: list[str], flag: str) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error:" in err and flag in err, err
    return err


def _compare(tmp_path: Path, *argv: str) -> list[str]:
    return ["bench", "compare", "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out"), *argv]


@pytest.fixture
def a_file(tmp_path) -> Path:
    f = tmp_path / "plain.txt"
    f.write_text("x")
    return f


@pytest.mark.parametrize("argv, flag", [
    (["--workloads", "decode,bogus"], "--workloads"),
    (["--workloads", ""], "--workloads"),
    (["--peers", "llama-cpp,vllm"], "--peers"),
    (["--gguf-types", "Q9_9"], "--gguf-types"),
    (["--server-gguf-types", "Q2_K"], "--server-gguf-types"),
    (["--hf-dtypes", "fp16"], "--hf-dtypes"),
    (["--repeats", "0"], "--repeats"),
    (["--decode-tokens", "-1"], "--decode-tokens"),
    (["--settle", "-0.5"], "--settle"),
    (["--retry-noisy", "-1"], "--retry-noisy"),
    (["--concurrency", "1,x"], "--concurrency"),
    (["--concurrency", "0,4"], "--concurrency"),
    (["--threads", "0"], "--threads"),
    (["--model", "/no/such/model.gguf"], "--model"),
    (["--memory-models", "/no/such/bigger"], "--memory-models"),
    (["--prefill-tokens", "9000"], "context of 8192"),  # the default model's context
    (["--prefill-tokens", "3000", "--peers", "llama-cpp"], "llama.cpp's context"),
    (["--prefix-len", "1100", "--peers", "llama-server"], "llama-server"),
    (["--max-model-len", "200", "--workloads", "serve"], "--max-model-len"),
])
def test_compare_rejects_bad_flags_before_work(tmp_path, capsys, no_work, argv, flag):
    err = _fails(capsys, _compare(tmp_path, *argv), flag)
    assert err.startswith("anycore bench compare: error:")


def test_compare_rejects_bad_paths(tmp_path, capsys, no_work, a_file):
    _fails(capsys, _compare(tmp_path, "--out", str(a_file / "r.json")), "--out")  # under a file
    _fails(capsys, _compare(tmp_path, "--cache-dir", str(a_file / "cache")), "--cache-dir")
    _fails(capsys, _compare(tmp_path, "--model", str(a_file)), "--model")  # not a .gguf
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    _fails(capsys, _compare(tmp_path, "--model", str(hf)), "needs a GGUF file")  # llama.cpp reads the same file


def test_out_folder_or_file(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    assert compare_checks.check_compare(compare_args(tmp_path, "--out", str(folder)), _config()).out == \
        folder / "result.json"
    new = tmp_path / "new"
    assert compare_checks.check_compare(compare_args(tmp_path, "--out", f"{new}/"), _config()).out == \
        new / "result.json"
    assert not new.exists()  # checked, not created
    file = tmp_path / "deep" / "run1.json"
    assert compare_checks.check_compare(compare_args(tmp_path, "--out", str(file)), _config()).out == file


def test_quick_values_are_the_ones_checked(tmp_path):
    ctx = compare_context(tmp_path, "--quick", "--concurrency", "1,4,16")
    assert ctx.inputs.concurrency == [1, 4] and ctx.args.repeats == 1


def _config():
    from anycore.config import EngineConfig

    return EngineConfig(threads=2)


def test_late_failure_keeps_the_finished_cells(tmp_path, monkeypatch):
    """--out as a folder; the serve phase fails after offline cells were measured: the file holds
    them, marked partial, with the error, and the error still ends the command."""
    folder = tmp_path / "results"
    folder.mkdir()
    ctx = compare_context(tmp_path, "--out", str(folder))
    monkeypatch.setattr(compare_run, "measure_limits", lambda c: {})

    def phases(c, limits):
        c.results.add("decode b=1 (128 tok)", "anycore bf16", "tok/s", True, [10.0], [{"other_cores": 0.0}])
        c.results.checkpoint()
        raise RuntimeError("server died")

    monkeypatch.setattr(compare_run, "run_phases", phases)
    with pytest.raises(RuntimeError, match="server died"):
        compare_run.execute(ctx)
    saved = json.loads((folder / "result.json").read_text())
    assert saved["partial"] is True and saved["error"] == "RuntimeError: server died"
    assert [m["engine"] for m in saved["measurements"]] == ["anycore bf16"]


def test_finished_run_writes_into_an_out_folder(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "results"
    folder.mkdir()
    monkeypatch.setattr(compare_run, "measure_limits", lambda c: {})
    monkeypatch.setattr(compare_run, "run_phases", lambda c, limits: c.results.skip("everything", "test"))
    assert cli.main(_compare(tmp_path, "--out", str(folder))) == 0
    saved = json.loads((folder / "result.json").read_text())
    assert saved["partial"] is False and saved["skipped"] == {"everything": "test"}
    assert f"JSON: {folder / 'result.json'}" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["latency", "throughput"])
def test_offline_rejects_bad_flags_before_work(tmp_path, capsys, no_work, a_file, kind):
    _fails(capsys, ["bench", kind, "--input-len", "0"], "--input-len")
    _fails(capsys, ["bench", kind, "--repeats", "0"], "--repeats")
    _fails(capsys, ["bench", kind, "--model", str(tmp_path / "missing")], "--model")
    _fails(capsys, ["bench", kind, "--json", str(a_file / "r.json")], "--json")


def test_offline_json_folder_gets_the_default_name(tmp_path):
    from argparse import Namespace

    from anycore.bench.checks import check_offline

    args = Namespace(model=None, threads=None, input_len=8, output_len=8, num_prompts=1, repeats=1, json=str(tmp_path))
    assert check_offline("latency", args) == tmp_path / "latency.json"


@pytest.mark.parametrize("argv, flag", [
    (["--base-url", "127.0.0.1:8000"], "--base-url"),
    (["--concurrency", "0"], "--concurrency"),
    (["--num-prompts", "0"], "--num-prompts"),
    (["--request-rate", "0"], "--request-rate"),
    (["--range-ratio", "1"], "--range-ratio"),
    (["--token-id-range", "10:5"], "--token-id-range"),
    (["--token-id-range", "10"], "--token-id-range"),
    (["--timeout", "0"], "--timeout"),
    (["--dataset-path", "/no/such/prompts.jsonl"], "--dataset-path"),
])
def test_serving_rejects_bad_flags_before_work(capsys, no_work, argv, flag):
    _fails(capsys, ["bench", "serving", *argv], flag)


def test_serving_module_entry_checks_too(capsys, no_work):
    with pytest.raises(SystemExit) as e:
        serving.main(["--concurrency", "0"])
    assert e.value.code == 2 and "--concurrency" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["--top-k", "9", "--experts", "8"], "--top-k"),
    (["--experts", "0"], "--experts"),
    (["--hidden", "100"], "--hidden"),
    (["--decode-tokens", "0"], "--decode-tokens"),
    (["--threads", "0"], "--threads"),
])
def test_bench_moe_flags_are_checked_first(capsys, monkeypatch, tmp_path, no_work, argv, flag):
    from anycore.bench import moe

    monkeypatch.setattr(moe, "write_random_moe", _tripwire)
    _fails(capsys, ["bench", "moe", "--cache-dir", str(tmp_path / "c"), *argv], flag)
