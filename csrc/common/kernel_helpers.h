// What every kernel family over a vector type V (16 fp32 lanes or fewer) and a storage type T
// (float or bf16) shares: bf16 rounding and tail-safe loads/stores. Internal linkage, like all
// kernel code: each ISA translation unit keeps the code its own flags produced.
#pragma once
#include <cstdint>
#include <type_traits>

#include "bf16.h"

namespace anycore {
namespace {

template <typename T>
constexpr bool kIsBf16 = std::is_same_v<T, bf16>;

template <typename V, typename T>
inline V round_if_bf16(const V& x) {
  if constexpr (kIsBf16<T>) {
    return x.round_bf16();
  } else {
    return x;
  }
}

template <typename V, typename T>
inline V load_any(const T* p, int64_t n) {
  return n >= V::W ? V::load(p) : V::template load_n<T>(p, static_cast<int>(n));
}

template <typename V, typename T>
inline void store_any(const V& x, T* p, int64_t n) {
  if (n >= V::W) {
    x.store(p);
  } else {
    x.template store_n<T>(p, static_cast<int>(n));
  }
}

}  // namespace
}  // namespace anycore
