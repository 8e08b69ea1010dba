// The AVX-512 VNNI W8A8 micro-kernel, shared by the avx512_vnni and amx translation units
// (each compiles its own copy with its own flags; everything has internal linkage).
//
// VPDPBUSD multiplies *unsigned* by signed bytes, so activations are stored as u8 = q + 128
// and the exact symmetric accumulator is recovered as acc = acc_u8 - 128 * sum_k w[n, k]
// (column sums computed at pack time, applied in the epilogue). Every term stays in int32
// range for K < 66000 (255 * 127 * K), and the result is exactly the int32 sum of q * w.
#pragma once
#include <immintrin.h>

#include "../common/int8_impl.h"

namespace anycore {
namespace {

// Each of a tile's panel streams is prefetched this far ahead (one hint per 64-byte line). The
// panels are 16 * kp bytes apart, so prefetch.h's "8 KiB past this address" would mostly land
// in the next panel, already read by its own stream; 4 streams x 2 KiB keep the same 8 KiB in
// flight per thread. Decode (one row) reads each weight byte once and is bound by how many
// line fills a core keeps in flight.
constexpr std::uintptr_t kPanelAhead = 2048;

inline void prefetch_panel(const int8_t* p) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(p) + kPanelAhead), 0, 3);
}

// 6 rows x 4 panels (64 columns): 24 zmm accumulators + 4 weight vectors + 1 broadcast. Per
// group of 4 K: four 64-byte weight loads feed R * 4 VPDPBUSD; at one row (decode GEMV) the
// four independent chains stream the weights well above DRAM bandwidth.
template <int KAlign, int RowAlign>
struct VnniMicroT {
  static constexpr int kGroup = 4, kKAlign = KAlign, kActOffset = 128, kMR = 6, kNP = 4;
  static constexpr bool kColSums = true, kActPairs = false;
  static constexpr int kRowAlign = RowAlign;

  template <int R, int P>
  static void tile(const int8_t* a, int64_t kp, const int8_t* w, int64_t ps, int32_t* c) {
    __m512i acc[R][P];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_si512();
    const int64_t groups = kp / 4;
    for (int64_t g = 0; g < groups; ++g) {
      __m512i wv[P];
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        prefetch_panel(w + p * ps + g * 64);
        wv[p] = _mm512_loadu_si512(w + p * ps + g * 64);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        int32_t q4;
        std::memcpy(&q4, a + r * kp + g * 4, 4);
        const __m512i av = _mm512_set1_epi32(q4);
#pragma GCC unroll 4
        for (int p = 0; p < P; ++p) acc[r][p] = _mm512_dpbusd_epi32(acc[r][p], av, wv[p]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) _mm512_storeu_si512(c + r * kNP * kI8Panel + p * kI8Panel, acc[r][p]);
  }
};

}  // namespace
}  // namespace anycore
