// Every op of ANYCORE_VECTOR_KERNELS (kernel_table.h) written once over a vector type V, by
// family, and the table a vector variant makes of them. Included by each ISA translation unit
// after it defines its V; everything here has internal linkage so each unit keeps the code its
// own flags produced.
#pragma once
#include "attention_kernels.h"
#include "bf16.h"
#include "elementwise_kernels.h"
#include "gemv_kernels.h"
#include "kernel_table.h"

namespace anycore {
namespace {

// Every kernel of ANYCORE_VECTOR_KERNELS instantiated over V, plus the optional int8 kernels.
template <typename V>
constexpr KernelTable vector_table(const char* name, Int8Kernels int8 = {}, GgufKernels gguf = {}) {
  KernelTable t{};
  t.name = name;
#define ANYCORE_SET_KERNELS(FIELD, FN, KERNEL) t.FIELD[0] = &KERNEL<V, float>, t.FIELD[1] = &KERNEL<V, bf16>;
  ANYCORE_VECTOR_KERNELS(ANYCORE_SET_KERNELS)
#undef ANYCORE_SET_KERNELS
  t.int8 = int8;
  t.gguf = gguf;
  return t;
}

}  // namespace
}  // namespace anycore

// Defines the variant's exported table, the only external symbol of an ISA translation unit;
// constexpr, so it is constant-initialised (no code runs when the library loads). The optional
// argument is the variant's Int8Kernels (ANYCORE_INT8_KERNELS, int8_impl.h).
#define ANYCORE_DEFINE_TABLE(NAME, V, ...)                                              \
  namespace anycore {                                                                 \
  extern const KernelTable kTable_##NAME;                                             \
  constexpr KernelTable kTable_##NAME = vector_table<V>(#NAME, ##__VA_ARGS__);          \
  }
