// 16-lane fp32 vector on AVX-512 F/BW/VL. With ANYCORE_AVX512_BF16 defined (the avx512_bf16
// translation unit) bf16 rounding uses VCVTNEPS2BF16 and bf16 dot products use VDPBF16PS.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "../common/bf16.h"

namespace anycore {
namespace {

struct VecAvx512 {
  static constexpr int W = 16;
#ifdef ANYCORE_AVX512_BF16
  static constexpr bool kBf16Dot = true;
#else
  static constexpr bool kBf16Dot = false;
#endif
  static constexpr bool kBf16PairDot = kBf16Dot;  // dot_pairs below
  static constexpr bool kBf16Tile = kBf16Dot;     // dot_tile below
  __m512 v;

  static __mmask16 mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
  static VecAvx512 set1(float a) { return {_mm512_set1_ps(a)}; }
  static VecAvx512 zero() { return {_mm512_setzero_ps()}; }
  static VecAvx512 load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static VecAvx512 load(const bf16* p) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
  }
  template <typename T>
  static VecAvx512 load_n(const T* p, int n) {
    if constexpr (std::is_same_v<T, float>) {
      return {_mm512_maskz_loadu_ps(mask(n), p)};
    } else {
      __m256i h = _mm256_maskz_loadu_epi16(mask(n), p);
      return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
    }
  }
  // fp32 -> bf16 bits in the low 16 of each 32-bit lane (round to nearest even, NaN kept quiet)
  static __m512i bf16_bits(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  void store(bf16* p) const {
#ifdef ANYCORE_AVX512_BF16
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
#else
    _mm512_mask_cvtepi32_storeu_epi16(p, 0xffff, bf16_bits(v));
#endif
  }
  template <typename T>
  void store_n(T* p, int n) const {
    if constexpr (std::is_same_v<T, float>) {
      _mm512_mask_storeu_ps(p, mask(n), v);
    } else {
#ifdef ANYCORE_AVX512_BF16
      _mm256_mask_storeu_epi16(p, mask(n), (__m256i)_mm512_cvtneps_pbh(v));
#else
      _mm512_mask_cvtepi32_storeu_epi16(p, mask(n), bf16_bits(v));
#endif
    }
  }
  VecAvx512 operator+(const VecAvx512& o) const { return {_mm512_add_ps(v, o.v)}; }
  VecAvx512 operator-(const VecAvx512& o) const { return {_mm512_sub_ps(v, o.v)}; }
  VecAvx512 operator*(const VecAvx512& o) const { return {_mm512_mul_ps(v, o.v)}; }
  VecAvx512 operator/(const VecAvx512& o) const { return {_mm512_div_ps(v, o.v)}; }
  static VecAvx512 fma(const VecAvx512& a, const VecAvx512& b, const VecAvx512& c) {
    return {_mm512_fmadd_ps(a.v, b.v, c.v)};
  }
  static VecAvx512 max(const VecAvx512& a, const VecAvx512& b) { return {_mm512_max_ps(a.v, b.v)}; }
  float sum() const { return _mm512_reduce_add_ps(v); }
  float hmax() const { return _mm512_reduce_max_ps(v); }
  VecAvx512 exp() const {
    // same reduction and polynomial as exp_poly() in common/vec_generic.h; 2^n via VSCALEFPS
    __m512 x = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return {_mm512_scalef_ps(p, n)};
  }
  VecAvx512 recip() const {
    __m512 r = _mm512_rcp14_ps(v);
    return {_mm512_mul_ps(r, _mm512_fnmadd_ps(v, r, _mm512_set1_ps(2.0f)))};
  }
  VecAvx512 round_bf16() const {
#ifdef ANYCORE_AVX512_BF16
    __m512i h = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v));
#else
    __m512i h = bf16_bits(v);
#endif
    return {_mm512_castsi512_ps(_mm512_slli_epi32(h, 16))};
  }
  // res[i * 4 + r] = dot(x + i * xs, w + r * k) for i < MR <= 4, r < nr <= 4: each weight
  // vector is loaded once for all MR activation rows (small-batch GEMM reads W once); called
  // through dot_tile_bf16 in common/gemv_kernels.h.
  //
  // The weight rows are read one after the other, each from its start to its end: the nr rows
  // are adjacent in memory, so the tile is one sequential stream. Reading the four rows side by
  // side (four streams k * 2 bytes apart, each only a few cache lines long) kept the hardware
  // prefetchers from ever ramping up: on a 2-core AMD EPYC (Zen 4) that pattern read 9.4 GB/s
  // per core against 23.6 GB/s for this order (SmolLM2-135M's 3072 x 576 GEMV), and a software
  // prefetch 8 KiB ahead made the sequential order slower (22.2 GB/s), so there is none.
  // Two accumulators per activation row split the dependency chain; every row, whatever MR,
  // sums in the same order, so a row's result does not depend on the batch it came in.
  template <int MR>
  static void dot_tile(const bf16* x, int64_t xs, const bf16* w, int64_t k, int64_t nr, float* res) {
#ifdef ANYCORE_AVX512_BF16
    for (int64_t r = 0; r < nr; ++r) {
      const bf16* wr = w + r * k;
      __m512 acc[MR][2];
      for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
      int64_t j = 0;
      for (; j + 64 <= k; j += 64) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wr + j), w1 = (__m512bh)_mm512_loadu_si512(wr + j + 32);
        for (int i = 0; i < MR; ++i) {
          acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)_mm512_loadu_si512(x + i * xs + j), w0);
          acc[i][1] = _mm512_dpbf16_ps(acc[i][1], (__m512bh)_mm512_loadu_si512(x + i * xs + j + 32), w1);
        }
      }
      for (; j < k; j += 32) {
        const __mmask32 m = k - j >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1ull << (k - j)) - 1ull);
        const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, wr + j);
        for (int i = 0; i < MR; ++i)
          acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)_mm512_maskz_loadu_epi16(m, x + i * xs + j), wv);
      }
      for (int i = 0; i < MR; ++i) res[i * 4 + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
    }
#else
    for (int i = 0; i < MR; ++i)
      for (int64_t r = 0; r < nr; ++r) res[i * 4 + r] = dot_bf16(x + i * xs, w + r * k, k);
#endif
  }
  // acc[i] += lo(pair) * b[2i] + hi(pair) * b[2i + 1] for the W lanes: `pair` is two bf16 (the
  // low half first), b points at 2W bf16 (VDPBF16PS with one operand broadcast). Attention's
  // blocked path runs its score and P V products through it (attention_kernels.h).
  static VecAvx512 dot_pairs(VecAvx512 acc, uint32_t pair, const bf16* b) {
#ifdef ANYCORE_AVX512_BF16
    return {_mm512_dpbf16_ps(acc.v, (__m512bh)_mm512_set1_epi32(static_cast<int>(pair)),
                             (__m512bh)_mm512_loadu_si512(b))};
#else
    (void)pair, (void)b;
    return acc;
#endif
  }
  // out[2i] = a[i], out[2i + 1] = b[i] for i < W: two rows of bf16 as W pairs (dot_pairs' layout)
  static void zip_bf16(const bf16* a, const bf16* b, bf16* out) {
    const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
    const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    _mm512_storeu_si512(out, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
  }
  static float dot_bf16(const bf16* a, const bf16* b, int64_t n) {
#ifdef ANYCORE_AVX512_BF16
    __m512 acc = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
      __m512i x = _mm512_loadu_si512(a + i), y = _mm512_loadu_si512(b + i);
      __m512i x2 = _mm512_loadu_si512(a + i + 32), y2 = _mm512_loadu_si512(b + i + 32);
      acc = _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)y);
      acc2 = _mm512_dpbf16_ps(acc2, (__m512bh)x2, (__m512bh)y2);
    }
    acc = _mm512_add_ps(acc, acc2);
    for (; i + 32 <= n; i += 32) {
      __m512i x = _mm512_loadu_si512(a + i), y = _mm512_loadu_si512(b + i);
      acc = _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)y);
    }
    if (i < n) {
      __mmask32 m = static_cast<__mmask32>((1ull << (n - i)) - 1ull);
      __m512i x = _mm512_maskz_loadu_epi16(m, a + i), y = _mm512_maskz_loadu_epi16(m, b + i);
      acc = _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)y);
    }
    return _mm512_reduce_add_ps(acc);
#else
    (void)a, (void)b, (void)n;
    return 0.0f;
#endif
  }
};

}  // namespace
}  // namespace anycore
