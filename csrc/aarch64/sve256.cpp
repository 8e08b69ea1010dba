// Fixed-length SVE variant for 256-bit vectors (Neoverse V1 class: Graviton3): every op of
// common/kernels_impl.h, paged_attention and the bf16 linear included, over VecSve256
// (vec_sve256.h; SVE BFDOT for bf16 dot products). Needs sve + bf16 + svebf16 and a 256-bit
// vector length (the `sve256` pseudo-flag): on another length it would give wrong results, not
// SIGILL, so selection must never bind it there. Other SVE lengths keep the vector-length-
// agnostic `sve` variant (element-wise ops) and neon/neon_bf16.
#include "vec_sve256.h"
#include "../common/kernels_impl.h"

ANYCORE_DEFINE_TABLE(sve256, VecSve256)
