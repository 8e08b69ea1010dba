// AVX-512 VNNI variant: the W8A8 INT8 linear on VPDPBUSD (needs avx512f/bw/vl + avx512_vnni;
// Cascade Lake and later, Zen 4). Other ops are null here: selection keeps them elsewhere.
// The kernel and its unsigned-activation correction are in vnni_micro.h.
#include "vnni_micro.h"

namespace anycore {
namespace {
using VnniMicro = VnniMicroT<4, 1>;
}  // namespace

extern const KernelTable kTable_avx512_vnni;
constexpr KernelTable kTable_avx512_vnni = int8_only_table("avx512_vnni", ANYCORE_INT8_KERNELS(VnniMicro));

}  // namespace anycore
