"""`anycore serve --tensor-parallel-size 2`: a worker rank killed under a running server turns
/health into 503 naming the rank, requests get 503, and the server still shuts down."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.models.test_tensor_parallel import write_checkpoint


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _wait_health(url: str, proc: subprocess.Popen, want: int, limit_s: float) -> httpx.Response:
    deadline = time.monotonic() + limit_s  # (a bound against hanging, not a timing assertion)
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"server exited with {proc.returncode}"
        try:
            r = httpx.get(f"{url}/health", timeout=5)
            if r.status_code == want:
                return r
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"/health never answered {want}")


def test_killed_rank_turns_health_503(tmp_path):
    model = tmp_path / "ck"
    write_checkpoint(model, "llama-untied")
    port = _free_port()
    log_path = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "anycore", "serve", "--model", str(model), "--port", str(port), "--dtype", "float32",
           "--kv-cache-gb", "0.01", "--tensor-parallel-size", "2", "--dist-timeout", "20", "--no-self-check",
           "--shutdown-timeout", "3", "--dist-all-reduce", "shm"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[2])
    url = f"http://127.0.0.1:{port}"
    body = {"model": "ck", "prompt": [5, 17, 33], "max_tokens": 4, "temperature": 0}
    try:
        _wait_health(url, proc, 200, 300)
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
        tp = httpx.get(f"{url}/v1/engine", timeout=10).json()["tensor_parallel"]
        assert tp["size"] == 2 and len(tp["ranks"]) == 2 and tp["failure"] is None
        assert tp["all_reduce"].startswith("shm")  # (one host; the flag insists on it)
        workers = _children(proc.pid)
        assert len(workers) == 1
        os.kill(workers[0], signal.SIGKILL)
        r = _wait_health(url, proc, 503, 60)
        assert "rank 1" in r.text
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 503
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log_text = log_path.read_text()
        assert "tensor-parallel rank 1" in log_text and "the engine cannot serve" in log_text
        assert "tensor parallel all-reduce: shm" in log_text
    finally:
        if proc.poll() is None:
            proc.kill()
