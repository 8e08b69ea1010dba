"""Servers for `anycore bench compare`: anycore's own and llama.cpp's ``llama-server``.

``llama-server`` is built on demand from llama-cpp-python's source distribution (it vendors
llama.cpp) into a cache folder, once per version; nothing built here is ever committed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import psutil

from anycore.bench.peers_offline import PeerUnavailable

LLAMA_SERVER_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _llama_cpp_python_version() -> str | None:
    try:
        import importlib.metadata

        return importlib.metadata.version("llama-cpp-python")
    except Exception:  # noqa: BLE001
        return None


def _build_name(extra_args: str) -> str:
    """Build folder per set of extra CMake arguments, so a changed flag never reuses a stale build."""
    import hashlib

    return "build" if not extra_args else "build-" + hashlib.sha1(extra_args.encode()).hexdigest()[:8]


def ensure_llama_server(cache_dir: Path, build: bool = True, jobs: int | None = None, log=print,
                        extra_args: str = "") -> Path:
    """Path of a cached ``llama-server`` binary, building it when absent and ``build`` is set.

    ``extra_args``: CMake arguments appended after the defaults (a later -D wins), e.g.
    ``-DGGML_NATIVE=OFF -DGGML_AVX512=ON`` where the native build uses instructions the machine traps.
    """
    version = _llama_cpp_python_version()
    bname = _build_name(extra_args)
    existing = sorted(cache_dir.glob(f"llama.cpp-*/{bname}/bin/llama-server"))
    wanted = cache_dir / f"llama.cpp-{version}/{bname}/bin/llama-server" if version else None
    if wanted is not None and wanted.exists():
        return wanted
    if wanted is None and existing:
        return existing[-1]
    if not build:
        raise PeerUnavailable("llama-server not built (run without --no-build to build it, ~4+ minutes)")
    import fcntl

    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / "llama-server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent runs build once; the second finds the binary
        if wanted is not None and wanted.exists():
            return wanted
        return _build_llama_server(cache_dir, version, jobs, log, extra_args)


def _build_llama_server(cache_dir: Path, version: str | None, jobs: int | None, log, extra_args: str) -> Path:
    if not shutil.which("cmake"):
        raise PeerUnavailable("cmake not found; cannot build llama-server")
    src_dir = cache_dir / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    spec = f"llama-cpp-python=={version}" if version else "llama-cpp-python"
    sdists = sorted(src_dir.glob(f"llama_cpp_python-{version or ''}*.tar.gz"))
    if not sdists:
        log(f"downloading the {spec} source distribution ...")
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", spec,
                            "-d", str(src_dir)], capture_output=True, text=True)
        sdists = sorted(src_dir.glob("llama_cpp_python-*.tar.gz"))
        if r.returncode != 0 or not sdists:
            raise PeerUnavailable(f"pip download of {spec} failed: {r.stderr.strip()[-300:]}")
    sdist = sdists[-1]
    ver = sdist.name[len("llama_cpp_python-"):-len(".tar.gz")]
    root = cache_dir / f"llama.cpp-{ver}"
    if not (root / "CMakeLists.txt").exists():
        with tarfile.open(sdist) as tf:
            prefix = f"llama_cpp_python-{ver}/vendor/llama.cpp/"
            members = [m for m in tf.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            tf.extractall(root, members=[m for m in members if m.name], filter="data")
    build_dir = root / _build_name(extra_args)
    jobs = jobs or os.cpu_count() or 2
    log(f"building llama-server {ver} in {build_dir} with {jobs} jobs (several minutes) ...")
    t0 = time.perf_counter()
    for cmd in (["cmake", "-S", str(root), "-B", str(build_dir), *LLAMA_SERVER_CMAKE_FLAGS, *extra_args.split()],
                ["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise PeerUnavailable(f"llama-server build failed at {' '.join(cmd[:2])}: {r.stderr.strip()[-400:]}")
    exe = build_dir / "bin" / "llama-server"
    if not exe.exists():
        raise PeerUnavailable("llama-server build finished but produced no binary")
    log(f"llama-server built in {time.perf_counter() - t0:.0f}s")
    return exe


def llama_server_version(exe: Path) -> str:
    try:
        r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30)
        lines = (r.stdout + r.stderr).strip().splitlines()
        return next((ln for ln in lines if "version" in ln), lines[0] if lines else "?")
    except (OSError, subprocess.TimeoutExpired):
        return "?"


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
    cmd = [str(exe), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), "-np", "16", "-c", "16384",
           "--host", "127.0.0.1", "--port", str(port)]
    return Server(name, cmd, port, log_dir / f"{name.replace(' ', '_')}.log")
