// Portable 16-lane fp32 "vector": plain loops the compiler vectorises for whatever ISA flags
// the including translation unit is built with (baseline, AVX2, Neon). Same interface as the
// intrinsic vectors (x86/vec_avx512.h, aarch64/vec_neon.h) used by common/kernels_impl.h.
#pragma once
#include <cstdint>
#include <cstring>

#include "bf16.h"

namespace anycore {
namespace {

// exp(x) for x in roughly [-87, 88] (clamped), ~1e-7 relative error; branch-free so loops of
// it vectorise. Range reduction x = n*ln2 + r, degree-6 polynomial in r, times 2^n.
inline float exp_poly(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  float fn = x * 1.44269504088896341f;
  int32_t n = static_cast<int32_t>(fn + (fn >= 0.0f ? 0.5f : -0.5f));
  float nf = static_cast<float>(n);
  float r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  uint32_t bits = static_cast<uint32_t>(n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

struct VecGeneric {
  static constexpr int W = 16;
  static constexpr bool kBf16Dot = false;
  static constexpr bool kBf16Tile = false;
  float v[W];

  static VecGeneric set1(float a) {
    VecGeneric r;
    for (int i = 0; i < W; ++i) r.v[i] = a;
    return r;
  }
  static VecGeneric zero() { return set1(0.0f); }
  static VecGeneric load(const float* p) {
    VecGeneric r;
    std::memcpy(r.v, p, sizeof(r.v));
    return r;
  }
  static VecGeneric load(const bf16* p) {
    VecGeneric r;
    for (int i = 0; i < W; ++i) r.v[i] = bf16_to_float(p[i]);
    return r;
  }
  template <typename T>
  static VecGeneric load_n(const T* p, int n) {
    VecGeneric r = zero();
    for (int i = 0; i < n; ++i) r.v[i] = to_float(p[i]);
    return r;
  }
  void store(float* p) const { std::memcpy(p, v, sizeof(v)); }
  void store(bf16* p) const {
    for (int i = 0; i < W; ++i) p[i] = float_to_bf16(v[i]);
  }
  template <typename T>
  void store_n(T* p, int n) const {
    for (int i = 0; i < n; ++i) p[i] = from_float<T>(v[i]);
  }
#define ANYCORE_BINOP(op)                                  \
  VecGeneric operator op(const VecGeneric& o) const {      \
    VecGeneric r;                                          \
    for (int i = 0; i < W; ++i) r.v[i] = v[i] op o.v[i];   \
    return r;                                              \
  }
  ANYCORE_BINOP(+)
  ANYCORE_BINOP(-)
  ANYCORE_BINOP(*)
  ANYCORE_BINOP(/)
#undef ANYCORE_BINOP
  static VecGeneric fma(const VecGeneric& a, const VecGeneric& b, const VecGeneric& c) {
    VecGeneric r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] * b.v[i] + c.v[i];
    return r;
  }
  static VecGeneric max(const VecGeneric& a, const VecGeneric& b) {
    VecGeneric r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
    return r;
  }
  float sum() const {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < W; ++i) s += v[i];
    return s;
  }
  float hmax() const {
    float m = v[0];
    for (int i = 1; i < W; ++i) m = v[i] > m ? v[i] : m;
    return m;
  }
  VecGeneric exp() const {
    VecGeneric r;
    for (int i = 0; i < W; ++i) r.v[i] = exp_poly(v[i]);
    return r;
  }
  VecGeneric recip() const {
    VecGeneric r;
    for (int i = 0; i < W; ++i) r.v[i] = 1.0f / v[i];
    return r;
  }
  VecGeneric round_bf16() const {
    VecGeneric r;
    for (int i = 0; i < W; ++i) r.v[i] = round_to_bf16(v[i]);
    return r;
  }
  static float dot_bf16(const bf16*, const bf16*, int64_t) { return 0.0f; }
};

}  // namespace
}  // namespace anycore
