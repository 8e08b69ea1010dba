// 16-lane fp32 vector on AVX2 + FMA (two __m256, two independent FMA chains). Same interface
// as common/vec_generic.h; partial loads/stores go through a stack buffer (no AVX2 masks for
// 16-bit data).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "../common/bf16.h"

namespace anycore {
namespace {

struct VecAvx2 {
  static constexpr int W = 16;
  static constexpr bool kBf16Dot = false;
  static constexpr bool kBf16Tile = true;  // dot_tile below (the GEMV's multi-row tile)
  __m256 v[2];

  static VecAvx2 set1(float a) {
    __m256 x = _mm256_set1_ps(a);
    return {{x, x}};
  }
  static VecAvx2 zero() { return {{_mm256_setzero_ps(), _mm256_setzero_ps()}}; }
  static VecAvx2 load(const float* p) { return {{_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}}; }
  static __m256 widen(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
  static VecAvx2 load(const bf16* p) {
    return {{widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
             widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))}};
  }
  template <typename T>
  static VecAvx2 load_n(const T* p, int n) {
    T tmp[W] = {};
    for (int i = 0; i < n; ++i) tmp[i] = p[i];
    return load(tmp);
  }
  // fp32 -> bf16 bits in the low half of each 32-bit lane (round to nearest even, NaN kept quiet)
  static __m256i bf16_bits(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  }
  void store(float* p) const {
    _mm256_storeu_ps(p, v[0]);
    _mm256_storeu_ps(p + 8, v[1]);
  }
  void store(bf16* p) const {
    // packus works per 128-bit lane: [a0..3 b0..3 | a4..7 b4..7] -> reorder the 64-bit quarters
    __m256i packed = _mm256_packus_epi32(bf16_bits(v[0]), bf16_bits(v[1]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permute4x64_epi64(packed, 0xD8));
  }
  template <typename T>
  void store_n(T* p, int n) const {
    T tmp[W];
    store(tmp);
    for (int i = 0; i < n; ++i) p[i] = tmp[i];
  }
#define ANYCORE_AVX2_BINOP(op, fn) \
  VecAvx2 operator op(const VecAvx2& o) const { return {{fn(v[0], o.v[0]), fn(v[1], o.v[1])}}; }
  ANYCORE_AVX2_BINOP(+, _mm256_add_ps)
  ANYCORE_AVX2_BINOP(-, _mm256_sub_ps)
  ANYCORE_AVX2_BINOP(*, _mm256_mul_ps)
  ANYCORE_AVX2_BINOP(/, _mm256_div_ps)
#undef ANYCORE_AVX2_BINOP
  static VecAvx2 fma(const VecAvx2& a, const VecAvx2& b, const VecAvx2& c) {
    return {{_mm256_fmadd_ps(a.v[0], b.v[0], c.v[0]), _mm256_fmadd_ps(a.v[1], b.v[1], c.v[1])}};
  }
  static VecAvx2 max(const VecAvx2& a, const VecAvx2& b) {
    return {{_mm256_max_ps(a.v[0], b.v[0]), _mm256_max_ps(a.v[1], b.v[1])}};
  }
  static float hsum(__m256 x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  float sum() const { return hsum(_mm256_add_ps(v[0], v[1])); }
  float hmax() const {
    __m256 m = _mm256_max_ps(v[0], v[1]);
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static __m256 exp8(__m256 x) {
    // same reduction and polynomial as exp_poly() in common/vec_generic.h
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  }
  VecAvx2 exp() const { return {{exp8(v[0]), exp8(v[1])}}; }
  static __m256 rcp8(__m256 x) {
    __m256 r = _mm256_rcp_ps(x);
    return _mm256_mul_ps(r, _mm256_fnmadd_ps(x, r, _mm256_set1_ps(2.0f)));
  }
  VecAvx2 recip() const { return {{rcp8(v[0]), rcp8(v[1])}}; }
  VecAvx2 round_bf16() const {
    return {{_mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(v[0]), 16)),
             _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(v[1]), 16))}};
  }
  static float dot_bf16(const bf16*, const bf16*, int64_t) { return 0.0f; }

  // res[i * 4 + r] = dot(x + i * xs, w + r * k) for i < MR <= 4, r < nr <= 4 (gemv_kernels.h).
  // No bf16 dot product here, so every bf16 is widened to fp32 (a shift) before its FMA: the
  // MR activation rows once per chunk of kChunk into a stack buffer, each weight vector once
  // for all MR rows. Each weight row is read from its start to its end (one sequential stream,
  // see vec_avx512.h dot_tile) when k <= kChunk, every projection of the models served so far.
  // A row sums in the same order whatever MR (two accumulators over alternate 8-lane halves,
  // chunk by chunk), so its result does not depend on the batch it came in.
  static constexpr int64_t kChunk = 2048;
  template <int MR>
  static void dot_tile(const bf16* x, int64_t xs, const bf16* w, int64_t k, int64_t nr, float* res) {
    alignas(32) float xf[MR][kChunk + W];
    for (int i = 0; i < MR; ++i)
      for (int64_t r = 0; r < nr; ++r) res[i * 4 + r] = 0.0f;
    for (int64_t c0 = 0; c0 < k; c0 += kChunk) {
      const int64_t len = k - c0 < kChunk ? k - c0 : kChunk, full = len / W * W;
      for (int i = 0; i < MR; ++i) {
        const bf16* xr = x + i * xs + c0;
        int64_t j = 0;
        for (; j < full; j += W) load(xr + j).store(xf[i] + j);
        if (j < len) load_n(xr + j, static_cast<int>(len - j)).store(xf[i] + j);  // zero-padded
      }
      for (int64_t r = 0; r < nr; ++r) {
        const bf16* wr = w + r * k + c0;
        __m256 acc[MR][2];
        for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
        const auto fma_rows = [&](const VecAvx2& wv, int64_t j) {
          for (int i = 0; i < MR; ++i) {
            acc[i][0] = _mm256_fmadd_ps(_mm256_load_ps(xf[i] + j), wv.v[0], acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(_mm256_load_ps(xf[i] + j + 8), wv.v[1], acc[i][1]);
          }
        };
        int64_t j = 0;
        for (; j < full; j += W) fma_rows(load(wr + j), j);
        if (j < len) fma_rows(load_n(wr + j, static_cast<int>(len - j)), j);
        for (int i = 0; i < MR; ++i) res[i * 4 + r] += hsum(_mm256_add_ps(acc[i][0], acc[i][1]));
      }
    }
  }
};

}  // namespace
}  // namespace anycore
