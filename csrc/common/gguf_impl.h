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
#include <type_traits>

#include "bf16.h"
#include "kernel_table.h"
#include "parallel.h"

namespace anycore {
namespace {

constexpr int kGgufRows = 4;  // activation rows per tile (accumulators per row stay in registers)
constexpr int64_t kGgufRowGrain = 16;  // output rows per work chunk

inline float gguf_load(float v) { return v; }
inline float gguf_load(bf16 v) { return bf16_to_float(v); }

// One activation row -> qx (int8 [k]), dx, sx, qsum = sum(qx) ([k / 32]); the reference's arithmetic exactly.
template <typename T>
void gguf_quantize_row(const T* x, int64_t k, int8_t* qx, float* dx, float* sx, int32_t* qsum) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: (v + kMagic) - kMagic rounds half to even
  for (int64_t b = 0; b < k / kGgufBlock; ++b) {
    float v[kGgufBlock];
    // max |v| as the largest bit pattern with the sign cleared: for non-negative floats the
    // integer order is the float order, and an integer max vectorizes (a float one does not
    // without -ffast-math; the scalar loop was ~70% of this function's time)
    uint32_t abits = 0;
    for (int i = 0; i < kGgufBlock; ++i) {
      v[i] = gguf_load(x[b * kGgufBlock + i]);
      uint32_t u;
      std::memcpy(&u, &v[i], 4);
      u &= 0x7fffffffu;
      abits = u > abits ? u : abits;
    }
    float amax;
    std::memcpy(&amax, &abits, 4);
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
    qsum[b] = sum;
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

// The interleaved layout (kGgufX16) in portable C++, for a variant without a micro-kernel of its
// own for it: y[r][l] is output row l of the group for activation row r, in the same arithmetic
// as a row-major block (w = d q + mw; Q8_0's q unbiased by 128).
template <int R, int QT>
void gguf_x16_dot_portable(const uint8_t* group, int64_t nb, const int8_t* qx, int64_t k, const float* dx,
                           const float* sx, const int32_t*, float (*y)[kGgufX16Rows]) {
  constexpr int base = gguf_base(QT);
  constexpr int64_t tile_bytes = kGgufX16Rows * gguf_block_bytes(base);
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < kGgufX16Rows; ++l) y[r][l] = 0.0f;
  for (int64_t b = 0; b < nb; ++b)
    for (int l = 0; l < kGgufX16Rows; ++l) {
      int32_t q[kGgufBlock];
      float s[2], mw;
      gguf_decode32_x16(group + b * tile_bytes, base, l, q, s, &mw);
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = qx + r * k + b * kGgufBlock;
        int32_t isum = 0;
        for (int i = 0; i < kGgufBlock; ++i) isum += q[i] * xr[i];
        y[r][l] += s[0] * dx[r * nb + b] * static_cast<float>(isum);
        if (base != kGgufQ8_0) y[r][l] += mw * sx[r * nb + b];
      }
    }
}

// M::kX16 true: M has its own `template <int R, int QT> static void dot_x16(...)` of the form above
// and `template <int QT> static void dequantize_x16(const GgufArgs&, int64_t n0, int64_t n1)`, and
// M::kX16Types says for which file types (bit t: type t) they are its own work rather than the
// portable form's (the loader interleaves only those: GgufKernels::interleaved16).
template <class M, class = void>
struct GgufHasX16 : std::false_type {};
template <class M>
struct GgufHasX16<M, std::void_t<decltype(M::kX16)>> : std::bool_constant<M::kX16> {};
template <class M>
constexpr uint32_t gguf_x16_types() {
  if constexpr (GgufHasX16<M>::value)
    return M::kX16Types;
  else
    return 0;
}

constexpr int kGgufX16Tile = 8;  // activation rows per pass over a group (their accumulators in registers)

template <class M, int QT, int R>
void gguf_x16_tile(const GgufArgs& a, const int8_t* qx, const float* dx, const float* sx, const int32_t* qsum,
                   int64_t r0, int64_t g, int64_t n0, int64_t n1) {
  const int64_t k = a.k, nb = k / kGgufBlock;
  const uint8_t* group = a.w + g * kGgufX16Rows * gguf_row_bytes(QT, k);
  float y[R][kGgufX16Rows];
  if constexpr (GgufHasX16<M>::value)
    M::template dot_x16<R, QT>(group, nb, qx + r0 * k, k, dx + r0 * nb, sx + r0 * nb, qsum + r0 * nb, y);
  else
    gguf_x16_dot_portable<R, QT>(group, nb, qx + r0 * k, k, dx + r0 * nb, sx + r0 * nb, qsum + r0 * nb, y);
  const int64_t j0 = g * kGgufX16Rows > n0 ? g * kGgufX16Rows : n0;
  const int64_t j1 = (g + 1) * kGgufX16Rows < n1 ? (g + 1) * kGgufX16Rows : n1;
  for (int r = 0; r < R; ++r)
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t at = (r0 + r) * a.n + j;
      const float v = y[r][j - g * kGgufX16Rows] + (a.bias ? a.bias[j] : 0.0f);
      if (a.out_type == 0)
        static_cast<float*>(a.out)[at] = v;
      else
        static_cast<bf16*>(a.out)[at] = float_to_bf16(v);
    }
}

// Output rows [n0, n1) of an interleaved weight: whole groups (a range that cuts one computes it
// and keeps its rows), each group once per tile of activation rows.
template <class M, int QT>
void gguf_x16_rows(const GgufArgs& a, const int8_t* qx, const float* dx, const float* sx, const int32_t* qsum,
                   int64_t n0, int64_t n1) {
  for (int64_t g = n0 / kGgufX16Rows; g * kGgufX16Rows < n1; ++g)
    for (int64_t r0 = 0; r0 < a.m; r0 += kGgufX16Tile) {
      switch (a.m - r0 < kGgufX16Tile ? a.m - r0 : kGgufX16Tile) {
        case 1: gguf_x16_tile<M, QT, 1>(a, qx, dx, sx, qsum, r0, g, n0, n1); break;
        case 2: gguf_x16_tile<M, QT, 2>(a, qx, dx, sx, qsum, r0, g, n0, n1); break;
        case 3: gguf_x16_tile<M, QT, 3>(a, qx, dx, sx, qsum, r0, g, n0, n1); break;
        case 4: gguf_x16_tile<M, QT, 4>(a, qx, dx, sx, qsum, r0, g, n0, n1); break;
        case 5: gguf_x16_tile<M, QT, 5>(a, qx, dx, sx, qsum, r0, g, n0, n1); break;
        case 6: gguf_x16_tile<M, QT, 6>(a, qx, dx, sx, qsum, r0, g, n0, n1); break;
        case 7: gguf_x16_tile<M, QT, 7>(a, qx, dx, sx, qsum, r0, g, n0, n1); break;
        default: gguf_x16_tile<M, QT, 8>(a, qx, dx, sx, qsum, r0, g, n0, n1); break;
      }
    }
}

// The workspace's pieces for m rows of k (gguf_workspace_bytes).
struct GgufActs {
  int8_t* qx;
  float *dx, *sx;
  int32_t* qsum;
  explicit GgufActs(const GgufArgs& a)
      : qx(static_cast<int8_t*>(a.workspace)),
        dx(reinterpret_cast<float*>(qx + a.m * a.k)),  // m * k is a multiple of 32: aligned
        sx(dx + a.m * (a.k / kGgufBlock)),
        qsum(reinterpret_cast<int32_t*>(sx + a.m * (a.k / kGgufBlock))) {}
};

// Rows [r0, r1) of x quantized into the workspace.
inline void gguf_quantize_range(const GgufArgs& a, int64_t r0, int64_t r1) {
  const GgufActs w(a);
  const int64_t k = a.k, nb = k / kGgufBlock;
  for (int64_t r = r0; r < r1; ++r) {
    if (a.x_type == 0)
      gguf_quantize_row(static_cast<const float*>(a.x) + r * a.x_stride, k, w.qx + r * k, w.dx + r * nb,
                        w.sx + r * nb, w.qsum + r * nb);
    else
      gguf_quantize_row(static_cast<const bf16*>(a.x) + r * a.x_stride, k, w.qx + r * k, w.dx + r * nb,
                        w.sx + r * nb, w.qsum + r * nb);
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
    case kGgufX16 + kGgufQ4_0: gguf_x16_rows<M, kGgufX16 + kGgufQ4_0>(a, w.qx, w.dx, w.sx, w.qsum, n0, n1); break;
    case kGgufX16 + kGgufQ4_1: gguf_x16_rows<M, kGgufX16 + kGgufQ4_1>(a, w.qx, w.dx, w.sx, w.qsum, n0, n1); break;
    case kGgufX16 + kGgufQ8_0: gguf_x16_rows<M, kGgufX16 + kGgufQ8_0>(a, w.qx, w.dx, w.sx, w.qsum, n0, n1); break;
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
// Rows [n0, n1) of an interleaved weight: per tile and wanted row, the row's quant bytes gathered
// back into their file order (4 bytes per 64-byte chunk), then decoded as a file block is.
template <int QT>
void gguf_dequantize_x16_range(const GgufArgs& a, int64_t n0, int64_t n1) {
  constexpr int base = gguf_base(QT);
  constexpr int64_t tile_bytes = kGgufX16Rows * gguf_block_bytes(base);
  constexpr int L = static_cast<int>(kGgufX16Rows), chunks = base == kGgufQ8_0 ? 8 : 4;
  const int64_t k = a.k, nb = k / kGgufBlock, row_bytes = gguf_row_bytes(QT, k);
  for (int64_t r = n0; r < n1; ++r) {
    const int l = static_cast<int>(r % L);
    const uint8_t* group = a.w + (r / L) * L * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* tile = group + b * tile_bytes;
      const float d = gguf_half(tile + 2 * l);
      const float mw = base == kGgufQ4_1 ? gguf_half(tile + 32 + 2 * l) : base == kGgufQ4_0 ? -8.0f * d : 0.0f;
      uint8_t bytes[4 * chunks];
      for (int c = 0; c < chunks; ++c) std::memcpy(bytes + 4 * c, tile + (base == kGgufQ4_1 ? 64 : 32) + 64 * c + 4 * l, 4);
      int32_t q[kGgufBlock];
      if constexpr (base == kGgufQ8_0)
        for (int i = 0; i < kGgufBlock; ++i) q[i] = static_cast<int32_t>(bytes[i]) - 128;
      else
        for (int i = 0; i < 16; ++i) q[i] = bytes[i] & 0x0F, q[i + 16] = bytes[i] >> 4;
      float v[kGgufBlock];
      for (int i = 0; i < kGgufBlock; ++i) {
        const float scaled = d * static_cast<float>(q[i]);  // (two statements: never fused)
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

template <int QT>
void gguf_dequantize_range(const GgufArgs& a, int64_t n0, int64_t n1) {
  if constexpr (gguf_is_x16(QT)) {
    gguf_dequantize_x16_range<QT>(a, n0, n1);
    return;
  }
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

// The interleaved layout's dequantization: M's own (with its dot_x16) or the portable one.
template <class M, int QT>
void gguf_dequantize_x16_rows(const GgufArgs& a, int64_t n0, int64_t n1) {
  if constexpr (GgufHasX16<M>::value)
    M::template dequantize_x16<QT>(a, n0, n1);
  else
    gguf_dequantize_range<QT>(a, n0, n1);
}

template <class M>
void gguf_dequantize_rows_kernel(const GgufArgs& a, int64_t n0, int64_t n1) {
  switch (a.qtype) {
    case kGgufX16 + kGgufQ4_0: gguf_dequantize_x16_rows<M, kGgufX16 + kGgufQ4_0>(a, n0, n1); break;
    case kGgufX16 + kGgufQ4_1: gguf_dequantize_x16_rows<M, kGgufX16 + kGgufQ4_1>(a, n0, n1); break;
    case kGgufX16 + kGgufQ8_0: gguf_dequantize_x16_rows<M, kGgufX16 + kGgufQ8_0>(a, n0, n1); break;
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
                         &::anycore::gguf_gemv_rows_kernel<M>, &::anycore::gguf_dequantize_rows_kernel<M>, \
                         ::anycore::gguf_x16_types<M>()}
