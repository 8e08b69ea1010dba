"""`anycore bench serving` and the serving / shared-prefix paths of `bench compare`, against a fake
OpenAI-compatible streaming server with known delays and token counts.

Timing assertions are one-sided and loose (the machine is shared and noisy): a latency can never be
shorter than the delay the server injected, and the derived numbers must agree with each other.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from pathlib import Path

import httpx
import pytest

from anycore.bench import report, serve_workloads, serving
from anycore.bench.peers import llama_server_build
from anycore.bench.peers import servers as peers_server
from anycore.bench.peers.base import PeerUnavailable
from tests.unit.fake_openai_server import MODEL, Behaviour, FakeOpenAIServer

FIRST, STEP = 0.05, 0.01  # injected first-token and inter-token delays (s)
SLACK = 0.9  # a sleep may end a hair early relative to the client's clock; never by 10%


def _args(url: str, concurrency: int = 2, num_prompts: int = 6, input_len: int = 12, output_len: int = 5,
          seed: int = 3):
    return serve_workloads.serving_args(url, concurrency, num_prompts, input_len, output_len, seed)


async def _one(url: str, body: dict) -> serving.RequestResult:
    async with httpx.AsyncClient() as client:
        return await serving.stream_completion(client, f"{url}/v1/completions", body, 30)


def _body(n: int, prompt=None, **extra) -> dict:
    return {"model": MODEL, "prompt": prompt if prompt is not None else [1, 2, 3], "max_tokens": n, "stream": True,
            **extra}


# ---- one request ---------------------------------------------------------------------------

def test_one_request_times_every_token():
    with FakeOpenAIServer(Behaviour(first_token_delay=FIRST, token_delay=STEP)) as srv:
        r = asyncio.run(_one(srv.url, _body(6, ignore_eos=True, stream_options={"include_usage": True})))
    assert r.ok and not r.error
    assert r.output_len == 6 and r.prompt_len == 3  # from the usage chunk
    assert len(r.itl) == 5  # one gap per token after the first; the empty closing chunk is no token
    assert r.ttft >= FIRST * SLACK
    assert statistics.median(r.itl) >= STEP * SLACK / 2
    assert r.latency >= r.ttft + sum(r.itl)  # the last token arrives before the stream ends


def test_output_count_without_usage_and_with_a_blank_token():
    """No usage chunk: tokens are counted from chunks, including one that streams as '' (a held-back
    partial character) but not the empty closing chunk that carries finish_reason."""
    b = Behaviour(first_token_delay=0.001, token_delay=0.001, usage=False, blank_token_at=2)
    with FakeOpenAIServer(b) as srv:
        r = asyncio.run(_one(srv.url, _body(5, ignore_eos=True, stream_options={"include_usage": True})))
    assert r.ok and r.output_len == 5 and len(r.itl) == 4
    assert r.prompt_len == 3  # token-id prompt: its length as sent


def test_eos_before_max_tokens_counts_what_was_generated():
    with FakeOpenAIServer(Behaviour(first_token_delay=0.001, token_delay=0.001, eos_after=3, closing_chunk=False)) as srv:
        r = asyncio.run(_one(srv.url, _body(10, prompt="hello there")))
    assert r.ok and r.output_len == 3 and len(r.itl) == 2
    assert r.prompt_len == 0  # a text prompt's length is unknown without usage


def test_http_error_is_a_failed_result():
    with FakeOpenAIServer(Behaviour(fail_every=1)) as srv:
        r = asyncio.run(_one(srv.url, _body(4)))
    assert not r.ok and r.error.startswith("HTTP 500") and "injected failure" in r.error


@pytest.mark.parametrize("style", ["data", "text", "field"])
def test_error_event_mid_stream_is_a_failed_result(style):
    """An error after some tokens fails the request, whichever way the server streams it (the SSE
    `error:` field of older llama-server builds used to be skipped, so a truncated stream counted as ok)."""
    b = Behaviour(first_token_delay=0.001, error_midstream_every=1, error_style=style)
    with FakeOpenAIServer(b) as srv:
        r = asyncio.run(_one(srv.url, _body(4)))
    assert not r.ok and r.error == "injected stream error in request 1"


def test_unreachable_server_is_a_failed_result():
    port = peers_server.free_port()  # nothing listens there
    r = asyncio.run(_one(f"http://127.0.0.1:{port}", _body(4)))
    assert not r.ok and "Connect" in r.error


# ---- a whole serving benchmark -------------------------------------------------------------

def test_benchmark_summary_from_known_delays():
    n, c, out, inp = 6, 2, 5, 12
    with FakeOpenAIServer(Behaviour(first_token_delay=FIRST, token_delay=STEP)) as srv:
        s = asyncio.run(serving.benchmark(_args(srv.url, c, n, inp, out)))
        rec = srv.record
    assert s["model"] == MODEL and s["num_prompts"] == n
    assert s["completed"] == n and s["failed"] == 0 and s["errors"] == []
    assert s["total_output_tokens"] == n * out and s["total_input_tokens"] == n * inp
    # what went over the wire: one warm-up, then n streaming requests of random ids of the asked length
    assert len(rec.requests) == 1 + n
    for body in rec.requests:
        assert body["model"] == MODEL and body["stream"] and body["ignore_eos"] and body["max_tokens"] == out
        assert body["stream_options"] == {"include_usage": True}
        assert len(body["prompt"]) == inp and all(1000 <= t < 10000 for t in body["prompt"])
    assert len({tuple(b["prompt"]) for b in rec.requests[1:]}) == n
    assert rec.max_in_flight == c  # the concurrency bound holds and is reached
    # latencies: never below what the server injected; percentiles ordered; derived numbers agree
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_latency_ms"):
        p = s[key]
        assert 0 < p["p50"] <= p["p90"] <= p["p99"], key
    assert s["ttft_ms"]["p50"] >= FIRST * 1000 * SLACK
    assert s["itl_ms"]["p50"] >= STEP * 1000 * SLACK / 2
    assert s["tpot_ms"]["mean"] >= STEP * 1000 * SLACK / 2
    assert s["e2e_latency_ms"]["mean"] >= s["ttft_ms"]["mean"] + (out - 1) * STEP * 1000 * SLACK / 2
    waves = n / c  # n requests, c at a time, each at least FIRST + (out-1) * STEP
    assert s["duration_s"] >= waves * (FIRST + (out - 1) * STEP) * SLACK
    assert s["output_throughput"] == pytest.approx(n * out / s["duration_s"])
    assert s["request_throughput"] == pytest.approx(n / s["duration_s"])
    assert s["total_token_throughput"] == pytest.approx(n * (inp + out) / s["duration_s"])
    assert "Successful requests" in serving.format_table(s)


def test_same_seed_same_prompts_other_seed_other_prompts():
    def prompts(seed: int) -> list:
        with FakeOpenAIServer(Behaviour(first_token_delay=0.001, token_delay=0.001)) as srv:
            asyncio.run(serving.benchmark(_args(srv.url, 2, 4, 8, 2, seed)))
            # sorted: two requests in flight reach the server in either order
            return sorted(b["prompt"] for b in srv.record.requests[1:])

    assert prompts(1) == prompts(1)
    assert not set(map(tuple, prompts(1))) & set(map(tuple, prompts(2)))


def test_failed_requests_are_counted_not_fatal(tmp_path):
    # request 1 is the warm-up; of the 6 timed ones (2..7), 3 and 6 get HTTP 500
    with FakeOpenAIServer(Behaviour(first_token_delay=0.001, token_delay=0.001, fail_every=3)) as srv:
        args = _args(srv.url, 2, 6, 8, 4)
        args.json_out = str(tmp_path / "s.json")
        s = asyncio.run(serving.benchmark(args))
        assert serving.run_serving(args) == 1  # the CLI exit status says something failed
    assert s["completed"] == 4 and s["failed"] == 2
    assert s["total_output_tokens"] == 4 * 4
    assert len(s["errors"]) == 2 and all(e.startswith("HTTP 500") for e in s["errors"])
    assert (tmp_path / "s.json").exists()


def test_mid_stream_errors_are_counted():
    with FakeOpenAIServer(Behaviour(first_token_delay=0.001, token_delay=0.001, error_midstream_every=2)) as srv:
        s = asyncio.run(serving.benchmark(_args(srv.url, 1, 4, 8, 3)))
    assert s["completed"] == 2 and s["failed"] == 2  # timed requests 2..5: 2 and 4 break off
    assert all("injected stream error" in e for e in s["errors"])


def test_failed_warmup_stops_the_benchmark():
    with FakeOpenAIServer(Behaviour(fail_every=1)) as srv, pytest.raises(RuntimeError, match="warm-up"):
        asyncio.run(serving.benchmark(_args(srv.url)))


def test_request_rate_still_sends_everything():
    with FakeOpenAIServer(Behaviour(first_token_delay=0.001, token_delay=0.001)) as srv:
        args = _args(srv.url, 4, 5, 8, 2)
        args.request_rate = 200.0
        s = asyncio.run(serving.benchmark(args))
    assert s["completed"] == 5 and s["request_rate"] == 200.0


def test_base_url_with_v1_and_explicit_model():
    with FakeOpenAIServer(Behaviour(first_token_delay=0.001, token_delay=0.001)) as srv:
        args = _args(srv.url + "/v1/", 1, 2, 4, 2)
        args.model_name = "other-name"
        s = asyncio.run(serving.benchmark(args))
        assert all(b["model"] == "other-name" for b in srv.record.requests)
    assert s["completed"] == 2 and s["model"] == "other-name"


def test_words_and_dataset_prompts(tmp_path):
    import random

    args = _args("http://unused", output_len=7)
    args.prompt_kind, args.input_len = "words", 5
    words = serving.build_prompts(args, 3, random.Random(0))
    assert all(isinstance(p, str) and len(p.split()) == 5 and m == 7 for p, m in words)
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "first"}\n\nsecond line\n{"text": "third"}\n', encoding="utf-8")
    args.dataset_path = str(f)
    assert [p for p, _ in serving.build_prompts(args, 4, random.Random(0))] == ["first", "second line", "third", "first"]


# ---- bench compare's serving workloads -----------------------------------------------------

def test_load_level_returns_the_summary_and_raises_on_failures():
    with FakeOpenAIServer(Behaviour(first_token_delay=0.001, token_delay=0.001)) as srv:
        s = serve_workloads.load_level(srv.url, 2, 4, 10, 3, seed=7)
    assert s["completed"] == 4 and s["total_output_tokens"] == 12
    with FakeOpenAIServer(Behaviour(first_token_delay=0.001, token_delay=0.001, fail_every=4)) as srv, \
            pytest.raises(RuntimeError, match="1 of 4 requests failed"):
        serve_workloads.load_level(srv.url, 2, 4, 10, 3, seed=7)


def _fake_prefix_cache(per_token: float):
    """First-token delay proportional to the prompt tokens not shared with an earlier prompt."""

    def delay(prompt: list[int], earlier: list[list[int]]) -> float:
        hit = 0
        for e in earlier:
            k = 0
            while k < min(len(e), len(prompt)) and e[k] == prompt[k]:
                k += 1
            hit = max(hit, k)
        return 0.002 + per_token * (len(prompt) - hit)

    return delay


def test_shared_prefix_sends_the_prompts_it_claims():
    prefix_len, suffix_len, num, conc, max_tokens = 992, 20, 16, 4, 8
    b = Behaviour(first_token_delay_fn=_fake_prefix_cache(0.0005), token_delay=0.001)
    with FakeOpenAIServer(b) as srv:
        r = serve_workloads.shared_prefix(srv.url, seed=500)
        reqs = srv.record.requests
        assert srv.record.max_in_flight <= conc
    prompts = [q["prompt"] for q in reqs]
    assert len(prompts) == 1 + 1 + num + 1  # cold, the prefix primed alone, the shared wave, one more alone
    assert all(len(p) == prefix_len + suffix_len for p in prompts)
    assert all(q["max_tokens"] == max_tokens and q["stream"] and q["ignore_eos"] for q in reqs)
    cold, prime, shared, alone = prompts[0], prompts[1], prompts[2:-1], prompts[-1]
    prefix = prime[:prefix_len]
    assert all(p[:prefix_len] == prefix for p in shared + [alone])  # one identical prefix
    suffixes = {tuple(p[prefix_len:]) for p in [prime] + shared + [alone]}
    assert len(suffixes) == num + 2  # every suffix different
    assert cold[:prefix_len] != prefix  # the cold prompt shares nothing with it
    # results: one TTFT per shared request, each at least the injected delay; the cached ones are fast
    assert len(r["shared_ttft_s"]) == num
    assert r["shared_ttft_p50_s"] == pytest.approx(statistics.median(r["shared_ttft_s"]))
    assert r["shared_first_wave_ttft_s"] == pytest.approx(statistics.fmean(r["shared_ttft_s"][:conc]))
    cold_delay = 0.002 + 0.0005 * (prefix_len + suffix_len)
    assert r["cold_ttft_s"] >= cold_delay * SLACK and r["prime_ttft_s"] >= cold_delay * SLACK  # (nothing cached yet)
    assert min(r["shared_ttft_s"]) >= 0.002 * SLACK and r["alone_ttft_s"] >= 0.002 * SLACK
    # the prefix was cached before the wave: even its first requests pay only their suffix
    assert max(r["shared_ttft_s"]) < cold_delay * SLACK
    assert r["alone_ttft_s"] < r["cold_ttft_s"]  # 20 uncached tokens vs 1,012 (12 ms vs 508 ms injected)


def test_shared_prefix_differs_between_seeds():
    def first_prefix(seed: int) -> list[int]:
        with FakeOpenAIServer(Behaviour(first_token_delay=0.001, token_delay=0.001)) as srv:
            serve_workloads.shared_prefix(srv.url, seed=seed, prefix_len=64, suffix_len=4, num=4, concurrency=2,
                                          max_tokens=2)
            return srv.record.requests[2]["prompt"][:64]

    assert first_prefix(500) == first_prefix(500)
    assert first_prefix(500) != first_prefix(501)  # repeats never hit an earlier repeat's cache


def test_shared_prefix_failure_raises():
    with FakeOpenAIServer(Behaviour(first_token_delay=0.001, fail_every=3)) as srv, \
            pytest.raises(RuntimeError, match="request failed"):
        serve_workloads.shared_prefix(srv.url, seed=1, prefix_len=16, suffix_len=2, num=4, concurrency=2,
                                      max_tokens=2)


# ---- server processes (peers_server.Server) and compare's serve phase ----------------------

FAKE_SCRIPT = Path(__file__).with_name("fake_openai_server.py")


def _fake_process(name: str, log_dir: Path) -> peers_server.Server:
    port = peers_server.free_port()
    cmd = [sys.executable, str(FAKE_SCRIPT), "--port", str(port), "--first-token-delay", "0.002",
           "--token-delay", "0.001"]
    return peers_server.Server(name, cmd, port, log_dir / f"{name}.log")


def test_server_process_lifecycle(tmp_path):
    s = _fake_process("fake", tmp_path)
    s.start(timeout=60)
    try:
        assert s.proc is not None and s.proc.poll() is None
        out = serve_workloads.load_level(s.url, 1, 2, 8, 3, seed=0)
        assert out["completed"] == 2
        assert s.cpu_seconds() > 0
    finally:
        s.stop()
    assert s.proc.poll() is not None


def test_server_that_exits_or_never_answers_is_unavailable(tmp_path):
    dead = peers_server.Server("dead", [sys.executable, "-c", "raise SystemExit(3)"], peers_server.free_port(),
                               tmp_path / "dead.log")
    with pytest.raises(PeerUnavailable, match="exited with 3"):
        dead.start(timeout=60)
    assert dead._log.closed  # compare never stops a server that failed to start
    mute = peers_server.Server("mute", [sys.executable, "-c", "import time; time.sleep(60)"],
                               peers_server.free_port(), tmp_path / "mute.log")
    with pytest.raises(PeerUnavailable, match="not ready"):
        mute.start(timeout=1.0)
    assert mute.proc.poll() is not None and mute._log.closed  # stopped, not left behind


def test_server_commands_and_cached_llama_server(tmp_path, monkeypatch):
    a = peers_server.anycore_server("anycore-server w8a8", "m.gguf", 3, "w8a8_int8", tmp_path)
    assert a.cmd[-6:] == ["--port", str(a.port), "--threads", "3", "--quantization", "w8a8_int8"]
    assert a.url == f"http://127.0.0.1:{a.port}" and a.log_path.name == "anycore-server_w8a8.log"
    ls = peers_server.llama_server("llama-server Q8_0", Path("/x/llama-server"), Path("m.gguf"), 2, tmp_path)
    assert ls.cmd[ls.cmd.index("-t") + 1] == "2" and ls.cmd[ls.cmd.index("--port") + 1] == str(ls.port)
    monkeypatch.setattr(llama_server_build, "_llama_cpp_python_version", lambda: "9.9")
    exe = tmp_path / "llama.cpp-9.9/build/bin/llama-server"
    exe.parent.mkdir(parents=True)
    exe.write_text("")
    assert llama_server_build.ensure_llama_server(tmp_path, build=False) == exe
    with pytest.raises(PeerUnavailable, match="not built"):
        llama_server_build.ensure_llama_server(tmp_path, build=False, extra_args="-DGGML_NATIVE=OFF")


def test_compare_serve_phase_records_cells(tmp_path, monkeypatch):
    from anycore.bench.compare import serve_phase
    from tests.unit.bench_helpers import compare_context

    started: list[peers_server.Server] = []

    def fake_anycore_server(name, model, threads, quantization, log_dir):
        s = _fake_process(name.replace(" ", "_"), log_dir)
        s.name = name
        started.append(s)
        return s

    monkeypatch.setattr(peers_server, "anycore_server", fake_anycore_server)
    c = compare_context(tmp_path, "--workloads", "serve,prefix", "--peers", "none", "--repeats", "2",
                        "--concurrency", "1,2", "--prompts-per-slot", "2", "--serve-input-len", "8",
                        "--serve-output-len", "3", "--prefix-len", "32")
    written = []
    monkeypatch.setattr(c.results, "checkpoint", lambda error=None: written.append(len(c.results.measurements)))
    serve_phase.run_serving(c, tmp_path / "m.gguf")
    assert written == [3, 6, 9]  # the JSON rewritten after each level and after prefix
    measurements = c.results.measurements
    assert not c.results.skipped, c.results.skipped
    assert [s.name for s in started] == ["anycore-server bf16"]
    assert all(s.proc.poll() is not None for s in started)  # stopped after the phase
    cells = {m["workload"]: m for m in measurements}
    assert list(cells) == ["serve c=1 output", "serve c=1 TTFT p50", "serve c=1 ITL p50",
                           "serve c=2 output", "serve c=2 TTFT p50", "serve c=2 ITL p50",
                           "prefix cold TTFT", "prefix shared c=4 TTFT p50", "prefix cached alone TTFT"]
    for m in measurements:
        assert m["engine"] == "anycore-server bf16" and len(m["values"]) == 2 and len(m["loads"]) == 2
        assert all(v > 0 for v in m["values"])
        assert m["higher_is_better"] == m["workload"].endswith("output")
    assert cells["serve c=2 output"]["requests"] == 4
    assert cells["serve c=1 TTFT p50"]["median"] >= 2.0 * SLACK  # ms, the injected 2 ms
    report.add_ratios(measurements)
    table = report.format_table({"meta": {"cpu_model": "t", "threads": 2}, "hardware": {}, "engines": {},
                                 "skipped": {}, "measurements": measurements})
    assert "prefix shared c=4 TTFT p50" in table and "serve c=2 ITL p50" in table


@pytest.mark.parametrize("requests", [1, 3])
def test_request_rate_waits_only_between_arrivals(monkeypatch, requests):
    """A Poisson gap precedes every arrival but the first, none follows the last (one request at
    0.01 req/s would otherwise idle ~111 s into the duration)."""
    gaps: list[float] = []

    def recording(self, rate):
        gaps.append(rate)
        return 0.0  # no real waiting

    monkeypatch.setattr(serving.random.Random, "expovariate", recording)
    with FakeOpenAIServer(Behaviour(first_token_delay=0.001, token_delay=0.001)) as srv:
        args = _args(srv.url, 1, requests, 8, 2)
        args.request_rate = 0.01
        s = asyncio.run(serving.benchmark(args))
    assert s["completed"] == requests and gaps == [0.01] * (requests - 1)
