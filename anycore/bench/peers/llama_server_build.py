"""llama.cpp's ``llama-server`` for `anycore bench compare`, built on demand from llama-cpp-python's
source distribution (it vendors llama.cpp) into a cache folder, once per version and set of extra
CMake arguments; nothing built here is ever committed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from anycore.bench.peers.base import PeerUnavailable

LLAMA_SERVER_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
)


def _llama_cpp_python_version() -> str | None:
    try:
        import importlib.metadata

        return importlib.metadata.version("llama-cpp-python")
    except Exception:  # noqa: BLE001
        return None


def _build_name(extra_args: str) -> str:
    """Build folder per set of extra CMake arguments, so a changed flag never reuses a stale build."""
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
