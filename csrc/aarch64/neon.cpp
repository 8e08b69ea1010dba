// Advanced SIMD variant (every AArch64 CPU has it; see platform/selection.py).
#include "vec_neon.h"
#include "../common/kernels_impl.h"

ANYCORE_DEFINE_TABLE(neon, VecNeon)
