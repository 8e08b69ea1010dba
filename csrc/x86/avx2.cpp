// AVX2 + FMA + F16C variant (Haswell and later, Zen); see platform/selection.py. Also the int8
// kernels of x86 CPUs without AVX-512 VNNI: the W8A8 linear (avx2_int8_micro.h) and the GGUF
// block linear (gguf_avx2.h), both on VPMADDUBSW.
#include "vec_avx2.h"
#include "../common/kernels_impl.h"
#include "avx2_int8_micro.h"
#include "gguf_avx2.h"

ANYCORE_DEFINE_TABLE(avx2, VecAvx2, ANYCORE_INT8_KERNELS(::anycore::Avx2Int8Micro), ANYCORE_GGUF_KERNELS(GgufAvx2Micro))
