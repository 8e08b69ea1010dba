// Armv8.6 int8 matrix-multiply variant: the W8A8 INT8 linear on SMMLA (needs i8mm; Neoverse
// V1/N2/V2, Cortex-A510/A710+, Apple M2+). Other ops are null here.
//
// SMMLA multiplies a 2x8 int8 block (two activation rows) by the transpose of another (two
// weight columns) into a 2x2 int32 block: weights are packed with G = 8 (byte(n, k) =
// panel + (k / 8) * 128 + (n % 16) * 8 + k % 8, i.e. column pairs of 16 bytes) and activations
// as row pairs interleaved in 8-byte chunks. One row (decode) pairs with a zero row: half the
// MACs are wasted, the weight stream is what bounds it there anyway.
#include <arm_neon.h>

#include "../common/int8_impl.h"

namespace anycore {
namespace {

// 4 rows (2 pairs) x 16 columns (8 pairs): 16 accumulators + 2 activation + weight registers.
struct I8mmMicro {
  static constexpr int kGroup = 8, kKAlign = 8, kActOffset = 0, kMR = 4, kNP = 1;
  static constexpr bool kColSums = false, kActPairs = true;
  static constexpr int kRowAlign = 2;

  template <int R, int P>
  static void tile(const int8_t* a, int64_t kp, const int8_t* w, int64_t /*ps*/, int32_t* c) {
    static_assert(P == 1, "one panel per tile");
    constexpr int RP = (R + 1) / 2;
    int32x4_t acc[RP][8];
#pragma GCC unroll 2
    for (int q = 0; q < RP; ++q)
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) acc[q][j] = vdupq_n_s32(0);
    for (int64_t kb = 0; kb < kp / 8; ++kb) {
      int8x16_t av[RP];
#pragma GCC unroll 2
      for (int q = 0; q < RP; ++q) av[q] = vld1q_s8(a + q * 2 * kp + kb * 16);
      const int8_t* wb = w + kb * 128;
      prefetch_stream(wb);  // one linear stream per panel (kNP = 1), two lines per step
      prefetch_stream(wb + 64);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const int8x16_t wv = vld1q_s8(wb + j * 16);
#pragma GCC unroll 2
        for (int q = 0; q < RP; ++q) acc[q][j] = vmmlaq_s32(acc[q][j], av[q], wv);
      }
    }
    // acc[q][j] = [row 2q: col 2j, 2j+1 | row 2q+1: col 2j, 2j+1]
#pragma GCC unroll 2
    for (int q = 0; q < RP; ++q)
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        vst1_s32(c + (2 * q) * kI8Panel + 2 * j, vget_low_s32(acc[q][j]));
        if (2 * q + 1 < R) vst1_s32(c + (2 * q + 1) * kI8Panel + 2 * j, vget_high_s32(acc[q][j]));
      }
  }
};

}  // namespace

extern const KernelTable kTable_i8mm;
constexpr KernelTable kTable_i8mm = int8_only_table("i8mm", ANYCORE_INT8_KERNELS(I8mmMicro));

}  // namespace anycore
