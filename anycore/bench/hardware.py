"""Physical limits for `anycore bench compare`: memory read bandwidth and peak GEMM throughput.

Batch-1 decode streams every weight once per token, so its ceiling is bandwidth / weight bytes;
prefill is matrix-multiply bound, so its ceiling is the best GEMM rate of the same dtype.

Bandwidth: the best read rate that a small C program (``stream_read.c``, compiled on the fly on
this machine, with ``-march=native`` and OpenMP when the compiler takes them) achieves over a
512 MiB buffer, larger than usual last-level caches: each thread first touches, then sums its own contiguous chunk with
eight independent accumulators of the widest vector the target has (GCC/Clang vector extensions:
AVX-512, AVX, SSE2 or Neon), with and without software prefetch 1-16 KiB ahead. The variants are
interleaved over the passes and the fastest pass of any variant counts: a kernel streaming weights
can approach this rate, not beat it, unless its weights partly stay in cache between tokens (a
model not much larger than the last-level cache). numpy is the fallback when no C compiler works
(one thread, a lower bound).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

# the probe's source; the compiled binary's name carries its hash, so an edited probe is rebuilt
STREAM_SOURCE = Path(__file__).with_name("stream_read.c")

# Tried in order; the first that compiles is used. -march=native is fine here: a throwaway probe
# built and run on this very machine.
_FLAG_SETS = (("-O3", "-march=native", "-fopenmp"), ("-O3", "-fopenmp"), ("-O3", "-march=native"), ("-O3",))


def _compile_stream(cache_dir: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    try:
        source = STREAM_SOURCE.read_text()
    except OSError:  # a package installed without its data files: numpy's one-thread fallback
        return None
    # the source's hash is in the name: an edited probe never reuses an old binary
    key = hashlib.sha1((source + repr(_FLAG_SETS)).encode()).hexdigest()[:10]
    exe = cache_dir / f"stream_read-{platform.machine()}-{key}"
    if exe.exists():
        return exe
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "stream_read.c", Path(tmp) / "stream_read"
        src.write_text(source)
        for flags in _FLAG_SETS:
            r = subprocess.run([cc, *flags, str(src), "-o", str(out)], capture_output=True, text=True)
            if r.returncode == 0:
                _flags_file(exe).write_text(" ".join(flags))
                os.replace(out, exe)  # atomic: a concurrent run sees no half-written binary
                return exe
    return None


def _flags_file(exe: Path) -> Path:
    return exe.with_name(exe.name + ".flags")


def _parse_stream(stdout: str) -> tuple[float, int, str, dict[str, float]]:
    lines = stdout.split("\n")
    gbs, nthreads, best = lines[0].split()
    variants = {name: float(v) for name, v in (ln.split() for ln in lines[1:] if len(ln.split()) == 2)}
    return float(gbs), int(nthreads), best, variants


def memory_bandwidth(threads: int, cache_dir: Path, mib: int = 512, passes: int = 8) -> dict:
    """Best-of-passes read bandwidth in GB/s (1e9 bytes/s) over a ``mib`` MiB buffer."""
    exe = _compile_stream(cache_dir)
    if exe is not None:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="spread")
        r = subprocess.run([str(exe), str(mib), str(passes)], capture_output=True, text=True, env=env, timeout=300)
        if r.returncode == 0:
            gbs, nthreads, best, variants = _parse_stream(r.stdout)
            flags = _flags_file(exe).read_text() if _flags_file(exe).exists() else "?"
            method = "C vector read (OpenMP)" if "-fopenmp" in flags else "C vector read (no OpenMP: 1 thread)"
            return {"gb_s": gbs, "method": method, "threads": nthreads, "mib": mib, "passes": passes,
                    "best_variant": best, "variants_gb_s": variants, "cflags": flags}
    import numpy as np

    a = np.ones(mib * 1024 * 1024 // 8)
    best_t = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        a.sum()
        best_t = min(best_t, time.perf_counter() - t0)
    return {"gb_s": a.nbytes / best_t / 1e9, "method": "numpy sum (1 thread)", "threads": 1, "mib": mib}


def peak_gemm(threads: int, n: int = 1024, min_time: float = 0.5) -> dict[str, float]:
    """Best torch GEMM rate for an n^3 product, in TFLOP/s (TOP/s for int8), per dtype."""
    import torch

    torch.set_num_threads(threads)
    out: dict[str, float] = {}
    cases = {
        "fp32": lambda: (torch.randn(n, n), torch.randn(n, n), torch.matmul),
        "bf16": lambda: (torch.randn(n, n, dtype=torch.bfloat16), torch.randn(n, n, dtype=torch.bfloat16), torch.matmul),
        "int8": lambda: (torch.randint(-127, 127, (n, n), dtype=torch.int8),
                         torch.randint(-127, 127, (n, n), dtype=torch.int8), torch._int_mm),
    }
    for name, make in cases.items():
        try:
            a, b, fn = make()
            fn(a, b)
            best = float("inf")
            for _ in range(3):
                k, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < min_time / 3:
                    fn(a, b)
                    k += 1
                best = min(best, (time.perf_counter() - t0) / k)
            out[name] = 2 * n**3 / best / 1e12
        except (RuntimeError, AttributeError):  # e.g. no int8 GEMM on this build
            continue
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key = line.split(":")[0].strip().lower()
            if key in ("model name", "cpu model", "hardware"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
