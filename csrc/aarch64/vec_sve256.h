// 16-lane fp32 vector on fixed-length 256-bit SVE (two svfloat32_t halves of 8 lanes), for the
// sve256 variant: Neoverse V1 class CPUs (Graviton3). Same interface as common/vec_generic.h,
// with bf16 dot products on SVE BFDOT (same rounding remarks as BFDOT in vec_neon.h).
//
// The arm_sve_vector_bits(256) types have a size known at compile time, so they can be struct
// members and array elements (the kernels in common/*_kernels.h keep vectors in arrays). The
// price: this code is only correct when the CPU's SVE vector length is exactly 256 bits.
// -msve-vector-bits=256 makes the compiler use 8 lanes per vector everywhere (offsets, ptrue
// VL8 patterns); on a 128-bit or 512-bit CPU the instructions still exist, so nothing traps:
// it would silently compute wrong results. Selection therefore requires the `sve256`
// pseudo-flag (platform/features.py: SVE present and its vector length is 256 bits).
#pragma once
#include <arm_sve.h>

#include <cstdint>
#include <type_traits>

#include "../common/bf16.h"
#include "../common/prefetch.h"

#if !defined(__ARM_FEATURE_SVE_BITS) || __ARM_FEATURE_SVE_BITS != 256
#error "vec_sve256.h needs -msve-vector-bits=256"
#endif
#if !defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#error "vec_sve256.h needs SVE BF16 (-march=...+sve+bf16)"
#endif

namespace anycore {
namespace {

typedef svfloat32_t f32x8_t __attribute__((arm_sve_vector_bits(256)));
typedef svuint32_t u32x8_t __attribute__((arm_sve_vector_bits(256)));
typedef svbfloat16_t bf16x16_t __attribute__((arm_sve_vector_bits(256)));
typedef svbool_t pred256_t __attribute__((arm_sve_vector_bits(256)));

struct VecSve256 {
  static constexpr int W = 16;
  static constexpr int kHalf = 8;  // fp32 lanes per SVE register at 256 bits
  static constexpr bool kBf16Dot = true;
  static constexpr bool kBf16Tile = true;  // dot_tile below
  f32x8_t v[2];

  static pred256_t all() { return svptrue_b32(); }
  // lanes [lo, n) of a half starting at element lo
  static pred256_t first(int lo, int n) { return svwhilelt_b32_s32(lo, n); }

  static f32x8_t ld(pred256_t pg, const float* p) { return svld1_f32(pg, p); }
  static f32x8_t ld(pred256_t pg, const bf16* p) {
    // inactive lanes load as 0 and stay 0 through the shift
    u32x8_t u = svld1uh_u32(pg, reinterpret_cast<const uint16_t*>(p));
    return svreinterpret_f32_u32(svlsl_n_u32_x(all(), u, 16));
  }
  // fp32 -> bf16 bits in the low half of each lane (round to nearest even, NaN kept quiet)
  static u32x8_t bf16_bits(f32x8_t x) {
    const pred256_t pg = all();
    u32x8_t u = svreinterpret_u32_f32(x);
    u32x8_t hi = svlsr_n_u32_x(pg, u, 16);
    u32x8_t r = svlsr_n_u32_x(pg, svadd_u32_x(pg, svadd_n_u32_x(pg, u, 0x7fff), svand_n_u32_x(pg, hi, 1)), 16);
    return svsel_u32(svcmpuo_f32(pg, x, x), svorr_n_u32_x(pg, hi, 0x40), r);
  }
  static void st(pred256_t pg, float* p, f32x8_t x) { svst1_f32(pg, p, x); }
  static void st(pred256_t pg, bf16* p, f32x8_t x) {
    svst1h_u32(pg, reinterpret_cast<uint16_t*>(p), bf16_bits(x));
  }

  static VecSve256 set1(float a) {
    f32x8_t x = svdup_n_f32(a);
    return {{x, x}};
  }
  static VecSve256 zero() { return set1(0.0f); }
  template <typename T>
  static VecSve256 load(const T* p) {
    return {{ld(all(), p), ld(all(), p + kHalf)}};
  }
  // the first n < W values, zeros after them (predicated: nothing past p + n is read)
  template <typename T>
  static VecSve256 load_n(const T* p, int n) {
    return {{ld(first(0, n), p), ld(first(kHalf, n), p + (n < kHalf ? n : kHalf))}};
  }
  template <typename T>
  void store(T* p) const {
    st(all(), p, v[0]);
    st(all(), p + kHalf, v[1]);
  }
  template <typename T>
  void store_n(T* p, int n) const {
    st(first(0, n), p, v[0]);
    st(first(kHalf, n), p + (n < kHalf ? n : kHalf), v[1]);
  }
#define ANYCORE_SVE256_BINOP(op, fn)                                             \
  VecSve256 operator op(const VecSve256& o) const {                              \
    return {{fn(all(), v[0], o.v[0]), fn(all(), v[1], o.v[1])}};                 \
  }
  ANYCORE_SVE256_BINOP(+, svadd_f32_x)
  ANYCORE_SVE256_BINOP(-, svsub_f32_x)
  ANYCORE_SVE256_BINOP(*, svmul_f32_x)
  ANYCORE_SVE256_BINOP(/, svdiv_f32_x)
#undef ANYCORE_SVE256_BINOP
  static VecSve256 fma(const VecSve256& a, const VecSve256& b, const VecSve256& c) {
    return {{svmla_f32_x(all(), c.v[0], a.v[0], b.v[0]), svmla_f32_x(all(), c.v[1], a.v[1], b.v[1])}};
  }
  static VecSve256 max(const VecSve256& a, const VecSve256& b) {
    return {{svmax_f32_x(all(), a.v[0], b.v[0]), svmax_f32_x(all(), a.v[1], b.v[1])}};
  }
  float sum() const { return svaddv_f32(all(), svadd_f32_x(all(), v[0], v[1])); }
  float hmax() const { return svmaxv_f32(all(), svmax_f32_x(all(), v[0], v[1])); }
  static f32x8_t exp8(f32x8_t x) {
    // same reduction and polynomial as exp_poly() in common/vec_generic.h; 2^n via FSCALE
    const pred256_t pg = all();
    x = svmin_n_f32_x(pg, svmax_n_f32_x(pg, x, -87.0f), 88.0f);
    f32x8_t n = svrintn_f32_x(pg, svmul_n_f32_x(pg, x, 1.44269504088896341f));
    f32x8_t r = svmls_n_f32_x(pg, x, n, 0.693359375f);
    r = svmla_n_f32_x(pg, r, n, 2.12194440e-4f);
    f32x8_t p = svdup_n_f32(1.9875691500e-4f);
    p = svmla_f32_x(pg, svdup_n_f32(1.3981999507e-3f), p, r);
    p = svmla_f32_x(pg, svdup_n_f32(8.3334519073e-3f), p, r);
    p = svmla_f32_x(pg, svdup_n_f32(4.1665795894e-2f), p, r);
    p = svmla_f32_x(pg, svdup_n_f32(1.6666665459e-1f), p, r);
    p = svmla_f32_x(pg, svdup_n_f32(5.0000001201e-1f), p, r);
    p = svmla_f32_x(pg, svadd_n_f32_x(pg, r, 1.0f), svmul_f32_x(pg, p, r), r);
    return svscale_f32_x(pg, p, svcvt_s32_f32_x(pg, n));
  }
  VecSve256 exp() const { return {{exp8(v[0]), exp8(v[1])}}; }
  static f32x8_t recip8(f32x8_t x) {
    // estimate + two Newton steps (FRECPE/FRECPS), as the neon variant does
    f32x8_t e = svrecpe_f32(x);
    e = svmul_f32_x(all(), e, svrecps_f32(x, e));
    return svmul_f32_x(all(), e, svrecps_f32(x, e));
  }
  VecSve256 recip() const { return {{recip8(v[0]), recip8(v[1])}}; }
  VecSve256 round_bf16() const {
    return {{svreinterpret_f32_u32(svlsl_n_u32_x(all(), bf16_bits(v[0]), 16)),
             svreinterpret_f32_u32(svlsl_n_u32_x(all(), bf16_bits(v[1]), 16))}};
  }

  // ---- bf16 dot products (SVE BFDOT: each fp32 lane += a[2i] b[2i] + a[2i+1] b[2i+1]) ----
  static constexpr int kBf16Lanes = 16;  // bf16 values per register
  static bf16x16_t ldh(pred256_t pg, const bf16* p) {
    return svreinterpret_bf16_u16(svld1_u16(pg, reinterpret_cast<const uint16_t*>(p)));
  }
  // dot(a, b) over n values: four independent BFDOT chains, 64 values per step; the tail is
  // predicated (inactive lanes load as zero)
  static float dot_bf16(const bf16* a, const bf16* b, int64_t n) {
    const pred256_t pg = svptrue_b16();
    f32x8_t acc[4] = {svdup_n_f32(0.0f), svdup_n_f32(0.0f), svdup_n_f32(0.0f), svdup_n_f32(0.0f)};
    int64_t i = 0;
    for (; i + 4 * kBf16Lanes <= n; i += 4 * kBf16Lanes) {
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u)
        acc[u] = svbfdot_f32(acc[u], ldh(pg, a + i + kBf16Lanes * u), ldh(pg, b + i + kBf16Lanes * u));
    }
    for (int u = 0; i < n; i += kBf16Lanes, ++u) {
      const pred256_t pt = svwhilelt_b16_s64(i, n);
      acc[u] = svbfdot_f32(acc[u], ldh(pt, a + i), ldh(pt, b + i));
    }
    return svaddv_f32(all(), svadd_f32_x(all(), svadd_f32_x(all(), acc[0], acc[1]), svadd_f32_x(all(), acc[2], acc[3])));
  }
  // acc[i][r] += x row i . weight row r over the 16 values at j (the lanes of pg)
  template <int MR>
  static void tile_step(f32x8_t (&acc)[MR][4], const bf16* x, int64_t xs, const bf16* const (&wr)[4], int64_t j,
                        pred256_t pg) {
    bf16x16_t wv[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) wv[r] = ldh(pg, wr[r] + j);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const bf16x16_t xv = ldh(pg, x + i * xs + j);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) acc[i][r] = svbfdot_f32(acc[i][r], xv, wv[r]);
    }
  }
  // res[i * 4 + r] = dot(x + i * xs, w + r * k) for i < MR <= 4, r < nr <= 4: each weight
  // vector is loaded once for all MR activation rows (small-batch GEMM reads W once); called
  // through dot_tile_bf16 in common/gemv_kernels.h.
  template <int MR>
  static void dot_tile(const bf16* x, int64_t xs, const bf16* w, int64_t k, int64_t nr, float* res) {
    // Weight rows past nr re-read row nr - 1 (valid memory, results dropped): no branches in the
    // loop. One activation row gets two accumulator sets (8 chains); more rows have enough.
    constexpr int kSets = MR == 1 ? 2 : 1;
    const bf16* wr[4];
    for (int r = 0; r < 4; ++r) wr[r] = w + (r < nr ? r : nr - 1) * k;
    f32x8_t acc[kSets][MR][4];
    for (int s = 0; s < kSets; ++s)
      for (int i = 0; i < MR; ++i)
        for (int r = 0; r < 4; ++r) acc[s][i][r] = svdup_n_f32(0.0f);
    const pred256_t full = svptrue_b16();
    int64_t j = 0;
    for (; j + 2 * kBf16Lanes <= k; j += 2 * kBf16Lanes) {  // 64 bytes of each weight row: one prefetch
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) prefetch_stream(wr[r] + j);
      tile_step<MR>(acc[0], x, xs, wr, j, full);
      tile_step<MR>(acc[kSets - 1], x, xs, wr, j + kBf16Lanes, full);
    }
    for (; j < k; j += kBf16Lanes) tile_step<MR>(acc[0], x, xs, wr, j, svwhilelt_b16_s64(j, k));
    for (int i = 0; i < MR; ++i)
      for (int64_t r = 0; r < nr; ++r) {
        f32x8_t a = acc[0][i][r];
        for (int s = 1; s < kSets; ++s) a = svadd_f32_x(all(), a, acc[s][i][r]);
        res[i * 4 + r] = svaddv_f32(all(), a);
      }
  }
};

}  // namespace
}  // namespace anycore
