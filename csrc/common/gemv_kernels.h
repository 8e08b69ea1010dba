// The small-M linear (GEMV: decode rows) over a vector type V and a storage type T
// (ANYCORE_GEMV_KERNELS in kernel_table.h).
#pragma once
#include <cstdint>

#include "kernel_helpers.h"
#include "parallel.h"

namespace anycore {
namespace {

// The bf16 tile of a kBf16Tile vector type (up to 4 activation rows x 4 weight rows, each weight
// vector loaded once: VDPBF16PS, BFDOT, or on AVX2 widened to fp32): V::dot_tile<MR> for mr rows.
template <typename V>
inline void dot_tile_bf16(const bf16* x, int64_t xs, int64_t mr, const bf16* w, int64_t k, int64_t nr,
                          float* res) {
  switch (mr) {
    case 1: return V::template dot_tile<1>(x, xs, w, k, nr, res);
    case 2: return V::template dot_tile<2>(x, xs, w, k, nr, res);
    case 3: return V::template dot_tile<3>(x, xs, w, k, nr, res);
    default: return V::template dot_tile<4>(x, xs, w, k, nr, res);
  }
}

// Streams each weight row once per call; the M activation rows stay in L1. Work is split in
// tiles of four weight rows; with VDPBF16PS up to four activation rows share each weight load
// (dot_tile_bf16).
template <typename V, typename T>
void linear_kernel(void* out_, const void* x_, int64_t xs, const void* w_, const void* bias_, int64_t m,
                   int64_t n, int64_t k) {
  T* out = static_cast<T*>(out_);
  const T* x = static_cast<const T*>(x_);
  const T* w = static_cast<const T*>(w_);
  const T* bias = static_cast<const T*>(bias_);
  constexpr int64_t kRows = 4, kCols = 4;
  parallel_for_guided((n + kRows - 1) / kRows, 1 + 8192 / (k > 0 ? k : 1), [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t n0 = blk * kRows, nr = n - n0 < kRows ? n - n0 : kRows;
      for (int64_t i0 = 0; i0 < m; i0 += kCols) {
        const int64_t mr = m - i0 < kCols ? m - i0 : kCols;
        float res[kCols * kRows] = {};
        if constexpr (V::kBf16Tile && kIsBf16<T>) {
          dot_tile_bf16<V>(x + i0 * xs, xs, mr, w + n0 * k, k, nr, res);
        } else {
          // Each weight row from its start to its end (one sequential stream, see dot_tile in
          // x86/vec_avx512.h for why), two accumulator chains per row.
          for (int64_t i = 0; i < mr; ++i) {
            const T* xr = x + (i0 + i) * xs;
            for (int64_t r = 0; r < nr; ++r) {
              const T* wr = w + (n0 + r) * k;
              V a0 = V::zero(), a1 = V::zero();
              int64_t j = 0;
              for (; j + 2 * V::W <= k; j += 2 * V::W) {
                a0 = V::fma(load_any<V>(xr + j, V::W), load_any<V>(wr + j, V::W), a0);
                a1 = V::fma(load_any<V>(xr + j + V::W, V::W), load_any<V>(wr + j + V::W, V::W), a1);
              }
              for (; j < k; j += V::W) a0 = V::fma(load_any<V>(xr + j, k - j), load_any<V>(wr + j, k - j), a0);
              res[i * kRows + r] = a0.sum() + a1.sum();
            }
          }
        }
        for (int64_t i = 0; i < mr; ++i) {
          for (int64_t r = 0; r < nr; ++r) {
            float y = res[i * kRows + r] + (bias ? to_float(bias[n0 + r]) : 0.0f);
            out[(i0 + i) * n + n0 + r] = from_float<T>(y);
          }
        }
      }
    }
  });
}

}  // namespace
}  // namespace anycore
