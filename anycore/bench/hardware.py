"""Physical limits for `anycore bench compare`: memory read bandwidth and peak GEMM throughput.

Batch-1 decode streams every weight once per token, so its ceiling is bandwidth / weight bytes;
prefill is matrix-multiply bound, so its ceiling is the best GEMM rate of the same dtype.

Bandwidth: a STREAM-like read (sum of a 512 MiB array) in a tiny C program compiled on the fly
with OpenMP, best of several passes; numpy is the fallback when no C compiler is present (one
thread, so a lower bound).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

_STREAM_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
/* read bandwidth: each thread sums its share of one big array with independent accumulators */
int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 512;
    int passes = argc > 2 ? atoi(argv[2]) : 8;
    size_t n = mib * 1024 * 1024 / sizeof(double);
    double *a = aligned_alloc(64, n * sizeof(double));
    if (!a) return 1;
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = (double)(i & 1023);
    double best = 1e30, sink = 0;
    for (int p = 0; p < passes; p++) {
        double t0 = omp_get_wtime(), total = 0;
        #pragma omp parallel for schedule(static) reduction(+:total)
        for (size_t i = 0; i < n; i += 8) {
            total += (a[i] + a[i+1]) + (a[i+2] + a[i+3]) + (a[i+4] + a[i+5]) + (a[i+6] + a[i+7]);
        }
        double dt = omp_get_wtime() - t0;
        sink += total;
        if (dt < best) best = dt;
    }
    printf("%.6f %d %g\n", (double)(n * sizeof(double)) / best / 1e9, omp_get_max_threads(), sink);
    free(a);
    return 0;
}
"""


def _compile_stream(cache_dir: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    exe = cache_dir / f"stream_read-{platform.machine()}"
    if exe.exists():
        return exe
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "stream_read.c"
        src.write_text(_STREAM_C)
        # -march=native is fine here: a throwaway probe built and run on this very machine
        r = subprocess.run([cc, "-O3", "-march=native", "-fopenmp", str(src), "-o", str(exe)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            r = subprocess.run([cc, "-O3", "-fopenmp", str(src), "-o", str(exe)], capture_output=True, text=True)
        if r.returncode != 0:
            return None
    return exe


def memory_bandwidth(threads: int, cache_dir: Path, mib: int = 512) -> dict:
    """Best-of-passes read bandwidth in GB/s (1e9 bytes/s)."""
    exe = _compile_stream(cache_dir)
    if exe is not None:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="spread")
        r = subprocess.run([str(exe), str(mib), "8"], capture_output=True, text=True, env=env, timeout=300)
        if r.returncode == 0:
            gbs, nthreads, _ = r.stdout.split()
            return {"gb_s": float(gbs), "method": "C read (OpenMP)", "threads": int(nthreads), "mib": mib}
    import numpy as np

    a = np.ones(mib * 1024 * 1024 // 8)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t0)
    return {"gb_s": a.nbytes / best / 1e9, "method": "numpy sum (1 thread)", "threads": 1, "mib": mib}


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
