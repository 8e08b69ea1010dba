// AVX2 + FMA + F16C variant (Haswell and later, Zen); see platform/selection.py.
#include "vec_avx2.h"
#include "../common/kernels_impl.h"

ANYCORE_DEFINE_TABLE(avx2, VecAvx2)
