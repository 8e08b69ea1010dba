// Armv8.2 dot-product variant: the W8A8 INT8 linear on SDOT (needs asimddp; Neoverse N1 and
// later, Apple M1, Cortex-A55/A76+). Other ops are null here: selection keeps them on neon/sve.
// Activations and weights are both signed int8, so SDOT gives the exact accumulator directly.
#include <arm_neon.h>

#include "../common/int8_impl.h"
#include "../common/gguf_impl.h"

namespace anycore {
namespace {

// 4 rows x 16 columns: 16 accumulators (4 columns each) + 4 activation + 4 weight registers.
// Weight groups are [16 columns][4 K] (64 bytes = 4 registers); one 16-byte activation load per
// row covers 4 groups, SDOT's lane index picking the group.
struct DotprodMicro {
  static constexpr int kGroup = 4, kKAlign = 16, kActOffset = 0, kMR = 4, kNP = 1;
  static constexpr bool kColSums = false, kActPairs = false;
  static constexpr int kRowAlign = 1;

  template <int R, int P>
  static void tile(const int8_t* a, int64_t kp, const int8_t* w, int64_t /*ps*/, int32_t* c) {
    static_assert(P == 1, "one panel per tile");
    int32x4_t acc[R][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) acc[r][q] = vdupq_n_s32(0);
    for (int64_t kk = 0; kk < kp; kk += 16) {
      int8x16_t av[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) av[r] = vld1q_s8(a + r * kp + kk);
      const int8_t* wg = w + kk * kI8Panel;  // 4 groups of 64 bytes
      // the panel is one linear stream (kNP = 1): keep fills in flight ahead of it (decode GEMV)
      prefetch_stream(wg);
      prefetch_stream(wg + 64);
      prefetch_stream(wg + 128);
      prefetch_stream(wg + 192);
#define ANYCORE_SDOT_GROUP(L)                                                        \
  {                                                                                  \
    const int8x16_t w0 = vld1q_s8(wg + (L) * 64), w1 = vld1q_s8(wg + (L) * 64 + 16); \
    const int8x16_t w2 = vld1q_s8(wg + (L) * 64 + 32), w3 = vld1q_s8(wg + (L) * 64 + 48); \
    for (int r = 0; r < R; ++r) {                                                    \
      acc[r][0] = vdotq_laneq_s32(acc[r][0], w0, av[r], L);                          \
      acc[r][1] = vdotq_laneq_s32(acc[r][1], w1, av[r], L);                          \
      acc[r][2] = vdotq_laneq_s32(acc[r][2], w2, av[r], L);                          \
      acc[r][3] = vdotq_laneq_s32(acc[r][3], w3, av[r], L);                          \
    }                                                                                \
  }
      ANYCORE_SDOT_GROUP(0)
      ANYCORE_SDOT_GROUP(1)
      ANYCORE_SDOT_GROUP(2)
      ANYCORE_SDOT_GROUP(3)
#undef ANYCORE_SDOT_GROUP
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) vst1q_s32(c + r * kI8Panel + 4 * q, acc[r][q]);
  }
};

// GGUF blocks (anycore/kernels/gguf.py) on SDOT: a block's 32 weights are two 16-byte vectors
// (Q4: low and high nibbles, 0..15 as signed bytes; Q8_0: the int8 values), two SDOTs per
// activation row into 4 int32 lanes, scaled and summed in fp32 lanes.
struct GgufDotprodMicro {
  // Q5_0 and the K-quants: each 32-weight (sub-)block unpacked by gguf_decode32 (portable C++,
  // kernel_table.h) into int8 (Q5 0..31, Q6_K -32..31: all fit), then SDOT per half of 16, each
  // half scaled by its own scale (they differ only in Q6_K).
  template <int R, int QT>
  static void dot_sub(const uint8_t* w, int64_t nb, const int8_t* qx, int64_t k, const float* dx, const float* sx,
                      float* out) {
    float32x4_t acc[R];
    float corr[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = vdupq_n_f32(0.0f), corr[r] = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      int32_t q[kGgufBlock];
      int8_t q8[kGgufBlock];
      float s[2], mw;
      gguf_decode32(w, QT, b, q, s, &mw);
      for (int i = 0; i < kGgufBlock; ++i) q8[i] = static_cast<int8_t>(q[i]);
      const int8x16_t lo = vld1q_s8(q8), hi = vld1q_s8(q8 + 16);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = qx + r * k + b * kGgufBlock;
        const int32x4_t slo = vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(xr));
        const int32x4_t shi = vdotq_s32(vdupq_n_s32(0), hi, vld1q_s8(xr + 16));
        acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(slo), s[0] * dx[r * nb + b]);
        acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(shi), s[1] * dx[r * nb + b]);
        corr[r] += mw * sx[r * nb + b];
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) out[r] = vaddvq_f32(acc[r]) + corr[r];
  }

  template <int R, int QT>
  static void dot(const uint8_t* w, int64_t nb, const int8_t* qx, int64_t k, const float* dx, const float* sx,
                  float* out) {
    if constexpr (QT == kGgufQ5_0 || gguf_is_k(QT)) {
      dot_sub<R, QT>(w, nb, qx, k, dx, sx, out);
      return;
    }
    constexpr int64_t bb = gguf_block_bytes(QT);
    float32x4_t acc[R];
    float corr[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = vdupq_n_f32(0.0f), corr[r] = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * bb;
      const float dw = gguf_half(blk);
      const float mw = QT == kGgufQ4_1 ? gguf_half(blk + 2) : QT == kGgufQ4_0 ? -8.0f * dw : 0.0f;
      int8x16_t lo, hi;
      if (QT == kGgufQ8_0) {
        lo = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 2));
        hi = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 18));
      } else {
        const uint8x16_t raw = vld1q_u8(blk + (QT == kGgufQ4_1 ? 4 : 2));
        lo = vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F)));
        hi = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = qx + r * k + b * kGgufBlock;
        const int32x4_t s = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(xr)), hi, vld1q_s8(xr + 16));
        acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(s), dw * dx[r * nb + b]);
        if (QT != kGgufQ8_0) corr[r] += mw * sx[r * nb + b];
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) out[r] = vaddvq_f32(acc[r]) + corr[r];
  }
};

}  // namespace

extern const KernelTable kTable_dotprod;
constexpr KernelTable kTable_dotprod =
    int8_only_table("dotprod", ANYCORE_INT8_KERNELS(DotprodMicro), ANYCORE_GGUF_KERNELS(GgufDotprodMicro));

}  // namespace anycore
