"""Physical limits for `anycore bench compare`: memory read bandwidth and peak GEMM throughput.

Batch-1 decode streams every weight once per token, so its ceiling is bandwidth / weight bytes;
prefill is matrix-multiply bound, so its ceiling is the best GEMM rate of the same dtype.

Bandwidth: the best read rate that a small C program (compiled on the fly on this machine, with
``-march=native`` and OpenMP when the compiler takes them) achieves over a 512 MiB buffer, larger
than usual last-level caches: each thread first touches, then sums its own contiguous chunk with
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

_STREAM_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#else  /* one thread without OpenMP; the result says how many threads ran */
static int omp_get_thread_num(void) { return 0; }
static int omp_get_num_threads(void) { return 1; }
static double omp_get_wtime(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#endif

/* Read bandwidth: eight independent sums of the widest vector the target has (no add chain limits
   the loads, and eight accumulators still fit the register file of every ISA); the prefetch
   distance is a variant. */
#if defined(__AVX512F__)
#define VBYTES 64
#elif defined(__AVX__)
#define VBYTES 32
#else
#define VBYTES 16 /* SSE2, Neon */
#endif
#define STEP (8 * VBYTES)
typedef float vec __attribute__((vector_size(VBYTES)));

static float sum_chunk(const float *a, size_t n, size_t prefetch_bytes) {
    vec s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
    const vec *p = (const vec *)a, *end = (const vec *)(a + n);
    if (prefetch_bytes) {
        for (; p < end; p += 8) {
            for (int k = 0; k < STEP; k += 64) __builtin_prefetch((const char *)p + prefetch_bytes + k, 0, 3);
            s0 += p[0]; s1 += p[1]; s2 += p[2]; s3 += p[3]; s4 += p[4]; s5 += p[5]; s6 += p[6]; s7 += p[7];
        }
    } else {
        for (; p < end; p += 8) {
            s0 += p[0]; s1 += p[1]; s2 += p[2]; s3 += p[3]; s4 += p[4]; s5 += p[5]; s6 += p[6]; s7 += p[7];
        }
    }
    vec s = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
    float t = 0;
    for (int i = 0; i < VBYTES / 4; i++) t += s[i];
    return t;
}

/* usage: stream_read [MiB] [passes]; prints "GB/s threads variant", one "variant GB/s" line per
   variant, then a checksum (so no pass can be optimised away) */
int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 512;
    int passes = argc > 2 ? atoi(argv[2]) : 8;
    static const size_t prefetch[] = {0, 1024, 4096, 16384};
    static const char *names[] = {"no-prefetch", "prefetch-1k", "prefetch-4k", "prefetch-16k"};
    enum { NV = 4 };
    double best[NV];
    for (int v = 0; v < NV; v++) best[v] = 1e30;
    size_t bytes = mib << 20;
    float *a = aligned_alloc(4096, bytes);
    if (!a || passes < 1) return 1;
    size_t per = 0;  /* floats per thread: whole 4 KiB pages, the same chunk for every thread */
    int nthreads = 1;
    double t0 = 0, sink = 0;
#pragma omp parallel reduction(+:sink)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t n = bytes / (size_t)nt / 4096 * 4096 / sizeof(float);
        float *mine = a + (size_t)t * n;
        for (size_t i = 0; i < n; i++) mine[i] = (float)(i & 1023);  /* first touch by the reader */
#pragma omp single
        { per = n; nthreads = nt; }
        for (int p = 0; p < passes; p++)
            for (int v = 0; v < NV; v++) {  /* interleaved: a burst of outside noise hits all variants */
#pragma omp single
                t0 = omp_get_wtime();  /* the implied barrier starts every thread after the clock */
                __asm__ __volatile__("" : : "r"(mine) : "memory");  /* each pass really reads */
                sink += sum_chunk(mine, n, prefetch[v]);
#pragma omp barrier
#pragma omp single
                { double dt = omp_get_wtime() - t0; if (dt < best[v]) best[v] = dt; }
            }
    }
    double read = (double)per * sizeof(float) * nthreads;
    int bv = 0;
    for (int v = 1; v < NV; v++) if (best[v] < best[bv]) bv = v;
    printf("%.6f %d %s\n", read / best[bv] / 1e9, nthreads, names[bv]);
    for (int v = 0; v < NV; v++) printf("%s %.3f\n", names[v], read / best[v] / 1e9);
    printf("%g\n", sink);
    free(a);
    return 0;
}
"""

# Tried in order; the first that compiles is used. -march=native is fine here: a throwaway probe
# built and run on this very machine.
_FLAG_SETS = (("-O3", "-march=native", "-fopenmp"), ("-O3", "-fopenmp"), ("-O3", "-march=native"), ("-O3",))


def _compile_stream(cache_dir: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    # the source's hash is in the name: an edited probe never reuses an old binary
    key = hashlib.sha1((_STREAM_C + repr(_FLAG_SETS)).encode()).hexdigest()[:10]
    exe = cache_dir / f"stream_read-{platform.machine()}-{key}"
    if exe.exists():
        return exe
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "stream_read.c", Path(tmp) / "stream_read"
        src.write_text(_STREAM_C)
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
