"""What the hardening scripts share: start a loopback `anycore serve`, read /metrics, sample RSS,
and one well-behaved greedy client whose output must never change.

Used by scripts/fuzz_server.py, disconnect_storm.py, kv_exhaustion.py, soak.py and by
tests/e2e/test_hardening*.py (which import these modules from the repository root).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
OPENAI_ERROR_KEYS = {"message", "type", "param", "code"}


@dataclass
class LiveServer:
    url: str
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    headers: dict[str, str] = field(default_factory=dict)
    model: str | None = None

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def metrics(self) -> dict[str, float]:
        return parse_metrics(httpx.get(f"{self.url}/metrics", timeout=30).text)


def parse_metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(extra_args: list[str], log_path: Path, load_timeout_s: float = 600.0) -> Iterator[LiveServer]:
    """Runs `python -m anycore serve` on a free 127.0.0.1 port until the block ends (then SIGTERM, kill)."""
    port = free_port()
    cmd = [sys.executable, "-m", "anycore", "serve", "--host", "127.0.0.1", "--port", str(port), *extra_args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    srv = LiveServer(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        deadline = time.monotonic() + load_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}\n{srv.log_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after {load_timeout_s:.0f}s")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{srv.url}/health", timeout=5).status_code == 200:
                    break
            time.sleep(0.5)
        yield srv
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def is_openai_error(body: object) -> bool:
    """``{"error": {"message": str, "type": str, "param", "code"}}`` and nothing else at the top."""
    if not isinstance(body, dict) or "error" not in body:
        return False
    err = body["error"]
    return (isinstance(err, dict) and OPENAI_ERROR_KEYS <= set(err) and isinstance(err["message"], str)
            and isinstance(err["type"], str))


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (from /proc, so no psutil needed on Linux)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def slope_per_minute(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) samples, per minute."""
    n = len(samples)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    return 60.0 * sum((t - mt) * (v - mv) for t, v in samples) / var


# ---- the well-behaved client -----------------------------------------------------------------
PROBE_BODY = {"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0.0}


def probe_once(srv: LiveServer, client: httpx.Client | None = None) -> str:
    """One greedy completion of a fixed prompt; its text is the reference the server must keep giving."""
    body = dict(PROBE_BODY, **({"model": srv.model} if srv.model else {}))
    c = client or httpx
    r = c.post(f"{srv.url}/v1/completions", json=body, headers=srv.headers, timeout=300)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


class Prober:
    """Repeats ``probe_once`` on a thread until stopped; counts answers that differ from ``reference``."""

    def __init__(self, srv: LiveServer, reference: str, max_seconds: float = 3600.0) -> None:
        self.srv, self.reference, self.max_seconds = srv, reference, max_seconds
        self.done = 0
        self.mismatches: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        with httpx.Client() as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    text = probe_once(self.srv, client)
                except httpx.HTTPError as e:
                    self.errors.append(f"{type(e).__name__}: {e}")
                    continue
                self.done += 1
                if text != self.reference:
                    self.mismatches.append(text)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=360)


def default_server_args() -> list[str]:
    """float32 so greedy output is stable across batch compositions; extra flags from $ANYCORE_SERVE_ARGS."""
    return ["--dtype", "float32", *os.environ.get("ANYCORE_SERVE_ARGS", "").split()]
