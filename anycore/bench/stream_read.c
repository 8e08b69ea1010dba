/* Memory read-bandwidth probe of `anycore bench compare` (anycore/bench/hardware.py compiles and
   runs it on the machine under test). */
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
