// AVX-512 variant using AVX512_BF16 (VCVTNEPS2BF16, VDPBF16PS); needs avx512_bf16 + avx512_vnni.
#define ANYCORE_AVX512_BF16 1
#include <type_traits>

#include "vec_avx512.h"
#include "../common/kernels_impl.h"

ANYCORE_DEFINE_TABLE(avx512_bf16, VecAvx512)
