"""`anycore serve --data-parallel-size 2`: two replicas behind vllm-router, all on loopback.

Through the router with the openai client: chat and completions, streamed and not, and the native
/generate, equal to what a replica answers directly (greedy); a shared-prefix workload stays on one
replica (cache-aware routing, seen in each replica's /metrics); a replica killed with SIGKILL is
routed around; SIGTERM stops the launcher and every process it started. The tests run in file order
on one launcher; whatever happens, the launcher's whole process group is killed at the end.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("vllm_router")
psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.slow

MODEL = "smollm2"
LOAD_TIMEOUT_S = float(os.environ.get("ANYCORE_E2E_LOAD_TIMEOUT", "600"))
REPLICA_LINE = re.compile(r"started replica (\d+): pid (\d+) at (http://127\.0\.0\.1:\d+)")


class Launcher:
    def __init__(self, proc: subprocess.Popen, url: str, log_path: Path) -> None:
        self.proc, self.url, self.log_path = proc, url, log_path
        self.replicas: dict[int, tuple[int, str]] = {}  # index -> (pid, url)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, url: str | None = None, retries: int = 0):
        return openai.OpenAI(base_url=f"{url or self.url}/v1", api_key="none", max_retries=retries, timeout=120)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _replica_counts(url: str) -> tuple[float, float]:
    """(requests received, cached prompt tokens) of one replica."""
    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(("anycore_requests_received_total ", "anycore_cached_prompt_tokens_total ")):
            name, value = line.split(" ")
            values[name] = float(value)
    return values["anycore_requests_received_total"], values["anycore_cached_prompt_tokens_total"]


@pytest.fixture(scope="module")
def dp(tmp_path_factory: pytest.TempPathFactory):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two replicas need two CPUs")
    port = _free_port()
    log_path = tmp_path_factory.mktemp("dp") / "launcher.log"
    cmd = [sys.executable, "-m", "anycore", "serve", "--data-parallel-size", "2", "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", MODEL, "--kv-cache-gb", "0.05", "--max-model-len", "1024",
           "--no-self-check", "--shutdown-timeout", "2"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[2],
                                start_new_session=True)
    launcher = Launcher(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while "serving at" not in launcher.log():
            assert proc.poll() is None, f"launcher exited with {proc.returncode}\n{launcher.log()[-4000:]}"
            assert time.monotonic() < deadline, f"not serving after {LOAD_TIMEOUT_S:.0f}s\n{launcher.log()[-4000:]}"
            time.sleep(0.5)
        for m in REPLICA_LINE.finditer(launcher.log()):
            launcher.replicas[int(m[1])] = (int(m[2]), m[3])
        assert sorted(launcher.replicas) == [0, 1]
        yield launcher
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the safety net: a failed test leaves nothing behind
            proc.wait()


def test_openai_and_native_requests_through_the_router_match_a_replica(dp: Launcher):
    router, direct = dp.client(), dp.client(dp.replicas[0][1])
    assert [m.id for m in router.models.list().data] == [MODEL]
    msgs = [{"role": "user", "content": "Name three colors."}]
    kw = {"model": MODEL, "max_tokens": 12, "temperature": 0}

    # Every replica sees each prompt once first, so the answers compared below are all prefix-cache
    # hits: a cold prefill and a hit compute the last prompt token in differently shaped steps,
    # whose rounding may flip a near tie (this prompt's first token on a Xeon with AMX: logprobs
    # -2.217 vs -2.224), and the router may send a request to either replica.
    for _, url in dp.replicas.values():
        dp.client(url).chat.completions.create(messages=msgs, **kw)
        dp.client(url).completions.create(prompt="The capital of France is", **kw)
    chat = router.chat.completions.create(messages=msgs, **kw)
    assert chat.choices[0].message.content == direct.chat.completions.create(messages=msgs, **kw
                                                                             ).choices[0].message.content
    streamed = router.chat.completions.create(messages=msgs, stream=True, **kw)
    pieces = [c.choices[0].delta.content or "" for c in streamed if c.choices]
    assert len(pieces) > 2 and "".join(pieces) == chat.choices[0].message.content

    text = router.completions.create(prompt="The capital of France is", **kw).choices[0].text
    assert text == direct.completions.create(prompt="The capital of France is", **kw).choices[0].text
    streamed = router.completions.create(prompt="The capital of France is", stream=True, **kw)
    assert "".join(c.choices[0].text for c in streamed) == text

    body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
    gen = httpx.post(f"{dp.url}/generate", json=body, timeout=120).json()
    assert gen["text"] == text and gen["meta_info"]["completion_tokens"] == 12


def test_the_router_streams_chunks_as_they_are_made(dp: Launcher):
    """The first chunk reaches the client while the replica is still generating (a buffering
    proxy would hold everything until the end)."""
    stream = dp.client().completions.create(model=MODEL, prompt="Count to one hundred:", max_tokens=150,
                                            temperature=0, stream=True, extra_body={"ignore_eos": True})
    running = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text and not running:
            running = [_running(url) for _, url in dp.replicas.values()]
    assert sum(running) == 1, running


def _running(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("anycore_num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no anycore_num_requests_running")


def test_render_gives_the_engine_token_ids_and_the_router_finds_every_endpoint(dp: Launcher):
    url = dp.replicas[0][1]
    msgs = [{"role": "user", "content": "Hello there"}]
    chat = httpx.post(f"{url}/v1/chat/completions/render", json={"model": MODEL, "messages": msgs}, timeout=30)
    tok = httpx.post(f"{url}/tokenize", json={"model": MODEL, "messages": msgs}, timeout=30).json()["tokens"]
    assert chat.status_code == 200 and chat.json()["token_ids"] == tok
    rendered = httpx.post(f"{url}/v1/completions/render", json={"model": MODEL, "prompt": ["Hello there", "Bye"]},
                          timeout=30).json()
    toks = [httpx.post(f"{url}/tokenize", json={"model": MODEL, "prompt": p}, timeout=30).json()["tokens"]
            for p in ("Hello there", "Bye")]
    assert [r["token_ids"] for r in rendered] == toks, rendered
    rendered = httpx.post(f"{url}/v1/completions/render", json={"model": MODEL, "prompt": [1, 2, 3]}, timeout=30)
    assert rendered.json() == [{"token_ids": [1, 2, 3], "model": MODEL}]
    for bad in ([], [10**9]):
        r = httpx.post(f"{url}/v1/completions/render", json={"model": MODEL, "prompt": bad}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    # the earlier test's requests went through the router: nothing it asked a replica for was missing
    for _, replica in dp.replicas.values():
        metrics = httpx.get(f"{replica}/metrics", timeout=10).text
        assert 'requests_rejected_total{status="404"}' not in metrics, metrics


def test_shared_prefix_requests_stay_on_one_replica(dp: Launcher):
    """Cache-aware routing: every request of a group lands where its shared prefix is cached (a
    round-robin router would split each group across both replicas)."""
    client = dp.client()
    urls = [dp.replicas[k][1] for k in (0, 1)]
    for group in range(3):
        prefix = f"Document {group}: " + " ".join(f"item{group}-{i}" for i in range(120))
        before = [_replica_counts(u) for u in urls]
        cached = []
        for q in range(3):
            r = client.completions.create(model=MODEL, prompt=f"{prefix}\nQuestion {q}:", max_tokens=1, temperature=0)
            cached.append(r.usage.prompt_tokens_details.cached_tokens if r.usage.prompt_tokens_details else 0)
        after = [_replica_counts(u) for u in urls]
        received = [a[0] - b[0] for a, b in zip(after, before)]
        assert sorted(received) == [0, 3], f"group {group} was split across replicas: {received}"
        assert min(cached[1:]) > 200, f"group {group}: later requests missed the cached prefix: {cached}"


def test_a_killed_replica_is_routed_around(dp: Launcher):
    pid, url = dp.replicas[1]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while "replica 1 (pid" not in dp.log() or "EXITED" not in dp.log():
        assert time.monotonic() < deadline, dp.log()[-3000:]
        time.sleep(0.2)
    assert "removed from the router" in dp.log()
    workers = httpx.get(f"{dp.url}/list_workers", timeout=10).json()["urls"]
    assert workers == [dp.replicas[0][1]]
    client = dp.client()  # no client retries: every request must succeed on its own
    for i in range(3):
        msgs = [{"role": "user", "content": f"Say {i}."}]
        assert client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4).choices[0].message.content
        s = client.completions.create(model=MODEL, prompt=f"Count {i}", max_tokens=4, stream=True)
        assert "".join(c.choices[0].text for c in s)
    assert dp.proc.poll() is None


def test_sigterm_stops_the_router_and_every_replica(dp: Launcher):
    children = psutil.Process(dp.proc.pid).children(recursive=True)
    assert len(children) >= 2  # the live replica and the router
    dp.proc.send_signal(signal.SIGTERM)
    assert dp.proc.wait(timeout=60) == 0, dp.log()[-3000:]
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left running: {[p.pid for p in alive]}"
