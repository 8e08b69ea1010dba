// GGUF block-quantized linear (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K) once over an ISA micro-kernel M.
//
// The weight stays in the file's blocks (anycore/kernels/gguf.py): one output row is k / 32
// blocks of fp16 scale(s) + 16 nibble bytes (Q4) or 32 int8 (Q8_0), or k / 256 K-quant
// super-blocks of eight 32-weight sub-blocks (gguf_decode32, kernel_table.h). The activation row is
// quantized per 32-block into the workspace: int8 qx, fp32 dx = max|x| / 127 and
// sx = dx * sum(qx) (bit for bit the reference's fp32 arithmetic). Per block the micro-kernel
// takes the exact int32 sum(q * qx) in registers (VPDPBUSD, SDOT or plain C++), then
//   y += dw * dx * isum  (+ mw * sx: Q4_1's and the K-quants' minimum, Q4_0's -8 and Q5_0's -16 offsets)
// (Q6_K: isum per half of 16 weights, each half with its own scale dw).
// in fp32. Threads take chunks of output rows (guided, like the GEMV); each chunk runs every
// activation row in tiles of up to kGgufRows rows, so one decoded weight block serves the tile.
//
// Results are the same whatever the split of output rows between threads or calls (the decode
// team's chunks and the op's agree). Each weight row is read from its start to its end before
// the next (one sequential stream per thread): reading four rows side by side, four short
// streams, kept the prefetchers from ramping up (Q4_1 3072 x 576 on a 2-core AMD EPYC: 8.9 GB/s
// per core four rows at a time, 11.5 row by row).
// M provides `template <int R, int QT> static void dot(const uint8_t* w, int64_t nb,
// const int8_t* qx, int64_t k, const float* dx, const float* sx, float* out)`: the R activation
// rows (qx row r at qx + r * k, its scales at dx/sx + r * nb) against one weight row of nb
// blocks of type QT (nb 32-blocks: k / 32, also for the K-quants), out[r] = the block sum above (without bias).
#pragma once
#include <cstdint>
#include <cstring>

#include "bf16.h"
#include "kernel_table.h"
#include "parallel.h"

namespace anycore {
namespace {

constexpr int kGgufRows = 4;  // activation rows per tile (accumulators per row stay in registers)
constexpr int64_t kGgufRowGrain = 16;  // output rows per work chunk

inline float gguf_load(float v) { return v; }
inline float gguf_load(bf16 v) { return bf16_to_float(v); }

// One activation row -> qx (int8 [k]), dx, sx ([k / 32]); the reference's arithmetic exactly.
template <typename T>
void gguf_quantize_row(const T* x, int64_t k, int8_t* qx, float* dx, float* sx) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: (v + kMagic) - kMagic rounds half to even
  for (int64_t b = 0; b < k / kGgufBlock; ++b) {
    float v[kGgufBlock];
    float amax = 0.0f;
    for (int i = 0; i < kGgufBlock; ++i) {
      v[i] = gguf_load(x[b * kGgufBlock + i]);
      const float a = v[i] < 0.0f ? -v[i] : v[i];
      amax = a > amax ? a : amax;
    }
    const float d = (amax > 1e-12f ? amax : 1e-12f) / 127.0f;
    int32_t sum = 0;
    for (int i = 0; i < kGgufBlock; ++i) {
      float q = v[i] / d;
      q = (q + kMagic) - kMagic;
      q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
      const int32_t qi = static_cast<int32_t>(q);
      qx[b * kGgufBlock + i] = static_cast<int8_t>(qi);
      sum += qi;
    }
    dx[b] = d;
    sx[b] = d * static_cast<float>(sum);
  }
}

template <class M, int QT, int R>
void gguf_tile(const GgufArgs& a, const int8_t* qx, const float* dx, const float* sx, int64_t r0, int64_t n0,
               int64_t n1) {
  const int64_t k = a.k, nb = k / kGgufBlock, row_bytes = gguf_row_bytes(QT, k);
  const auto store = [&](int64_t j, int r, float y) {
    const int64_t at = (r0 + r) * a.n + j;
    y += a.bias ? a.bias[j] : 0.0f;
    if (a.out_type == 0)
      static_cast<float*>(a.out)[at] = y;
    else
      static_cast<bf16*>(a.out)[at] = float_to_bf16(y);
  };
  for (int64_t j = n0; j < n1; ++j) {
    float y[R];
    M::template dot<R, QT>(a.w + j * row_bytes, nb, qx + r0 * k, k, dx + r0 * nb, sx + r0 * nb, y);
    for (int r = 0; r < R; ++r) store(j, r, y[r]);
  }
}

template <class M, int QT>
void gguf_rows(const GgufArgs& a, const int8_t* qx, const float* dx, const float* sx, int64_t n0, int64_t n1) {
  for (int64_t r0 = 0; r0 < a.m; r0 += kGgufRows) {
    switch (a.m - r0 < kGgufRows ? a.m - r0 : kGgufRows) {
      case 1: gguf_tile<M, QT, 1>(a, qx, dx, sx, r0, n0, n1); break;
      case 2: gguf_tile<M, QT, 2>(a, qx, dx, sx, r0, n0, n1); break;
      case 3: gguf_tile<M, QT, 3>(a, qx, dx, sx, r0, n0, n1); break;
      default: gguf_tile<M, QT, 4>(a, qx, dx, sx, r0, n0, n1); break;
    }
  }
}

// The workspace's pieces for m rows of k (gguf_workspace_bytes).
struct GgufActs {
  int8_t* qx;
  float *dx, *sx;
  explicit GgufActs(const GgufArgs& a)
      : qx(static_cast<int8_t*>(a.workspace)),
        dx(reinterpret_cast<float*>(qx + a.m * a.k)),  // m * k is a multiple of 32: aligned
        sx(dx + a.m * (a.k / kGgufBlock)) {}
};

// Rows [r0, r1) of x quantized into the workspace.
inline void gguf_quantize_range(const GgufArgs& a, int64_t r0, int64_t r1) {
  const GgufActs w(a);
  const int64_t k = a.k, nb = k / kGgufBlock;
  for (int64_t r = r0; r < r1; ++r) {
    if (a.x_type == 0)
      gguf_quantize_row(static_cast<const float*>(a.x) + r * a.x_stride, k, w.qx + r * k, w.dx + r * nb, w.sx + r * nb);
    else
      gguf_quantize_row(static_cast<const bf16*>(a.x) + r * a.x_stride, k, w.qx + r * k, w.dx + r * nb, w.sx + r * nb);
  }
}

template <class M>
void gguf_quantize_rows_kernel(const GgufArgs& a) {
  gguf_quantize_range(a, 0, a.m);
}

// Output rows [n0, n1) of every activation row, from the quantized workspace.
template <class M>
void gguf_gemv_rows_kernel(const GgufArgs& a, int64_t n0, int64_t n1) {
  const GgufActs w(a);
  switch (a.qtype) {
    case kGgufQ4_0: gguf_rows<M, kGgufQ4_0>(a, w.qx, w.dx, w.sx, n0, n1); break;
    case kGgufQ4_1: gguf_rows<M, kGgufQ4_1>(a, w.qx, w.dx, w.sx, n0, n1); break;
    case kGgufQ5_0: gguf_rows<M, kGgufQ5_0>(a, w.qx, w.dx, w.sx, n0, n1); break;
    case kGgufQ4_K: gguf_rows<M, kGgufQ4_K>(a, w.qx, w.dx, w.sx, n0, n1); break;
    case kGgufQ5_K: gguf_rows<M, kGgufQ5_K>(a, w.qx, w.dx, w.sx, n0, n1); break;
    case kGgufQ6_K: gguf_rows<M, kGgufQ6_K>(a, w.qx, w.dx, w.sx, n0, n1); break;
    default: gguf_rows<M, kGgufQ8_0>(a, w.qx, w.dx, w.sx, n0, n1); break;
  }
}

template <class M>
void gguf_linear_kernel(const GgufArgs& a) {
  parallel_for(a.m, 4, [&](int64_t r0, int64_t r1) { gguf_quantize_range(a, r0, r1); });
  const int64_t chunks = (a.n + kGgufRowGrain - 1) / kGgufRowGrain;
  parallel_for_guided(chunks, 1, [&](int64_t c0, int64_t c1) {
    gguf_gemv_rows_kernel<M>(a, c0 * kGgufRowGrain, c1 * kGgufRowGrain < a.n ? c1 * kGgufRowGrain : a.n);
  });
}

// Weight rows [n0, n1) -> out [n, k] (fp32 or bf16), exactly as gguf_dequantize_block32 and the
// gguf package decode them. Written once, compiled per variant with the block type a constant,
// so the decode loops vectorize at the variant's width (the one-block-at-a-time generic form in
// ops.cpp took ~2.5 ms for a 3072 x 576 Q4_1 matrix on two Zen 4 cores).
template <int QT>
void gguf_dequantize_range(const GgufArgs& a, int64_t n0, int64_t n1) {
  const int64_t k = a.k, nb = k / kGgufBlock, row_bytes = gguf_row_bytes(QT, k);
  for (int64_t r = n0; r < n1; ++r) {
    const uint8_t* row = a.w + r * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      int32_t q[kGgufBlock];
      float s[2], mw, v[kGgufBlock];
      gguf_decode32(row, QT, b, q, s, &mw);
      for (int h = 0; h < 2; ++h)
        for (int i = 16 * h; i < 16 * h + 16; ++i) {
          const float scaled = s[h] * static_cast<float>(q[i]);  // (two statements: never fused)
          v[i] = scaled + mw;
        }
      const int64_t at = r * k + b * kGgufBlock;
      if (a.out_type == 0) {
        std::memcpy(static_cast<float*>(a.out) + at, v, sizeof(v));
      } else {
        bf16* dst = static_cast<bf16*>(a.out) + at;
        for (int i = 0; i < kGgufBlock; ++i) dst[i] = float_to_bf16(v[i]);
      }
    }
  }
}

template <class M>
void gguf_dequantize_rows_kernel(const GgufArgs& a, int64_t n0, int64_t n1) {
  switch (a.qtype) {
    case kGgufQ4_0: gguf_dequantize_range<kGgufQ4_0>(a, n0, n1); break;
    case kGgufQ4_1: gguf_dequantize_range<kGgufQ4_1>(a, n0, n1); break;
    case kGgufQ5_0: gguf_dequantize_range<kGgufQ5_0>(a, n0, n1); break;
    case kGgufQ4_K: gguf_dequantize_range<kGgufQ4_K>(a, n0, n1); break;
    case kGgufQ5_K: gguf_dequantize_range<kGgufQ5_K>(a, n0, n1); break;
    case kGgufQ6_K: gguf_dequantize_range<kGgufQ6_K>(a, n0, n1); break;
    default: gguf_dequantize_range<kGgufQ8_0>(a, n0, n1); break;
  }
}

// Plain C++ micro-kernel (the generic variant's; any ISA): every format through gguf_decode32.
struct GgufScalarMicro {
  template <int R, int QT>
  static void dot(const uint8_t* w, int64_t nb, const int8_t* qx, int64_t k, const float* dx, const float* sx,
                  float* out) {
    float acc[R] = {};
    for (int64_t b = 0; b < nb; ++b) {
      int32_t q[kGgufBlock];
      float s[2], mw;
      gguf_decode32(w, QT, b, q, s, &mw);
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = qx + r * k + b * kGgufBlock;
        int32_t lo = 0, hi = 0;
        for (int i = 0; i < 16; ++i) lo += q[i] * xr[i], hi += q[i + 16] * xr[i + 16];
        if (QT == kGgufQ6_K)
          acc[r] += dx[r * nb + b] * (s[0] * static_cast<float>(lo) + s[1] * static_cast<float>(hi));
        else
          acc[r] += s[0] * dx[r * nb + b] * static_cast<float>(lo + hi);
        if (QT != kGgufQ8_0 && QT != kGgufQ6_K) acc[r] += mw * sx[r * nb + b];
      }
    }
    for (int r = 0; r < R; ++r) out[r] = acc[r];
  }
};

}  // namespace
}  // namespace anycore

// A variant's GgufKernels over its micro-kernel M.
#define ANYCORE_GGUF_KERNELS(M)                                                                     \
  ::anycore::GgufKernels{&::anycore::gguf_linear_kernel<M>, &::anycore::gguf_quantize_rows_kernel<M>, \
                         &::anycore::gguf_gemv_rows_kernel<M>, &::anycore::gguf_dequantize_rows_kernel<M>}
