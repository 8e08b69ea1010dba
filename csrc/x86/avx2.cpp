// The portable kernels compiled with -mavx2 -mfma -mf16c (see platform/selection.py).
#include "../common/vec_generic.h"
#include "../common/kernels_impl.h"

ANYCORE_DEFINE_TABLE(avx2, VecGeneric)
