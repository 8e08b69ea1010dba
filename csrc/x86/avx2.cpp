// AVX2 + FMA + F16C variant (Haswell and later, Zen); see platform/selection.py. Also the GGUF
// block linear (gguf_avx2.h), for x86 CPUs without AVX-512 VNNI.
#include "vec_avx2.h"
#include "../common/kernels_impl.h"
#include "gguf_avx2.h"

ANYCORE_DEFINE_TABLE(avx2, VecAvx2, ::anycore::Int8Kernels{}, ANYCORE_GGUF_KERNELS(GgufAvx2Micro))
