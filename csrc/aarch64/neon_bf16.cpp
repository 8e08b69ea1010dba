// Advanced SIMD + BF16 variant (FEAT_BF16: needs asimd + bf16; Neoverse N2/V1/V2, Graviton3/4,
// Grace, Cortex-A510/A710+, Apple M2+): the neon code with BFDOT bf16 dot products for linear
// and the attention q.k dot (see vec_neon.h). Ranked between neon and sve (platform/selection.py).
#define ANYCORE_NEON_BF16 1
#include "vec_neon.h"
#include "../common/kernels_impl.h"

ANYCORE_DEFINE_TABLE(neon_bf16, VecNeon)
