// Portable variant at the architecture's baseline ISA: runs on every CPU of the architecture.
#include "../common/vec_generic.h"
#include "../common/kernels_impl.h"

ANYCORE_DEFINE_TABLE(generic, VecGeneric)
