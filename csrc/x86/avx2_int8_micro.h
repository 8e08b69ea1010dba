// The AVX2 W8A8 micro-kernel, for x86 CPUs without AVX-512 VNNI (Haswell to Zen 3).
//
// AVX2 has no byte dot product into int32 (VPDPBUSD); its VPMADDUBSW multiplies unsigned by
// signed bytes and adds each pair into a *saturating* int16. So activations stay symmetric
// int8 in [-127, 127] (kActOffset 0, no column sums) and each product is formed as |w|
// (unsigned) times x carrying w's sign (VPSIGNB): the same product, and a pair is at most
// 2 * 128 * 127 = 32512 in magnitude, so nothing saturates. VPMADDWD by ones then adds the
// pairs into int32 lanes: lane i holds the sum over 4 consecutive k of column i, exactly what
// VPDPBUSD gives in the VNNI layout (G = 4), so the result is the exact int32 accumulator.
#pragma once
#include <immintrin.h>

#include <cstring>

#include "../common/int8_impl.h"

namespace anycore {
namespace {

struct Avx2Int8Micro {
  static constexpr int kGroup = 4, kKAlign = 4, kActOffset = 0, kMR = 4, kNP = 4;
  static constexpr bool kColSums = false, kActPairs = false;
  static constexpr int kRowAlign = 1;

  // One panel (16 columns: two 8-lane int32 accumulators a row) at a time, over all of K: each
  // panel is one sequential stream of 16 * kp bytes; the R activation rows stay in L1. At most
  // 4 rows: 8 accumulators + the two weight vectors and their magnitudes fit the 16 registers.
  template <int R, int P>
  static void tile(const int8_t* a, int64_t kp, const int8_t* w, int64_t ps, int32_t* c) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int64_t groups = kp / 4;
    for (int p = 0; p < P; ++p) {
      const int8_t* wp = w + p * ps;
      __m256i acc[R][2];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
      for (int64_t g = 0; g < groups; ++g) {
        __builtin_prefetch(wp + g * 64 + 1024, 0, 3);
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + g * 64));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + g * 64 + 32));
        const __m256i u0 = _mm256_abs_epi8(w0), u1 = _mm256_abs_epi8(w1);  // (|-128| reads as 128)
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          int32_t q4;
          std::memcpy(&q4, a + r * kp + g * 4, 4);
          const __m256i av = _mm256_set1_epi32(q4);
          const __m256i p0 = _mm256_maddubs_epi16(u0, _mm256_sign_epi8(av, w0));
          const __m256i p1 = _mm256_maddubs_epi16(u1, _mm256_sign_epi8(av, w1));
          acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(p0, ones));
          acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(p1, ones));
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        int32_t* cr = c + r * kNP * kI8Panel + p * kI8Panel;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(cr), acc[r][0]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(cr + 8), acc[r][1]);
      }
    }
  }
};

}  // namespace
}  // namespace anycore
