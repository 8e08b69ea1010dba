// W8A8 INT8 linear written once over an ISA micro-kernel `M` (see anycore/kernels/int8.py for
// the scheme). Included by each ISA translation unit that defines an M; everything has
// internal linkage so each unit keeps the code its own flags produced.
//
// Weight layout (every variant): output columns in panels of 16 (N zero-padded to 16); inside
// a panel, K (zero-padded to M::kKAlign) in groups of M::kGroup elements, each group stored
// for the 16 columns one after the other:
//   byte(n, k) = (n / 16) * 16 * Kp + (k / G) * 16 * G + (n % 16) * G + k % G
// G = 4 is what VNNI VPDPBUSD and Arm SDOT read (4 bytes of one column per int32 lane),
// G = 8 what Arm SMMLA reads (2 columns x 8 bytes per 128-bit operand), G = 1 a plain
// [k][16 columns] panel for the portable outer-product kernel. With M::kColSums the int32 sum
// of each column's weights follows the panels (VNNI's unsigned-activation correction).
//
// Activations are quantized per row (amax, scale = max(amax, 1e-12) / 127, x / scale rounded
// half-to-even, clamped to +-127: bit-for-bit the reference's fp32 arithmetic) into the
// workspace, Kp bytes per row, plus M::kActOffset (128: unsigned for VNNI). M::kActPairs
// stores row pairs interleaved in 8-byte chunks (SMMLA's 2x8 left operand).
//
// Epilogue: y = float(acc) * x_scale[m] * w_scale[n] (+ bias[n]) in that order, in fp32, then
// the output type: the reference's roundings, so fp32 results match it exactly.
#pragma once
#include <cstdint>
#include <cstring>

#include "bf16.h"
#include "kernel_table.h"
#include "parallel.h"
#include "prefetch.h"

namespace anycore {
namespace {

constexpr int64_t kI8Panel = 16;

inline int64_t i8_round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }
inline int64_t i8_min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t i8_max(int64_t a, int64_t b) { return a > b ? a : b; }

inline float i8_load(float v) { return v; }
inline float i8_load(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t i8_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <class M>
struct I8Layout {
  static int64_t kp(int64_t k) { return i8_round_up(k > 0 ? k : 1, M::kKAlign); }
  static int64_t np(int64_t n) { return i8_round_up(n, kI8Panel); }
  static int64_t weight_bytes(int64_t n, int64_t k) { return np(n) * kp(k); }
  static int64_t packed_bytes(int64_t n, int64_t k) { return weight_bytes(n, k) + (M::kColSums ? 4 * np(n) : 0); }
  // first byte of column n's group holding k = 0 (the next group is 16 * G bytes further)
  static int64_t col_base(int64_t n, int64_t kp) { return (n / kI8Panel) * kI8Panel * kp + (n % kI8Panel) * M::kGroup; }
  // activation rows in the workspace: M::kRowAlign pads them (2 for SMMLA pairs, AMX tiles)
  static int64_t act_rows(int64_t m) { return i8_round_up(m, M::kRowAlign); }
  static int64_t act_bytes(int64_t m, int64_t k) { return i8_round_up(act_rows(m) * kp(k), 64); }
  // where row r's element 0 is, and how far apart its chunks of `chunk` elements are
  static int64_t act_row_base(int64_t r, int64_t kp) { return M::kActPairs ? (r / 2) * 2 * kp + (r % 2) * 8 : r * kp; }
};

template <class M>
int64_t int8_packed_bytes(int64_t n, int64_t k) {
  return I8Layout<M>::packed_bytes(n, k);
}

template <class M>
int64_t int8_workspace_bytes(int64_t m, int64_t k) {
  return I8Layout<M>::act_bytes(m, k) + 4 * m + 64;
}

template <class M>
void int8_pack(void* dst_, const int8_t* w, int64_t n, int64_t k) {
  using L = I8Layout<M>;
  int8_t* dst = static_cast<int8_t*>(dst_);
  const int64_t kp = L::kp(k), G = M::kGroup;
  std::memset(dst, 0, L::packed_bytes(n, k));
  parallel_for(n, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int8_t* col = dst + L::col_base(r, kp);
      const int8_t* src = w + r * k;
      int32_t sum = 0;
      for (int64_t c = 0; c < k; c += G) std::memcpy(col + (c / G) * kI8Panel * G, src + c, i8_min(G, k - c));
      for (int64_t c = 0; c < k; ++c) sum += src[c];
      if (M::kColSums) std::memcpy(dst + L::weight_bytes(n, k) + 4 * r, &sum, 4);
    }
  });
}

template <class M>
void int8_unpack(int8_t* w, const void* src_, int64_t n, int64_t k, const int64_t* rows, int64_t count) {
  using L = I8Layout<M>;
  const int8_t* src = static_cast<const int8_t*>(src_);
  const int64_t kp = L::kp(k), G = M::kGroup;
  for (int64_t i = 0; i < count; ++i) {
    const int8_t* col = src + L::col_base(rows ? rows[i] : i, kp);
    for (int64_t c = 0; c < k; c += G) std::memcpy(w + i * k + c, col + (c / G) * kI8Panel * G, i8_min(G, k - c));
  }
}

// One activation row -> int8 (+ offset) at dst (row base per the layout); returns the scale.
template <class M, typename T>
float quantize_row(int8_t* dst, const T* x, int64_t k, int64_t kp) {
  uint32_t amax_bits = 0;  // |x| compared as integers: same order as floats for non-NaN values
  for (int64_t i = 0; i < k; ++i) {
    float f = i8_load(x[i]);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u &= 0x7fffffffu;
    amax_bits = u > amax_bits ? u : amax_bits;
  }
  float amax;
  std::memcpy(&amax, &amax_bits, 4);
  const float scale = (amax > 1e-12f ? amax : 1e-12f) / 127.0f;
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: (v + kMagic) - kMagic rounds half to even
  constexpr int64_t C = M::kActPairs ? 8 : (int64_t{1} << 62), S = M::kActPairs ? 16 : 0;
  for (int64_t c0 = 0; c0 < kp; c0 += C) {
    int8_t* d = dst + (c0 / C) * S - c0;
    const int64_t end = i8_min(c0 + C, k), pad_end = i8_min(c0 + C, kp);
    for (int64_t i = c0; i < end; ++i) {
      float v = i8_load(x[i]) / scale;
      v = (v + kMagic) - kMagic;
      v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
      d[i] = static_cast<int8_t>(static_cast<int32_t>(v) + M::kActOffset);
    }
    for (int64_t i = end > c0 ? end : c0; i < pad_end; ++i) d[i] = static_cast<int8_t>(M::kActOffset);
  }
  return scale;
}

// Already-quantized int8 row (tests' accumulator entry), or a zero row (pair padding).
template <class M>
void copy_row(int8_t* dst, const int8_t* x, int64_t k, int64_t kp) {
  constexpr int64_t C = M::kActPairs ? 8 : (int64_t{1} << 62), S = M::kActPairs ? 16 : 0;
  for (int64_t c0 = 0; c0 < kp; c0 += C) {
    int8_t* d = dst + (c0 / C) * S - c0;
    const int64_t end = i8_min(c0 + C, k), pad_end = i8_min(c0 + C, kp);
    for (int64_t i = c0; i < end; ++i) d[i] = static_cast<int8_t>((x ? x[i] : 0) + M::kActOffset);
    for (int64_t i = end > c0 ? end : c0; i < pad_end; ++i) d[i] = static_cast<int8_t>(M::kActOffset);
  }
}

// Picks the micro-kernel instance for r <= kMR rows and p <= kNP panels.
template <class M, int R, int P = M::kNP>
inline void i8_tile_p(int p, const int8_t* a, int64_t kp, const int8_t* w, int64_t ps, int32_t* c) {
  if constexpr (P > 1) {
    if (p < P) return i8_tile_p<M, R, P - 1>(p, a, kp, w, ps, c);
  }
  M::template tile<R, P>(a, kp, w, ps, c);
}
template <class M, int R = M::kMR>
inline void i8_tile(int r, int p, const int8_t* a, int64_t kp, const int8_t* w, int64_t ps, int32_t* c) {
  if constexpr (R > 1) {
    if (r < R) return i8_tile<M, R - 1>(r, p, a, kp, w, ps, c);
  }
  i8_tile_p<M, R>(p, a, kp, w, ps, c);
}

template <class M>
void i8_epilogue(const W8A8Args& a, const int32_t* c, int64_t ldc, int64_t m0, int64_t rows, int64_t n0,
                 int64_t cols, const int32_t* colsum, const float* xs) {
  int32_t corr[M::kNP * kI8Panel];
  for (int64_t j = 0; j < cols; ++j) corr[j] = M::kColSums ? M::kActOffset * colsum[n0 + j] : 0;
  const float* ws = a.w_scale + n0;
  const float* b = a.bias ? a.bias + n0 : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* cr = c + r * ldc;
    const int64_t o = (m0 + r) * a.n + n0;
    if (a.out_type == kInt8Acc) {
      int32_t* out = static_cast<int32_t*>(a.out) + o;
      for (int64_t j = 0; j < cols; ++j) out[j] = cr[j] - corr[j];
      continue;
    }
    float y[M::kNP * kI8Panel];
    const float s = xs[m0 + r];
    for (int64_t j = 0; j < cols; ++j) y[j] = static_cast<float>(cr[j] - corr[j]) * s * ws[j];
    if (b) {
      for (int64_t j = 0; j < cols; ++j) y[j] = y[j] + b[j];
    }
    if (a.out_type == kInt8Fp32) {
      std::memcpy(static_cast<float*>(a.out) + o, y, 4 * cols);
    } else {
      uint16_t* out = static_cast<uint16_t*>(a.out) + o;
      for (int64_t j = 0; j < cols; ++j) out[j] = i8_bf16_bits(y[j]);
    }
  }
}

// The workspace: quantized activation rows first, then the fp32 row scales.
template <class M>
float* i8_row_scales(const W8A8Args& a) {
  return reinterpret_cast<float*>(static_cast<int8_t*>(a.workspace) + I8Layout<M>::act_bytes(a.m, a.k));
}

// Quantizes (or copies, for raw int8 input) every row into the workspace, and fills the padding
// rows up to M::kRowAlign unless `pad` is false (a caller whose kernel reads only the m real
// rows: AMX pads to 32 rows, which at decode cost more than the quantization itself).
template <class M>
void i8_quantize_rows(const W8A8Args& a, bool pad = true) {
  using L = I8Layout<M>;
  const int64_t m = a.m, k = a.k, kp = L::kp(k);
  int8_t* act = static_cast<int8_t*>(a.workspace);
  float* xs = i8_row_scales<M>(a);
  parallel_for(m, 1 + 32768 / kp, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int8_t* dst = act + L::act_row_base(r, kp);
      if (a.x_type == kInt8Fp32) {
        xs[r] = quantize_row<M>(dst, static_cast<const float*>(a.x) + r * a.x_stride, k, kp);
      } else if (a.x_type == kInt8Bf16) {
        xs[r] = quantize_row<M>(dst, static_cast<const bf16*>(a.x) + r * a.x_stride, k, kp);
      } else {
        xs[r] = 1.0f;
        copy_row<M>(dst, static_cast<const int8_t*>(a.x) + r * a.x_stride, k, kp);
      }
    }
  });
  if (pad) {
    for (int64_t r = m; r < L::act_rows(m); ++r) copy_row<M>(act + L::act_row_base(r, kp), nullptr, 0, kp);
  }
}

// Work items for tiles of `mr` rows x `nb` columns: (column block, run of row blocks), column
// block major, so a thread's contiguous share reuses one weight block across rows.
struct I8Work {
  int64_t nblocks, mblocks, mc, grain;
};
inline I8Work i8_work(int64_t m, int64_t n, int64_t kp, int64_t mr, int64_t nb) {
  I8Work w{};
  w.nblocks = (n + nb - 1) / nb;
  w.mblocks = (m + mr - 1) / mr;
  const int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  w.mc = i8_max(1, i8_min(w.mblocks, (4 * threads + w.nblocks - 1) / w.nblocks));
  const int64_t item_macs = nb * kp * i8_min(m, ((w.mblocks + w.mc - 1) / w.mc) * mr);
  w.grain = 1 + (int64_t{1} << 17) / (item_macs > 0 ? item_macs : 1);
  return w;
}

// At most M::kMR rows (decode): each weight byte is read once, so the split is by 16-column
// panels (64-column blocks left 5:4 shares of N = 576 between 2 threads) and a thread's panels
// are one contiguous run of memory, M::kNP panels per tile (the micro-kernels prefetch ahead).
template <class M>
void i8_gemm_panels(const W8A8Args& a, int64_t p0, int64_t p1) {
  using L = I8Layout<M>;
  const int64_t n = a.n, kp = L::kp(a.k);
  const int8_t* act = static_cast<const int8_t*>(a.workspace);
  const float* xs = i8_row_scales<M>(a);
  const int8_t* w = static_cast<const int8_t*>(a.w);
  const int32_t* colsum = reinterpret_cast<const int32_t*>(w + L::weight_bytes(n, a.k));
  constexpr int64_t NB = M::kNP * kI8Panel;
  const int rows = static_cast<int>(a.m);
  alignas(64) int32_t c[M::kMR * NB];
  for (int64_t p = p0; p < p1; p += M::kNP) {
    const int panels = static_cast<int>(i8_min(M::kNP, p1 - p));
    const int64_t n0 = p * kI8Panel;
    i8_tile<M>(rows, panels, act, kp, w + n0 * kp, kI8Panel * kp, c);
    i8_epilogue<M>(a, c, NB, 0, rows, n0, i8_min(panels * kI8Panel, n - n0), colsum, xs);
  }
}
template <class M>
void i8_gemm_rows(const W8A8Args& a) {
  const int64_t grain = 1 + (int64_t{1} << 15) / (kI8Panel * I8Layout<M>::kp(a.k));  // >= 32 KiB of weights a thread
  parallel_for(I8Layout<M>::np(a.n) / kI8Panel, grain, [&](int64_t p0, int64_t p1) { i8_gemm_panels<M>(a, p0, p1); });
}
// (pads an SMMLA row pair; not AMX's 32-row tiles, which the m = 1 path never reads)
template <class M>
void i8_quantize_row(const W8A8Args& a) {
  i8_quantize_rows<M>(a, /*pad=*/M::kRowAlign <= 2);
}
// The int32 tiles with micro-kernel M and the epilogue, on activations already in the workspace.
template <class M>
void i8_gemm(const W8A8Args& a) {
  if (a.m <= M::kMR) return i8_gemm_rows<M>(a);
  using L = I8Layout<M>;
  const int64_t m = a.m, n = a.n, kp = L::kp(a.k);
  const int8_t* act = static_cast<const int8_t*>(a.workspace);
  const float* xs = i8_row_scales<M>(a);
  const int8_t* w = static_cast<const int8_t*>(a.w);
  const int32_t* colsum = reinterpret_cast<const int32_t*>(w + L::weight_bytes(n, a.k));
  constexpr int64_t NB = M::kNP * kI8Panel;
  const I8Work wk = i8_work(m, n, kp, M::kMR, NB);
  parallel_for(wk.nblocks * wk.mc, wk.grain, [&](int64_t i0, int64_t i1) {
    alignas(64) int32_t c[M::kMR * NB];
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t nb = it / wk.mc, mk = it % wk.mc;
      const int64_t n0 = nb * NB, cols = i8_min(NB, n - n0);
      const int panels = static_cast<int>((cols + kI8Panel - 1) / kI8Panel);
      const int8_t* wb = w + (n0 / kI8Panel) * kI8Panel * kp;
      for (int64_t mb = mk * wk.mblocks / wk.mc; mb < (mk + 1) * wk.mblocks / wk.mc; ++mb) {
        const int64_t m0 = mb * M::kMR, rows = i8_min(M::kMR, m - m0);
        i8_tile<M>(static_cast<int>(rows), panels, act + m0 * kp, kp, wb, kI8Panel * kp, c);
        i8_epilogue<M>(a, c, NB, m0, rows, n0, cols, colsum, xs);
      }
    }
  });
}

template <class M>
void w8a8_linear_impl(const W8A8Args& a) {
  i8_quantize_rows<M>(a);
  i8_gemm<M>(a);
}

}  // namespace
}  // namespace anycore

// The Int8Kernels initializer of a variant whose micro-kernel is M.
#define ANYCORE_INT8_KERNELS(M)                                                     \
  {&::anycore::int8_packed_bytes<M>, &::anycore::int8_pack<M>, &::anycore::int8_unpack<M>, \
   &::anycore::int8_workspace_bytes<M>, &::anycore::w8a8_linear_impl<M>, &::anycore::i8_quantize_row<M>, \
   &::anycore::i8_gemm_panels<M>}
