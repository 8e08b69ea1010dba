// AVX-512 F/BW/VL variant; bf16 conversions done with integer ops.
#include <type_traits>

#include "vec_avx512.h"
#include "../common/kernels_impl.h"

ANYCORE_DEFINE_TABLE(avx512, VecAvx512)
