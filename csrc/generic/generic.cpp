// Portable variant at the architecture's baseline ISA: runs on every CPU of the architecture.
#include "../common/vec_generic.h"
#include "../common/kernels_impl.h"
#include "../common/int8_impl.h"
#include "../common/gguf_impl.h"

namespace anycore {
namespace {

// W8A8 micro-kernel in plain C++: weight panels [k][16 columns] (G = 1), so each step is a
// 16-wide int32 multiply-add of one activation byte by 16 weight bytes; compilers vectorise it.
struct GenericI8Micro {
  static constexpr int kGroup = 1, kKAlign = 1, kActOffset = 0, kMR = 4, kNP = 1;
  static constexpr bool kColSums = false, kActPairs = false;
  static constexpr int kRowAlign = 1;

  template <int R, int P>
  static void tile(const int8_t* a, int64_t kp, const int8_t* w, int64_t /*ps*/, int32_t* c) {
    static_assert(P == 1, "one panel per tile");
    int32_t acc[R][kI8Panel] = {};
    for (int64_t kk = 0; kk < kp; ++kk) {
      const int8_t* wr = w + kk * kI8Panel;
      for (int r = 0; r < R; ++r) {
        const int32_t av = a[r * kp + kk];
        for (int j = 0; j < kI8Panel; ++j) acc[r][j] += av * wr[j];
      }
    }
    for (int r = 0; r < R; ++r) std::memcpy(c + r * kI8Panel, acc[r], sizeof(acc[r]));
  }
};

}  // namespace
}  // namespace anycore

ANYCORE_DEFINE_TABLE(generic, VecGeneric, ANYCORE_INT8_KERNELS(GenericI8Micro), ANYCORE_GGUF_KERNELS(GgufScalarMicro))
