// SVE variant, vector-length agnostic (predicated loops, any 128..2048-bit length). Covers the
// element-wise ops; paged_attention is left null here and selection keeps it on neon.
#include <arm_sve.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../common/bf16.h"
#include "../common/kernel_table.h"
#include "../common/parallel.h"

namespace anycore {
namespace {

inline svfloat32_t ld(svbool_t pg, const float* p) { return svld1_f32(pg, p); }
inline svfloat32_t ld(svbool_t pg, const bf16* p) {
  svuint32_t u = svld1uh_u32(pg, reinterpret_cast<const uint16_t*>(p));
  return svreinterpret_f32_u32(svlsl_n_u32_x(pg, u, 16));
}
// fp32 -> bf16 bits in the low half of each lane (round to nearest even, NaN kept quiet)
inline svuint32_t bf16_bits(svbool_t pg, svfloat32_t v) {
  svuint32_t u = svreinterpret_u32_f32(v);
  svuint32_t hi = svlsr_n_u32_x(pg, u, 16);
  svuint32_t lsb = svand_n_u32_x(pg, hi, 1);
  svuint32_t r = svlsr_n_u32_x(pg, svadd_u32_x(pg, svadd_n_u32_x(pg, u, 0x7fff), lsb), 16);
  return svsel_u32(svcmpuo_f32(pg, v, v), svorr_n_u32_x(pg, hi, 0x40), r);
}
inline void st(svbool_t pg, float* p, svfloat32_t v) { svst1_f32(pg, p, v); }
inline void st(svbool_t pg, bf16* p, svfloat32_t v) {
  svst1h_u32(pg, reinterpret_cast<uint16_t*>(p), bf16_bits(pg, v));
}
template <typename T>
inline svfloat32_t round_t(svbool_t pg, svfloat32_t v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return svreinterpret_f32_u32(svlsl_n_u32_x(pg, bf16_bits(pg, v), 16));
  } else {
    return v;
  }
}

inline svfloat32_t sve_exp(svbool_t pg, svfloat32_t x) {
  // same reduction and polynomial as exp_poly() in common/vec_generic.h; 2^n via FSCALE
  x = svmin_n_f32_x(pg, svmax_n_f32_x(pg, x, -87.0f), 88.0f);
  svfloat32_t n = svrintn_f32_x(pg, svmul_n_f32_x(pg, x, 1.44269504088896341f));
  svfloat32_t r = svmls_n_f32_x(pg, x, n, 0.693359375f);
  r = svmla_n_f32_x(pg, r, n, 2.12194440e-4f);
  svfloat32_t p = svdup_n_f32(1.9875691500e-4f);
  p = svmla_f32_x(pg, svdup_n_f32(1.3981999507e-3f), p, r);
  p = svmla_f32_x(pg, svdup_n_f32(8.3334519073e-3f), p, r);
  p = svmla_f32_x(pg, svdup_n_f32(4.1665795894e-2f), p, r);
  p = svmla_f32_x(pg, svdup_n_f32(1.6666665459e-1f), p, r);
  p = svmla_f32_x(pg, svdup_n_f32(5.0000001201e-1f), p, r);
  p = svmla_f32_x(pg, svadd_n_f32_x(pg, r, 1.0f), svmul_f32_x(pg, p, r), r);
  return svscale_f32_x(pg, p, svcvt_s32_f32_x(pg, n));
}

inline int64_t row_grain(int64_t cols) { return 1 + (32768 / (cols > 0 ? cols : 1)); }

template <typename T>
inline void norm_row(T* out, const T* x, const T* w, int64_t cols, float sumsq, float eps) {
  const float r = 1.0f / std::sqrt(sumsq / static_cast<float>(cols) + eps);
  for (int64_t i = 0; i < cols; i += svcntw()) {
    svbool_t pg = svwhilelt_b32_s64(i, cols);
    svfloat32_t y = round_t<T>(pg, svmul_n_f32_x(pg, ld(pg, x + i), r));
    st(pg, out + i, svmul_f32_x(pg, y, ld(pg, w + i)));
  }
}

template <typename T>
void rms_norm_sve(void* out_, const void* x_, int64_t xs, const void* w_, int64_t rows, int64_t cols, float eps) {
  T* out = static_cast<T*>(out_);
  const T* x = static_cast<const T*>(x_);
  const T* w = static_cast<const T*>(w_);
  parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * xs;
      svfloat32_t acc = svdup_n_f32(0.0f);
      for (int64_t i = 0; i < cols; i += svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, cols);
        svfloat32_t a = ld(pg, xr + i);
        acc = svmla_f32_m(pg, acc, a, a);
      }
      norm_row<T>(out + r * cols, xr, w, cols, svaddv_f32(svptrue_b32(), acc), eps);
    }
  });
}

template <typename T>
void add_rms_norm_sve(void* out_, void* sum_, const void* x_, int64_t xs, const void* res_, int64_t rs,
                      const void* w_, int64_t rows, int64_t cols, float eps) {
  T* out = static_cast<T*>(out_);
  T* sum = static_cast<T*>(sum_);
  const T* x = static_cast<const T*>(x_);
  const T* res = static_cast<const T*>(res_);
  const T* w = static_cast<const T*>(w_);
  parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* sr = sum + r * cols;
      svfloat32_t acc = svdup_n_f32(0.0f);
      for (int64_t i = 0; i < cols; i += svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(i, cols);
        svfloat32_t s = round_t<T>(pg, svadd_f32_x(pg, ld(pg, x + r * xs + i), ld(pg, res + r * rs + i)));
        st(pg, sr + i, s);
        acc = svmla_f32_m(pg, acc, s, s);
      }
      norm_row<T>(out + r * cols, sr, w, cols, svaddv_f32(svptrue_b32(), acc), eps);
    }
  });
}

template <typename T>
void rotary_sve(void* out_, const void* x_, int64_t xs, const float* cos, const float* sin, int64_t cs,
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
        for (int64_t j = 0; j < half; j += svcntw()) {
          svbool_t pg = svwhilelt_b32_s64(j, half);
          svfloat32_t x1 = ld(pg, xh + j), x2 = ld(pg, xh + half + j);
          svfloat32_t c1 = round_t<T>(pg, ld(pg, c + j)), c2 = round_t<T>(pg, ld(pg, c + half + j));
          svfloat32_t s1 = round_t<T>(pg, ld(pg, s + j)), s2 = round_t<T>(pg, ld(pg, s + half + j));
          svfloat32_t o1 = svsub_f32_x(pg, round_t<T>(pg, svmul_f32_x(pg, x1, c1)),
                                       round_t<T>(pg, svmul_f32_x(pg, x2, s1)));
          svfloat32_t o2 = svadd_f32_x(pg, round_t<T>(pg, svmul_f32_x(pg, x2, c2)),
                                       round_t<T>(pg, svmul_f32_x(pg, x1, s2)));
          st(pg, oh + j, o1);
          st(pg, oh + half + j, o2);
        }
      }
    }
  });
}

template <typename T>
void silu_and_mul_sve(void* out_, const void* x_, int64_t xs, int64_t rows, int64_t d) {
  T* out = static_cast<T*>(out_);
  const T* x = static_cast<const T*>(x_);
  parallel_for(rows, row_grain(d), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * xs;
      for (int64_t j = 0; j < d; j += svcntw()) {
        svbool_t pg = svwhilelt_b32_s64(j, d);
        svfloat32_t a = ld(pg, xr + j), b = ld(pg, xr + d + j);
        svfloat32_t e = sve_exp(pg, svneg_f32_x(pg, a));
        svfloat32_t act = round_t<T>(pg, svdiv_f32_x(pg, a, svadd_n_f32_x(pg, e, 1.0f)));
        st(pg, out + r * d + j, svmul_f32_x(pg, act, b));
      }
    }
  });
}

// Only the element-wise ops (the sve Variant in platform/selection.py declares these four);
// every other entry null.
constexpr KernelTable sve_table() {
  KernelTable t{};
  t.name = "sve";
  t.rms_norm[0] = &rms_norm_sve<float>, t.rms_norm[1] = &rms_norm_sve<bf16>;
  t.add_rms_norm[0] = &add_rms_norm_sve<float>, t.add_rms_norm[1] = &add_rms_norm_sve<bf16>;
  t.apply_rotary[0] = &rotary_sve<float>, t.apply_rotary[1] = &rotary_sve<bf16>;
  t.silu_and_mul[0] = &silu_and_mul_sve<float>, t.silu_and_mul[1] = &silu_and_mul_sve<bf16>;
  return t;
}

}  // namespace

extern const KernelTable kTable_sve;
constexpr KernelTable kTable_sve = sve_table();

}  // namespace anycore
