// AVX-512 VNNI variant: the W8A8 INT8 linear on VPDPBUSD (needs avx512f/bw/vl + avx512_vnni;
// Cascade Lake and later, Zen 4), and the GGUF block linear (Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K weights, int8
// activations per 32-block) on 256-bit VPDPBUSD. Other ops are null here: selection keeps them
// elsewhere. The W8A8 kernel and its unsigned-activation correction are in vnni_micro.h.
#include "vnni_micro.h"

#include "../common/gguf_impl.h"

namespace anycore {
namespace {
using VnniMicro = VnniMicroT<4, 1>;

// One GGUF block is 32 weights: one 256-bit VPDPBUSD per activation row. Q4 nibbles (0..15) are
// the unsigned operand as they are; Q8_0 (signed x signed) multiplies |w| by x carrying w's sign
// (VPSIGNB), the same products. The 8 int32 lanes are scaled and summed in fp32 lanes; one
// horizontal sum per output at the end.
struct GgufVnniMicro {
  template <int R>
  static void finish(const __m256* acc, const float* corr, float* out) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
      v = _mm_add_ps(v, _mm_movehl_ps(v, v));
      v = _mm_add_ss(v, _mm_movehdup_ps(v));
      out[r] = _mm_cvtss_f32(v) + corr[r];
    }
  }

  // Q5_0 and the K-quants: one 32-weight (sub-)block at a time, unpacked to bytes in a 256-bit
  // register (unsigned 0..31; Q6_K's signed -32..31 take Q8_0's VPSIGNB form), the scales of its
  // two halves in the low and high four fp32 lanes (dpbusd lane i sums weights 4i..4i+3). The
  // fifth bits (Q5_0, Q5_K) come in as a byte mask: VPMOVM2B's form via a masked move of 16s.
  template <int R, int QT>
  static void dot_sub(const uint8_t* w, int64_t nb, const int8_t* qx, int64_t k, const float* dx, const float* sx,
                      float* out) {
    constexpr int64_t bb = gguf_block_bytes(QT);
    constexpr int kSub = gguf_is_k(QT) ? 8 : 1;
    const __m256i zero = _mm256_setzero_si256(), low4 = _mm256_set1_epi8(0x0F), fifth = _mm256_set1_epi8(16);
    __m256 acc[R];
    float corr[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), corr[r] = 0.0f;
    for (int64_t g = 0; g < nb / kSub; ++g) {
      const uint8_t* blk = w + g * bb;
      float s0[kSub], s1[kSub], mw[kSub];
      if constexpr (QT == kGgufQ5_0) {
        s0[0] = s1[0] = gguf_half(blk), mw[0] = -16.0f * s0[0];
      } else if constexpr (QT == kGgufQ6_K) {
        const float d = gguf_half(blk + 208);
        for (int j = 0; j < kSub; ++j)
          s0[j] = d * static_cast<float>(static_cast<int8_t>(blk[192 + 2 * j])),
          s1[j] = d * static_cast<float>(static_cast<int8_t>(blk[193 + 2 * j])), mw[j] = 0.0f;
      } else {
        const float d = gguf_half(blk), dmin = gguf_half(blk + 2);
        for (int j = 0; j < kSub; ++j) {
          int sc, mn;
          gguf_scale_min_k4(j, blk + 4, &sc, &mn);
          s0[j] = s1[j] = d * static_cast<float>(sc), mw[j] = -(dmin * static_cast<float>(mn));
        }
      }
      for (int j = 0; j < kSub; ++j) {
        const int64_t b = g * kSub + j;
        __m256i wv;
        if constexpr (QT == kGgufQ5_0) {
          const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 6));
          uint32_t qh;
          std::memcpy(&qh, blk + 2, 4);
          wv = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low4);
          wv = _mm256_or_si256(wv, _mm256_maskz_mov_epi8(qh, fifth));
        } else if constexpr (QT == kGgufQ6_K) {
          const int h = j / 4, t = j % 4;
          const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32 * (t % 2)));
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
          const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (t / 2))), low4);
          const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t)), _mm256_set1_epi8(3));
          // (hi <= 3: shifting 16-bit lanes by 4 keeps each byte's bits in that byte)
          wv = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
        } else {
          const uint8_t* qs = blk + (QT == kGgufQ5_K ? 48 : 16) + 32 * (j / 2);
          wv = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs)),
                                                 _mm_cvtsi32_si128(4 * (j % 2))),
                                low4);
          if constexpr (QT == kGgufQ5_K) {
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
            const __mmask32 bit = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(static_cast<char>(1 << j)));
            wv = _mm256_or_si256(wv, _mm256_maskz_mov_epi8(bit, fifth));
          }
        }
        const __m256 s8 = _mm256_set_m128(_mm_set1_ps(s1[j]), _mm_set1_ps(s0[j]));
        const __m256i wabs = QT == kGgufQ6_K ? _mm256_abs_epi8(wv) : wv;
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + r * k + b * kGgufBlock));
          const __m256i s = QT == kGgufQ6_K ? _mm256_dpbusd_epi32(zero, wabs, _mm256_sign_epi8(av, wv))
                                            : _mm256_dpbusd_epi32(zero, wv, av);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(s8, _mm256_set1_ps(dx[r * nb + b])), acc[r]);
          if (QT != kGgufQ6_K) corr[r] += mw[j] * sx[r * nb + b];
        }
      }
    }
    finish<R>(acc, corr, out);
  }

  template <int R, int QT>
  static void dot(const uint8_t* w, int64_t nb, const int8_t* qx, int64_t k, const float* dx, const float* sx,
                  float* out) {
    if constexpr (QT == kGgufQ5_0 || gguf_is_k(QT)) {
      dot_sub<R, QT>(w, nb, qx, k, dx, sx, out);
      return;
    }
    constexpr int64_t bb = gguf_block_bytes(QT);
    const __m256i zero = _mm256_setzero_si256(), low4 = _mm256_set1_epi8(0x0F);
    __m256 acc[R];
    float corr[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), corr[r] = 0.0f;
    if constexpr (QT == kGgufQ8_0) {
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + b * bb;
        uint16_t h;
        std::memcpy(&h, blk, 2);
        const float dw = _cvtsh_ss(h);
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
        const __m256i wabs = _mm256_abs_epi8(wv);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + r * k + b * kGgufBlock));
          const __m256i s = _mm256_dpbusd_epi32(zero, wabs, _mm256_sign_epi8(av, wv));
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * dx[r * nb + b]), acc[r]);
        }
      }
      finish<R>(acc, corr, out);
      return;
    }
    // Q4_0 / Q4_1: the block's two scales as one pair (d, m), Q4_0's m being -8 d, times the
    // activation pair (dx, sx) in one multiply: lane 0 scales the dot product, lane 1 is the
    // min correction, summed in a vector. The nibbles: the 16 bytes broadcast to both 128-bit
    // halves, the high half shifted by 4 (low nibbles are elements 0..15, high 16..31). Fewer
    // scalar conversions and shuffles per block than one fp16 load and multiply per scale
    // (~11 -> ~15 GB/s per core on a 3072 x 576 Q4_1 GEMV, Zen 4).
    const __m256i nibble_shift = _mm256_set_epi64x(0x0004000400040004LL, 0x0004000400040004LL, 0, 0);
    __m128 pair_sum[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) pair_sum[r] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = w + b * bb;
      __m128 dm;
      if constexpr (QT == kGgufQ4_1) {
        int32_t both;
        std::memcpy(&both, blk, 4);
        dm = _mm_cvtph_ps(_mm_cvtsi32_si128(both));
      } else {
        uint16_t h;
        std::memcpy(&h, blk, 2);
        dm = _mm_mul_ps(_mm_set1_ps(_cvtsh_ss(h)), _mm_setr_ps(1.0f, -8.0f, 0.0f, 0.0f));
      }
      const __m256i raw = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (QT == kGgufQ4_1 ? 4 : 2))));
      const __m256i wv = _mm256_and_si256(_mm256_srlv_epi16(raw, nibble_shift), low4);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + r * k + b * kGgufBlock));
        const __m256i s = _mm256_dpbusd_epi32(zero, wv, av);
        const __m128 p = _mm_mul_ps(dm, _mm_unpacklo_ps(_mm_load_ss(dx + r * nb + b), _mm_load_ss(sx + r * nb + b)));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcastss_ps(p), acc[r]);
        pair_sum[r] = _mm_add_ps(pair_sum[r], p);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) corr[r] = _mm_cvtss_f32(_mm_movehdup_ps(pair_sum[r]));
    finish<R>(acc, corr, out);
  }

  // The 16-row interleaved layout (kernel_table.h kGgufX16): per tile, the 16 rows' weights are
  // 8 registers of unsigned bytes (Q4: 4 loads, low and high nibbles; Q8_0: q + 128, 8 loads),
  // register i holding weights 4 i .. 4 i + 3 of every row. Each activation row's 4-byte groups
  // are broadcast into 8 VPDPBUSDs, which leave the 16 rows' exact block sums in 16 lanes
  // (Q8_0's start at -128 sum(qx), which takes the bias back out), then
  //   acc += dw * dx * isum  (+ mw * sx)
  // in 16 fp32 lanes: no horizontal sums, and the unpacked weights serve every row of the tile.
  static constexpr bool kX16 = true;
  static constexpr uint32_t kX16Types = (1u << kGgufQ4_0) | (1u << kGgufQ4_1) | (1u << kGgufQ8_0);
  template <int R, int QT>
  static void dot_x16(const uint8_t* group, int64_t nb, const int8_t* qx, int64_t k, const float* dx,
                      const float* sx, const int32_t* qsum, float (*y)[kGgufX16Rows]) {
    constexpr int base = gguf_base(QT);
    constexpr int64_t tile_bytes = kGgufX16Rows * gguf_block_bytes(base);
    constexpr int quants = base == kGgufQ4_1 ? 64 : 32;  // offset of the quant chunks in a tile
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512 acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* tile = group + b * tile_bytes;
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile)));
      __m512 mw = _mm512_setzero_ps();
      if constexpr (base == kGgufQ4_1)
        mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 32)));
      else if constexpr (base == kGgufQ4_0)
        mw = _mm512_mul_ps(dw, _mm512_set1_ps(-8.0f));
      __m512i wq[8];
      if constexpr (base == kGgufQ8_0) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) wq[i] = _mm512_loadu_si512(tile + quants + 64 * i);
      } else {
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          const __m512i raw = _mm512_loadu_si512(tile + quants + 64 * c);
          wq[c] = _mm512_and_si512(raw, low4);
          wq[c + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = qx + r * k + b * kGgufBlock;
        // four independent chains of 2 VPDPBUSDs (one of 8 made each row wait on the instruction's
        // latency 8 times per block), summed: the same exact int32
        __m512i s4[4] = {base == kGgufQ8_0 ? _mm512_set1_epi32(-128 * qsum[r * nb + b]) : _mm512_setzero_si512(),
                         _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
          int32_t four;
          std::memcpy(&four, xr + 4 * i, 4);
          s4[i & 3] = _mm512_dpbusd_epi32(s4[i & 3], wq[i], _mm512_set1_epi32(four));
        }
        const __m512i s = _mm512_add_epi32(_mm512_add_epi32(s4[0], s4[1]), _mm512_add_epi32(s4[2], s4[3]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(dx[r * nb + b])), acc[r]);
        if constexpr (base != kGgufQ8_0) acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx[r * nb + b]), acc[r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y[r], acc[r]);
  }

  // Four 64-byte chunks of a tile (dword l of chunk c: row l's bytes 4 c .. 4 c + 3) -> each
  // row's 16 bytes in file order: a 4 x 16 dword transpose, row 4 j + i in 128-bit lane j of u[i].
  static void rows_of_chunks(const uint8_t* chunks, __m128i* rows) {
    const __m512i c0 = _mm512_loadu_si512(chunks), c1 = _mm512_loadu_si512(chunks + 64),
                  c2 = _mm512_loadu_si512(chunks + 128), c3 = _mm512_loadu_si512(chunks + 192);
    const __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpackhi_epi32(c0, c1),
                  t2 = _mm512_unpacklo_epi32(c2, c3), t3 = _mm512_unpackhi_epi32(c2, c3);
    const __m512i u[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3),
                          _mm512_unpackhi_epi64(t1, t3)};
    for (int i = 0; i < 4; ++i) {
      rows[i] = _mm512_castsi512_si128(u[i]);
      rows[4 + i] = _mm512_extracti32x4_epi32(u[i], 1);
      rows[8 + i] = _mm512_extracti32x4_epi32(u[i], 2);
      rows[12 + i] = _mm512_extracti32x4_epi32(u[i], 3);
    }
  }

  // 16 weights d * q + mw (a multiply, then an add: never fused, as gguf_dequantize_range) to out
  static void store16(__m512i q, __m512 d, __m512 mw, int out_type, void* out) {
    const __m512 v = _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(q)), mw);
    if (out_type == 0) {
      _mm512_storeu_ps(out, v);
      return;
    }
    // float_to_bf16 (bf16.h) in 16 lanes: round to nearest even, NaN kept quiet
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    _mm256_storeu_si256(static_cast<__m256i*>(out), _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet)));
  }

  // Rows [n0, n1) of an interleaved weight dequantized (the dense path's weight), tile by tile.
  template <int QT>
  static void dequantize_x16(const GgufArgs& a, int64_t n0, int64_t n1) {
    constexpr int base = gguf_base(QT);
    constexpr int64_t tile_bytes = kGgufX16Rows * gguf_block_bytes(base);
    constexpr int L = static_cast<int>(kGgufX16Rows);
    const int64_t k = a.k, nb = k / kGgufBlock, row_bytes = gguf_row_bytes(QT, k);
    const int64_t elem = a.out_type == 0 ? 4 : 2;
    const __m128i low4 = _mm_set1_epi8(0x0F), bias = _mm_set1_epi8(static_cast<char>(0x80));
    for (int64_t g = n0 / L; g * L < n1; ++g) {
      const int l0 = static_cast<int>(n0 > g * L ? n0 - g * L : 0), l1 = static_cast<int>(n1 < (g + 1) * L ? n1 - g * L : L);
      const uint8_t* group = a.w + g * L * row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* tile = group + b * tile_bytes;
        alignas(64) float d[L], mw[L];
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile)));
        _mm512_store_ps(d, dv);
        if constexpr (base == kGgufQ4_1)
          _mm512_store_ps(mw, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + 32))));
        else
          _mm512_store_ps(mw, _mm512_mul_ps(dv, _mm512_set1_ps(base == kGgufQ4_0 ? -8.0f : 0.0f)));
        __m128i lo[L], hi[L];  // each row's weights 0..15 and 16..31 as bytes
        if constexpr (base == kGgufQ8_0) {
          rows_of_chunks(tile + 32, lo);
          rows_of_chunks(tile + 32 + 256, hi);
        } else {
          rows_of_chunks(tile + (base == kGgufQ4_1 ? 64 : 32), lo);
        }
        for (int l = l0; l < l1; ++l) {
          __m512i q0, q1;
          if constexpr (base == kGgufQ8_0) {
            q0 = _mm512_cvtepi8_epi32(_mm_xor_si128(lo[l], bias));
            q1 = _mm512_cvtepi8_epi32(_mm_xor_si128(hi[l], bias));
          } else {
            q0 = _mm512_cvtepu8_epi32(_mm_and_si128(lo[l], low4));
            q1 = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(lo[l], 4), low4));
          }
          char* out = static_cast<char*>(a.out) + ((g * L + l) * k + b * kGgufBlock) * elem;
          const __m512 dl = _mm512_set1_ps(d[l]), ml = _mm512_set1_ps(mw[l]);
          store16(q0, dl, ml, a.out_type, out);
          store16(q1, dl, ml, a.out_type, out + 16 * elem);
        }
      }
    }
  }
};
}  // namespace

extern const KernelTable kTable_avx512_vnni;
constexpr KernelTable kTable_avx512_vnni =
    int8_only_table("avx512_vnni", ANYCORE_INT8_KERNELS(VnniMicro), ANYCORE_GGUF_KERNELS(GgufVnniMicro));

}  // namespace anycore
