"""Server processes under test in `anycore bench compare`: anycore's own and llama.cpp's
``llama-server`` (its binary from ``llama_server_build``), each on a free 127.0.0.1 port, with
its log in a file and its CPU time readable (an idle server must stay idle).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from anycore.bench.peers.base import PeerUnavailable

# llama-server's continuous batching: 16 parallel slots sharing one 16384-token context
LLAMA_SERVER_SLOTS, LLAMA_SERVER_CTX = 16, 16384
LLAMA_SERVER_SLOT_CTX = LLAMA_SERVER_CTX // LLAMA_SERVER_SLOTS  # the longest request it serves


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process under test; ``url`` once ``start`` returns."""

    def __init__(self, name: str, cmd: list[str], port: int, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.cmd, self.port, self.log_path = name, cmd, port, log_path
        self.env = env
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.ps: psutil.Process | None = None

    def start(self, timeout: float = 600.0) -> None:
        import httpx

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        self.ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()  # closes the log; the caller never stops a server that failed to start
                raise PeerUnavailable(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200 and \
                        httpx.get(f"{self.url}/v1/models", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise PeerUnavailable(f"{self.name} not ready after {timeout:.0f}s; see {self.log_path}")

    def cpu_seconds(self) -> float:
        """CPU time of the server and its children (to check an idle server stays idle)."""
        if self.ps is None:
            return 0.0
        total = 0.0
        try:
            for p in [self.ps, *self.ps.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            pass
        return total

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()


def anycore_server(name: str, model: str, threads: int, quantization: str | None, log_dir: Path) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "anycore", "serve", "--model", model, "--port", str(port), "--threads", str(threads)]
    if quantization:
        cmd += ["--quantization", quantization]
    return Server(name, cmd, port, log_dir / f"{name.replace(' ', '_')}.log")


def llama_server(name: str, exe: Path, gguf: Path, threads: int, log_dir: Path) -> Server:
    port = free_port()
    cmd = [str(exe), "-m", str(gguf), "-t", str(threads), "-tb", str(threads),
           "-np", str(LLAMA_SERVER_SLOTS), "-c", str(LLAMA_SERVER_CTX),
           "--host", "127.0.0.1", "--port", str(port)]
    return Server(name, cmd, port, log_dir / f"{name.replace(' ', '_')}.log")
