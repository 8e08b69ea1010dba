// bfloat16 storage type and scalar conversions (round-to-nearest-even, quiet NaN kept).
// Plain C++: no torch headers, so every ISA translation unit can include it cheaply.
#pragma once
#include <cstdint>
#include <cstring>

namespace anycore {

struct bf16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2, "bf16 must be 2 bytes");

inline float bf16_to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

inline float to_float(float v) { return v; }
inline float to_float(bf16 v) { return bf16_to_float(v); }

template <typename T>
inline T from_float(float v);
template <>
inline float from_float<float>(float v) { return v; }
template <>
inline bf16 from_float<bf16>(float v) { return float_to_bf16(v); }

}  // namespace anycore
