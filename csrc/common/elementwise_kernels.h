// The element-wise ops over a vector type V and a storage type T (ANYCORE_ELEMENTWISE_KERNELS in
// kernel_table.h): RMSNorm, fused residual add + RMSNorm, rotary embedding, SiLU-and-mul, and
// Gemma's (1 + w) RMSNorm and tanh-GELU-and-mul (GeGLU).
//
// Numerics follow anycore/kernels/reference.py: math in fp32, and for bf16 the same
// intermediate roundings the reference's torch ops perform (so results match to ~1 ulp).
#pragma once
#include <cmath>
#include <cstdint>

#include "kernel_helpers.h"
#include "parallel.h"

namespace anycore {
namespace {

// Parallel grain: rows per thread such that each gets >= ~32k elements of work.
inline int64_t row_grain(int64_t cols) { return 1 + (32768 / (cols > 0 ? cols : 1)); }

template <typename V, typename T>
inline void norm_row(T* out, const T* x, const T* w, int64_t cols, float sumsq, float eps) {
  V r = V::set1(1.0f / std::sqrt(sumsq / static_cast<float>(cols) + eps));
  for (int64_t i = 0; i < cols; i += V::W) {
    int64_t n = cols - i;
    V y = round_if_bf16<V, T>(load_any<V>(x + i, n) * r) * load_any<V>(w + i, n);
    store_any(y, out + i, n);
  }
}

// Gemma's row: x * r * (1 + w) all in fp32, rounded once to T (HF Gemma3RMSNorm: the weight is
// stored zero-centred and the cast comes after the scale, unlike Llama's).
template <typename V, typename T>
inline void gemma_norm_row(T* out, const T* x, const T* w, int64_t cols, float sumsq, float eps) {
  const V r = V::set1(1.0f / std::sqrt(sumsq / static_cast<float>(cols) + eps)), one = V::set1(1.0f);
  for (int64_t i = 0; i < cols; i += V::W) {
    int64_t n = cols - i;
    store_any(load_any<V>(x + i, n) * r * (one + load_any<V>(w + i, n)), out + i, n);
  }
}

template <typename V, typename T>
inline float sum_squares(const T* x, int64_t cols) {
  V acc0 = V::zero(), acc1 = V::zero();
  int64_t i = 0;
  for (; i + 2 * V::W <= cols; i += 2 * V::W) {
    V a = V::load(x + i), b = V::load(x + i + V::W);
    acc0 = V::fma(a, a, acc0);
    acc1 = V::fma(b, b, acc1);
  }
  for (; i < cols; i += V::W) {
    V a = load_any<V>(x + i, cols - i);
    acc0 = V::fma(a, a, acc0);
  }
  return (acc0 + acc1).sum();
}

// Every row of x through Row (norm_row or gemma_norm_row), with its sum of squares.
template <typename V, typename T, void (*Row)(T*, const T*, const T*, int64_t, float, float)>
void norm_rows(void* out_, const void* x_, int64_t xs, const void* w_, int64_t rows, int64_t cols, float eps) {
  T* out = static_cast<T*>(out_);
  const T* x = static_cast<const T*>(x_);
  const T* w = static_cast<const T*>(w_);
  parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) Row(out + r * cols, x + r * xs, w, cols, sum_squares<V, T>(x + r * xs, cols), eps);
  });
}

template <typename V, typename T>
void rms_norm_kernel(void* out, const void* x, int64_t xs, const void* w, int64_t rows, int64_t cols, float eps) {
  norm_rows<V, T, &norm_row<V, T>>(out, x, xs, w, rows, cols, eps);
}

template <typename V, typename T>
void gemma_rms_norm_kernel(void* out, const void* x, int64_t xs, const void* w, int64_t rows, int64_t cols,
                           float eps) {
  norm_rows<V, T, &gemma_norm_row<V, T>>(out, x, xs, w, rows, cols, eps);
}

template <typename V, typename T>
void add_rms_norm_kernel(void* out_, void* sum_, const void* x_, int64_t xs, const void* res_, int64_t rs,
                         const void* w_, int64_t rows, int64_t cols, float eps) {
  T* out = static_cast<T*>(out_);
  T* sum = static_cast<T*>(sum_);
  const T* x = static_cast<const T*>(x_);
  const T* res = static_cast<const T*>(res_);
  const T* w = static_cast<const T*>(w_);
  parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * xs;
      const T* rr = res + r * rs;
      T* sr = sum + r * cols;
      V acc = V::zero();
      for (int64_t i = 0; i < cols; i += V::W) {
        int64_t n = cols - i;
        V s = round_if_bf16<V, T>(load_any<V>(xr + i, n) + load_any<V>(rr + i, n));
        store_any(s, sr + i, n);
        acc = V::fma(s, s, acc);
      }
      norm_row<V, T>(out + r * cols, sr, w, cols, acc.sum(), eps);
    }
  });
}

template <typename V, typename T>
void rotary_kernel(void* out_, const void* x_, int64_t xs, const float* cos, const float* sin, int64_t cs,
                   int64_t rows, int64_t heads, int64_t head_dim) {
  T* out = static_cast<T*>(out_);
  const T* x = static_cast<const T*>(x_);
  const int64_t half = head_dim / 2;
  parallel_for(rows, row_grain(heads * head_dim), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* c = cos + r * cs;
      const float* s = sin + r * cs;
      for (int64_t h = 0; h < heads; ++h) {
        const T* xh = x + r * xs + h * head_dim;
        T* oh = out + (r * heads + h) * head_dim;
        for (int64_t j = 0; j < half; j += V::W) {
          int64_t n = half - j;
          V x1 = load_any<V>(xh + j, n), x2 = load_any<V>(xh + half + j, n);
          V c1 = round_if_bf16<V, T>(load_any<V>(c + j, n));
          V c2 = round_if_bf16<V, T>(load_any<V>(c + half + j, n));
          V s1 = round_if_bf16<V, T>(load_any<V>(s + j, n));
          V s2 = round_if_bf16<V, T>(load_any<V>(s + half + j, n));
          // reference: x * cos + rotate_half(x) * sin, each product rounded to T
          V o1 = round_if_bf16<V, T>(x1 * c1) - round_if_bf16<V, T>(x2 * s1);
          V o2 = round_if_bf16<V, T>(x2 * c2) + round_if_bf16<V, T>(x1 * s2);
          store_any(o1, oh + j, n);
          store_any(o2, oh + half + j, n);
        }
      }
    }
  });
}

template <typename V, typename T>
void silu_and_mul_kernel(void* out_, const void* x_, int64_t xs, int64_t rows, int64_t d) {
  T* out = static_cast<T*>(out_);
  const T* x = static_cast<const T*>(x_);
  const V one = V::set1(1.0f), zero = V::zero();
  parallel_for(rows, row_grain(d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * xs;
      T* orow = out + r * d;
      for (int64_t j = 0; j < d; j += V::W) {
        int64_t n = d - j;
        V a = load_any<V>(xr + j, n), b = load_any<V>(xr + d + j, n);
        V act = round_if_bf16<V, T>(a * (one + (zero - a).exp()).recip());
        store_any(act * b, orow + j, n);
      }
    }
  });
}

// GeGLU with transformers' gelu_pytorch_tanh: 0.5 a (1 + tanh(u)), u = sqrt(2/pi) (a + 0.044715 a^3),
// written as a / (1 + exp(-2u)) (the same function; exp saturates, so no inf / inf at either end).
// As the reference: the activation rounded to T, then the product.
template <typename V, typename T>
void gelu_tanh_and_mul_kernel(void* out_, const void* x_, int64_t xs, int64_t rows, int64_t d) {
  T* out = static_cast<T*>(out_);
  const T* x = static_cast<const T*>(x_);
  const V one = V::set1(1.0f);
  const V c0 = V::set1(-1.5957691216057308f);               // -2 sqrt(2/pi)
  const V c1 = V::set1(-1.5957691216057308f * 0.044715f);   // -2 sqrt(2/pi) 0.044715
  parallel_for(rows, row_grain(d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * xs;
      T* orow = out + r * d;
      for (int64_t j = 0; j < d; j += V::W) {
        int64_t n = d - j;
        V a = load_any<V>(xr + j, n), b = load_any<V>(xr + d + j, n);
        V minus_2u = a * V::fma(c1, a * a, c0);
        V act = round_if_bf16<V, T>(a * (one + minus_2u.exp()).recip());
        store_any(act * b, orow + j, n);
      }
    }
  });
}

}  // namespace
}  // namespace anycore
