// 16-lane fp32 vector on Advanced SIMD (four float32x4_t, so dot products keep four
// independent FMA chains). Same interface as common/vec_generic.h.
//
// With ANYCORE_NEON_BF16 defined (the neon_bf16 translation unit, -march=armv8.2-a+bf16) bf16
// dot products (linear, the attention q.k dot) use BFDOT. BFDOT sums each pair of products
// with its own rounding (round-to-odd, denormals flushed, FPCR ignored, without FEAT_EBF16),
// so results differ from fp32 FMAs in the last bits, like VDPBF16PS on x86. Everything else
// (bf16 conversion and rounding included) is the same code as the neon variant.
#pragma once
#include <arm_neon.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../common/bf16.h"
#include "../common/prefetch.h"

namespace anycore {
namespace {

struct VecNeon {
  static constexpr int W = 16;
#ifdef ANYCORE_NEON_BF16
  static constexpr bool kBf16Dot = true;
#else
  static constexpr bool kBf16Dot = false;
#endif
  static constexpr bool kBf16PairDot = kBf16Dot;  // dot_pairs below
  static constexpr bool kBf16Tile = kBf16Dot;     // dot_tile below
  float32x4_t v[4];

  static VecNeon set1(float a) {
    float32x4_t x = vdupq_n_f32(a);
    return {{x, x, x, x}};
  }
  static VecNeon zero() { return set1(0.0f); }
  static VecNeon load(const float* p) { return {{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}}; }
  static VecNeon load(const bf16* p) {
    const uint16_t* u = reinterpret_cast<const uint16_t*>(p);
    uint16x8_t a = vld1q_u16(u), b = vld1q_u16(u + 8);
    return {{vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(a), 16)),
             vreinterpretq_f32_u32(vshll_high_n_u16(a, 16)),
             vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(b), 16)),
             vreinterpretq_f32_u32(vshll_high_n_u16(b, 16))}};
  }
  template <typename T>
  static VecNeon load_n(const T* p, int n) {
    T tmp[W] = {};
    for (int i = 0; i < n; ++i) tmp[i] = p[i];
    return load(tmp);
  }
  // fp32 -> bf16 bits in the low half of each lane (round to nearest even, NaN kept quiet)
  static uint32x4_t bf16_bits(float32x4_t x) {
    uint32x4_t u = vreinterpretq_u32_f32(x);
    uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    uint32x4_t r = vshrq_n_u32(vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), lsb), 16);
    uint32x4_t is_num = vceqq_f32(x, x);
    return vbslq_u32(is_num, r, vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x40)));
  }
  void store(float* p) const {
    for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, v[i]);
  }
  void store(bf16* p) const {
    uint16_t* u = reinterpret_cast<uint16_t*>(p);
    vst1q_u16(u, vcombine_u16(vmovn_u32(bf16_bits(v[0])), vmovn_u32(bf16_bits(v[1]))));
    vst1q_u16(u + 8, vcombine_u16(vmovn_u32(bf16_bits(v[2])), vmovn_u32(bf16_bits(v[3]))));
  }
  template <typename T>
  void store_n(T* p, int n) const {
    T tmp[W];
    store(tmp);
    for (int i = 0; i < n; ++i) p[i] = tmp[i];
  }
#define ANYCORE_NEON_BINOP(op, fn)                                           \
  VecNeon operator op(const VecNeon& o) const {                              \
    return {{fn(v[0], o.v[0]), fn(v[1], o.v[1]), fn(v[2], o.v[2]), fn(v[3], o.v[3])}}; \
  }
  ANYCORE_NEON_BINOP(+, vaddq_f32)
  ANYCORE_NEON_BINOP(-, vsubq_f32)
  ANYCORE_NEON_BINOP(*, vmulq_f32)
  ANYCORE_NEON_BINOP(/, vdivq_f32)
#undef ANYCORE_NEON_BINOP
  static VecNeon fma(const VecNeon& a, const VecNeon& b, const VecNeon& c) {
    VecNeon r;
    for (int i = 0; i < 4; ++i) r.v[i] = vfmaq_f32(c.v[i], a.v[i], b.v[i]);
    return r;
  }
  static VecNeon max(const VecNeon& a, const VecNeon& b) {
    VecNeon r;
    for (int i = 0; i < 4; ++i) r.v[i] = vmaxq_f32(a.v[i], b.v[i]);
    return r;
  }
  float sum() const { return vaddvq_f32(vaddq_f32(vaddq_f32(v[0], v[1]), vaddq_f32(v[2], v[3]))); }
  float hmax() const { return vmaxvq_f32(vmaxq_f32(vmaxq_f32(v[0], v[1]), vmaxq_f32(v[2], v[3]))); }
  static float32x4_t exp4(float32x4_t x) {
    // same reduction and polynomial as exp_poly() in common/vec_generic.h
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.0f)), vdupq_n_f32(88.0f));
    int32x4_t n = vcvtnq_s32_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t nf = vcvtq_f32_s32(n);
    float32x4_t r = vfmsq_f32(x, nf, vdupq_n_f32(0.693359375f));
    r = vfmaq_f32(r, nf, vdupq_n_f32(2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), vmulq_f32(p, r), r);
    int32x4_t bits = vshlq_n_s32(vaddq_s32(n, vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(bits));
  }
  VecNeon exp() const { return {{exp4(v[0]), exp4(v[1]), exp4(v[2]), exp4(v[3])}}; }
  VecNeon recip() const {
    VecNeon r;
    for (int i = 0; i < 4; ++i) {
      float32x4_t e = vrecpeq_f32(v[i]);
      e = vmulq_f32(e, vrecpsq_f32(v[i], e));
      r.v[i] = vmulq_f32(e, vrecpsq_f32(v[i], e));
    }
    return r;
  }
  VecNeon round_bf16() const {
    VecNeon r;
    for (int i = 0; i < 4; ++i) r.v[i] = vreinterpretq_f32_u32(vshlq_n_u32(bf16_bits(v[i]), 16));
    return r;
  }
#ifdef ANYCORE_NEON_BF16
  static bfloat16x8_t ld_bf16(const bf16* p) {
    return vreinterpretq_bf16_u16(vld1q_u16(reinterpret_cast<const uint16_t*>(p)));
  }
  // the first n < 8 values, zeros after them (Neon has no masked load)
  static bfloat16x8_t ld_bf16_n(const bf16* p, int64_t n) {
    uint16_t tmp[8] = {};
    std::memcpy(tmp, p, static_cast<size_t>(n) * sizeof(bf16));
    return vreinterpretq_bf16_u16(vld1q_u16(tmp));
  }
  // acc[i] += lo(pair) * b[2i] + hi(pair) * b[2i + 1] for the W lanes: `pair` is two bf16 (the
  // low half first), b points at 2W bf16 (BFDOT with one operand broadcast); see vec_avx512.h.
  static VecNeon dot_pairs(VecNeon acc, uint32_t pair, const bf16* b) {
    const bfloat16x8_t p = vreinterpretq_bf16_u32(vdupq_n_u32(pair));
    return {{vbfdotq_f32(acc.v[0], p, ld_bf16(b)), vbfdotq_f32(acc.v[1], p, ld_bf16(b + 8)),
             vbfdotq_f32(acc.v[2], p, ld_bf16(b + 16)), vbfdotq_f32(acc.v[3], p, ld_bf16(b + 24))}};
  }
  // out[2i] = a[i], out[2i + 1] = b[i] for i < W: two rows of bf16 as W pairs (dot_pairs' layout)
  static void zip_bf16(const bf16* a, const bf16* b, bf16* out) {
    const uint16_t* x = reinterpret_cast<const uint16_t*>(a);
    const uint16_t* y = reinterpret_cast<const uint16_t*>(b);
    uint16_t* o = reinterpret_cast<uint16_t*>(out);
    for (int h = 0; h < 2; ++h) {
      const uint16x8_t u = vld1q_u16(x + 8 * h), v = vld1q_u16(y + 8 * h);
      vst1q_u16(o + 16 * h, vzip1q_u16(u, v));
      vst1q_u16(o + 16 * h + 8, vzip2q_u16(u, v));
    }
  }
  // dot(a, b) over n values: four independent BFDOT chains, 32 values per step
  static float dot_bf16(const bf16* a, const bf16* b, int64_t n) {
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc[u] = vbfdotq_f32(acc[u], ld_bf16(a + i + 8 * u), ld_bf16(b + i + 8 * u));
    }
    for (int u = 0; i + 8 <= n; i += 8, ++u) acc[u] = vbfdotq_f32(acc[u], ld_bf16(a + i), ld_bf16(b + i));
    if (i < n) acc[3] = vbfdotq_f32(acc[3], ld_bf16_n(a + i, n - i), ld_bf16_n(b + i, n - i));
    return vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
  }
  template <bool kTail>
  static bfloat16x8_t ld_step(const bf16* p, int64_t n) {
    if constexpr (kTail) {
      return ld_bf16_n(p, n);
    } else {
      return ld_bf16(p);
    }
  }
  // acc[i][r] += x row i . weight row r over the 8 values at j (n < 8 of them with kTail)
  template <int MR, bool kTail = false>
  static void tile_step(float32x4_t (&acc)[MR][4], const bf16* x, int64_t xs, const bf16* const (&wr)[4], int64_t j,
                        int64_t n = 8) {
    bfloat16x8_t wv[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) wv[r] = ld_step<kTail>(wr[r] + j, n);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const bfloat16x8_t xv = ld_step<kTail>(x + i * xs + j, n);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) acc[i][r] = vbfdotq_f32(acc[i][r], xv, wv[r]);
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
    float32x4_t acc[kSets][MR][4];
    for (int s = 0; s < kSets; ++s)
      for (int i = 0; i < MR; ++i)
        for (int r = 0; r < 4; ++r) acc[s][i][r] = vdupq_n_f32(0.0f);
    int64_t j = 0;
    for (; j + 32 <= k; j += 32) {  // 64 bytes of each weight row: one prefetch per row
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) prefetch_stream(wr[r] + j);
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) tile_step<MR>(acc[u % kSets], x, xs, wr, j + 8 * u);
    }
    for (; j + 8 <= k; j += 8) tile_step<MR>(acc[0], x, xs, wr, j);
    if (j < k) tile_step<MR, true>(acc[0], x, xs, wr, j, k - j);
    for (int i = 0; i < MR; ++i)
      for (int64_t r = 0; r < nr; ++r) {
        float32x4_t a = acc[0][i][r];
        for (int s = 1; s < kSets; ++s) a = vaddq_f32(a, acc[s][i][r]);
        res[i * 4 + r] = vaddvq_f32(a);
      }
  }
#else
  static float dot_bf16(const bf16*, const bf16*, int64_t) { return 0.0f; }
#endif
};

}  // namespace
}  // namespace anycore
