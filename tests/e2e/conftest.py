"""One real `anycore serve` subprocess per test session, driven through real HTTP clients.

The server runs the default model in float32 (so greedy output can be compared with the
offline LLM) with an API key and a small queue limit, both of which the tests exercise.
Teardown checks graceful shutdown: SIGTERM with a stream in flight must end the stream and
exit 0 within the shutdown timeout.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

API_KEY = "e2e-secret"
MODEL = "smollm2"
MAX_QUEUED = 24
LOAD_TIMEOUT_S = float(os.environ.get("ANYCORE_E2E_LOAD_TIMEOUT", "600"))


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log_path: Path
    health_statuses: list[int] = field(default_factory=list)
    model: str = MODEL
    api_key: str = API_KEY
    max_queued: int = MAX_QUEUED

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"}

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shutdown_with_stream_in_flight(server: Server) -> None:
    """SIGTERM while a long stream runs: the stream must end and the process exit 0."""
    first_chunk = threading.Event()
    ended = threading.Event()

    def stream() -> None:
        try:
            body = {"model": MODEL, "prompt": "Count to one hundred:", "max_tokens": 400, "stream": True,
                    "ignore_eos": True}
            with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=server.headers,
                              timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        first_chunk.set()
        except httpx.HTTPError:
            pass
        finally:
            first_chunk.set()
            ended.set()

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    first_chunk.wait(120)
    server.proc.send_signal(signal.SIGTERM)
    try:
        rc = server.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        raise AssertionError("server did not exit within 60 s of SIGTERM\n" + server.log_tail()) from None
    assert ended.wait(30), "the in-flight stream did not end after shutdown"
    assert rc == 0, f"server exited with {rc}\n{server.log_tail()}"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory):
    port = _free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    cmd = [sys.executable, "-m", "anycore", "serve", "--port", str(port), "--dtype", "float32",
           "--api-key", API_KEY, "--served-model-name", MODEL, "--max-queued-requests", str(MAX_QUEUED),
           "--shutdown-timeout", "3"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[2])
    srv = Server(f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}\n{srv.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after {LOAD_TIMEOUT_S:.0f}s\n{srv.log_tail()}")
            try:
                status = httpx.get(f"{srv.url}/health", timeout=5).status_code
            except httpx.HTTPError:
                status = None
            if status is not None:
                srv.health_statuses.append(status)
            if status == 200:
                break
            time.sleep(0.5)
        yield srv
    finally:
        if proc.poll() is None:
            try:
                _shutdown_with_stream_in_flight(srv)
            finally:
                if proc.poll() is None:
                    proc.kill()


@pytest.fixture(scope="session")
def client(server: Server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture
def aclient(server: Server):
    """A new async client per test: each test runs its own event loop (asyncio.run), and a
    pooled connection from an earlier test's closed loop cannot be reused."""
    openai = pytest.importorskip("openai")
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)
