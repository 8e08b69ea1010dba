// OpenMP helpers for kernel translation units. Everything is in an anonymous namespace: each
// ISA translation unit gets its own copy compiled with its own flags (no ODR sharing of code
// built for a wider ISA).
#pragma once
#include <omp.h>

#include <cstdint>

namespace anycore {
namespace {

// Threads for n items with >= grain items each; 1 inside a parallel region (nested calls run
// serially).
inline int64_t team_size(int64_t n, int64_t grain) {
  const int64_t max_threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t nt = (n + grain - 1) / (grain < 1 ? 1 : grain);
  return nt < max_threads ? nt : max_threads;
}

// f(begin, end) over [0, n) in static contiguous chunks (see team_size).
template <typename F>
inline void parallel_for(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  const int64_t nt = team_size(n, grain);
  if (nt <= 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(static_cast<int>(nt))
  {
    int64_t t = omp_get_thread_num(), k = omp_get_num_threads();
    int64_t chunk = (n + k - 1) / k;
    int64_t b = t * chunk, e = b + chunk < n ? b + chunk : n;
    if (b < e) f(b, e);
  }
}

// parallel_for for long streaming loops: the same contract, but the threads take shrinking
// chunks on demand (OpenMP guided), so one thread slowed by its neighbours on a shared host does
// not leave the others waiting at the end.
template <typename F>
inline void parallel_for_guided(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  const int64_t nt = team_size(n, grain);
  if (nt <= 1) {
    f(int64_t{0}, n);
    return;
  }
  const int64_t chunk = grain < 1 ? 1 : grain;
#pragma omp parallel for num_threads(static_cast<int>(nt)) schedule(guided, chunk)
  for (int64_t b = 0; b < n; ++b) f(b, b + 1);
}

}  // namespace
}  // namespace anycore
