// GGUF block linear micro-kernel on AVX2 (no int8 dot-product instruction): every format's
// 32-weight (sub-)block is unpacked to bytes in a 256-bit register, as in avx512_vnni.cpp's
// dot_sub, and multiplied by the int8 activations with VPMADDUBSW (u8 x s8 -> pairs summed in
// int16) then VPMADDWD by ones (-> int32, 4 bytes a lane). Exact: a pair is at most
// 2 * 128 * 127 = 32512 < 2^15 (Q8_0 and Q6_K take |w| and x carrying w's sign), so VPMADDUBSW
// never saturates. Lanes 0-3 hold weights 0..15, lanes 4-7 weights 16..31: the two halves'
// scales (different only in Q6_K) are the low and high four fp32 lanes.
#pragma once
#include <immintrin.h>

#include <cstring>

#include "../common/gguf_impl.h"

namespace anycore {
namespace {

struct GgufAvx2Micro {

  // an fp16 scale by F16C (exactly gguf_half's value; the scalar bit decode was ~15% of a Q8_0
  // row's time)
  static float half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }

  static __m256i dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
  }
  // byte i = 16 where bit i of `bits` is set, else 0 (Q5_0's fifth bits)
  static __m256i fifth_bits(uint32_t bits) {
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), pick);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(16));
  }

  template <int R, int QT>
  static void dot(const uint8_t* w, int64_t nb, const int8_t* qx, int64_t k, const float* dx, const float* sx,
                  float* out) {
    constexpr int64_t bb = gguf_block_bytes(QT);
    constexpr int kSub = gguf_is_k(QT) ? 8 : 1;
    constexpr bool kSigned = QT == kGgufQ8_0 || QT == kGgufQ6_K;
    const __m256i low4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
    __m256 acc[R];
    float corr[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), corr[r] = 0.0f;
    for (int64_t g = 0; g < nb / kSub; ++g) {
      const uint8_t* blk = w + g * bb;
      float s0[kSub], s1[kSub], mw[kSub];
      if constexpr (QT == kGgufQ6_K) {
        const float d = half(blk + 208);
        for (int j = 0; j < kSub; ++j)
          s0[j] = d * static_cast<float>(static_cast<int8_t>(blk[192 + 2 * j])),
          s1[j] = d * static_cast<float>(static_cast<int8_t>(blk[193 + 2 * j])), mw[j] = 0.0f;
      } else if constexpr (gguf_is_k(QT)) {
        const float d = half(blk), dmin = half(blk + 2);
        for (int j = 0; j < kSub; ++j) {
          int sc, mn;
          gguf_scale_min_k4(j, blk + 4, &sc, &mn);
          s0[j] = s1[j] = d * static_cast<float>(sc), mw[j] = -(dmin * static_cast<float>(mn));
        }
      } else {
        const float d = half(blk);
        s0[0] = s1[0] = d;
        mw[0] = QT == kGgufQ4_1 ? half(blk + 2) : QT == kGgufQ4_0 ? -8.0f * d : QT == kGgufQ5_0 ? -16.0f * d : 0.0f;
      }
      for (int j = 0; j < kSub; ++j) {
        const int64_t b = g * kSub + j;
        __m256i wv;
        if constexpr (QT == kGgufQ8_0) {
          wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
        } else if constexpr (QT == kGgufQ4_0 || QT == kGgufQ4_1 || QT == kGgufQ5_0) {
          const int hdr = QT == kGgufQ4_0 ? 2 : QT == kGgufQ4_1 ? 4 : 6;
          const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + hdr));
          wv = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low4);
          if constexpr (QT == kGgufQ5_0) {
            uint32_t qh;
            std::memcpy(&qh, blk + 2, 4);
            wv = _mm256_or_si256(wv, fifth_bits(qh));
          }
        } else if constexpr (QT == kGgufQ6_K) {
          const int h = j / 4, t = j % 4;
          const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32 * (t % 2)));
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
          const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (t / 2))), low4);
          const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t)), _mm256_set1_epi8(3));
          wv = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
        } else {  // Q4_K, Q5_K
          const uint8_t* qs = blk + (QT == kGgufQ5_K ? 48 : 16) + 32 * (j / 2);
          wv = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs)),
                                                 _mm_cvtsi32_si128(4 * (j % 2))),
                                low4);
          if constexpr (QT == kGgufQ5_K) {
            const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j));
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
            wv = _mm256_or_si256(wv, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), sixteen));
          }
        }
        const __m256 s8 = _mm256_set_m128(_mm_set1_ps(s1[j]), _mm_set1_ps(s0[j]));
        const __m256i wabs = kSigned ? _mm256_abs_epi8(wv) : wv;
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + r * k + b * kGgufBlock));
          const __m256i s = dot_u8s8(wabs, kSigned ? _mm256_sign_epi8(av, wv) : av);
          // one scale for the whole block (all but Q6_K): the scalar product broadcast, the same
          // fp32 value the two-halves form computes in every lane
          const __m256 sc = QT == kGgufQ6_K ? _mm256_mul_ps(s8, _mm256_set1_ps(dx[r * nb + b]))
                                            : _mm256_set1_ps(s0[j] * dx[r * nb + b]);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), sc, acc[r]);
          if (!kSigned) corr[r] += mw[j] * sx[r * nb + b];
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
      v = _mm_add_ps(v, _mm_movehl_ps(v, v));
      v = _mm_add_ss(v, _mm_movehdup_ps(v));
      out[r] = _mm_cvtss_f32(v) + corr[r];
    }
  }

  // The 16-row interleaved layout (kernel_table.h kGgufX16) for Q4_0 and Q4_1. A 64-byte chunk
  // is two 256-bit halves, rows 0-7 and rows 8-15 (dword l: row l's 4 quant bytes), so each half
  // of the group is a pass of its own: per tile its 4 chunk halves unpack to 8 registers of
  // nibbles (register i: weights 4 i .. 4 i + 3 of 8 rows), and per activation row the 8
  // VPMADDUBSWs against that row's 4-byte groups broadcast are summed in int16 (a product pair
  // is at most 2 * 15 * 127, eight of them 30480 < 2^15: exact) before one VPMADDWD makes the 8
  // rows' block sums; then acc += dw * dx * isum + mw * sx in 8 fp32 lanes, the same operations
  // in the same order as avx512_vnni.cpp's dot_x16 (the same bits). Against the file layout's
  // one row at a time this drops the horizontal sums, unpacks a block once for every activation
  // row and applies the scales to 8 rows at once. The second pass re-reads the group from L1.
  // Q8_0's q + 128 has no exact VPMADDUBSW form (a pair reaches 2 * 255 * 127 > 2^15): it runs
  // the portable form, and the loader keeps Q8_0 weights in the file layout (kX16Types).
  static constexpr bool kX16 = true;
  static constexpr uint32_t kX16Types = (1u << kGgufQ4_0) | (1u << kGgufQ4_1);

  // rows r0 .. r0 + RT - 1 of the activations against half h (rows 8 h .. 8 h + 7) of a group
  template <int RT, int base>
  static void x16_half(const uint8_t* group, int64_t nb, const int8_t* qx, int64_t k, const float* dx,
                       const float* sx, int h, float (*y)[kGgufX16Rows]) {
    constexpr int64_t tile_bytes = kGgufX16Rows * gguf_block_bytes(base);
    constexpr int quants = base == kGgufQ4_1 ? 64 : 32;  // offset of the quant chunks in a tile
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[RT];
#pragma GCC unroll 4
    for (int r = 0; r < RT; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* tile = group + b * tile_bytes;
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + 16 * h)));
      const __m256 mw = base == kGgufQ4_1
                            ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + 32 + 16 * h)))
                            : _mm256_mul_ps(dw, _mm256_set1_ps(-8.0f));
      __m256i wq[8];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + quants + 64 * c + 32 * h));
        wq[c] = _mm256_and_si256(raw, low4);
        wq[c + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      }
#pragma GCC unroll 4
      for (int r = 0; r < RT; ++r) {
        const int8_t* xr = qx + r * k + b * kGgufBlock;
        __m256i p[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
          int32_t four;
          std::memcpy(&four, xr + 4 * i, 4);
          p[i] = _mm256_maddubs_epi16(wq[i], _mm256_set1_epi32(four));
        }
        const __m256i p03 = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
        const __m256i p47 = _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7]));
        const __m256i s = _mm256_madd_epi16(_mm256_add_epi16(p03, p47), ones);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(dx[r * nb + b])), acc[r]);
        acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sx[r * nb + b]), acc[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RT; ++r) _mm256_storeu_ps(y[r] + 8 * h, acc[r]);
  }

  template <int R, int QT>
  static void dot_x16(const uint8_t* group, int64_t nb, const int8_t* qx, int64_t k, const float* dx,
                      const float* sx, const int32_t* qsum, float (*y)[kGgufX16Rows]) {
    constexpr int base = gguf_base(QT);
    if constexpr (base == kGgufQ8_0) {
      gguf_x16_dot_portable<R, QT>(group, nb, qx, k, dx, sx, qsum, y);
    } else {
      // at most 4 activation rows a pass: their accumulators and the 8 weight registers fit the
      // 16 registers of AVX2
      constexpr int R0 = R < 4 ? R : 4;
      for (int h = 0; h < 2; ++h) {
        x16_half<R0, base>(group, nb, qx, k, dx, sx, h, y);
        if constexpr (R > 4) x16_half<R - 4, base>(group, nb, qx + 4 * k, k, dx + 4 * nb, sx + 4 * nb, h, y + 4);
      }
    }
  }

  // 8 weights d * q + m (a multiply, then an add: never fused, as gguf_dequantize_range) to out
  static void store8(__m256i q, __m256 d, __m256 m, int out_type, void* out) {
    const __m256 v = _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(q)), m);
    if (out_type == 0) {
      _mm256_storeu_ps(static_cast<float*>(out), v);
      return;
    }
    // float_to_bf16 (bf16.h) in 8 lanes: round to nearest even, NaN kept quiet
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i h = _mm256_blendv_epi8(rounded, quiet, nan);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);  // 8 x u16 in the low 128
    _mm_storeu_si128(static_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
  }

  // Rows [n0, n1) of an interleaved Q4_0 / Q4_1 weight dequantized (the dense path's weight):
  // per tile and half, the 4 chunk halves transposed back into each of the 8 rows' 16 quant
  // bytes (file order), then unpacked and scaled 8 weights at a time. Q8_0: the portable form.
  template <int QT>
  static void dequantize_x16(const GgufArgs& a, int64_t n0, int64_t n1) {
    constexpr int base = gguf_base(QT);
    if constexpr (base == kGgufQ8_0) {
      gguf_dequantize_x16_range<QT>(a, n0, n1);
    } else {
      constexpr int64_t tile_bytes = kGgufX16Rows * gguf_block_bytes(base);
      constexpr int quants = base == kGgufQ4_1 ? 64 : 32;
      const int64_t k = a.k, nb = k / kGgufBlock, row_bytes = gguf_row_bytes(QT, k);
      const size_t esize = a.out_type == 0 ? 4 : 2;
      const __m128i low4 = _mm_set1_epi8(0x0F);
      for (int64_t g = n0 / kGgufX16Rows; g * kGgufX16Rows < n1; ++g) {
        const uint8_t* group = a.w + g * kGgufX16Rows * row_bytes;
        for (int h = 0; h < 2; ++h) {
          const int64_t r0 = g * kGgufX16Rows + 8 * h;
          if (r0 + 8 <= n0 || r0 >= n1) continue;
          for (int64_t b = 0; b < nb; ++b) {
            const uint8_t* tile = group + b * tile_bytes;
            const __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + quants + 32 * h)),
                          c1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + quants + 64 + 32 * h)),
                          c2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + quants + 128 + 32 * h)),
                          c3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + quants + 192 + 32 * h));
            const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1),
                          t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
            // u[i]: row i in the low 128 bits, row i + 4 in the high
            const __m256i u[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                                  _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
            for (int l = 0; l < 8; ++l) {
              const int64_t r = r0 + l;
              if (r < n0 || r >= n1) continue;
              const __m128i bytes = l < 4 ? _mm256_castsi256_si128(u[l]) : _mm256_extracti128_si256(u[l - 4], 1);
              const float d = half(tile + 2 * (8 * h + l));
              const float m = base == kGgufQ4_1 ? half(tile + 32 + 2 * (8 * h + l)) : -8.0f * d;
              const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
              const __m128i lo = _mm_and_si128(bytes, low4), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
              char* out = static_cast<char*>(a.out) + (r * k + b * kGgufBlock) * esize;
              store8(_mm256_cvtepu8_epi32(lo), dv, mv, a.out_type, out);
              store8(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), dv, mv, a.out_type, out + 8 * esize);
              store8(_mm256_cvtepu8_epi32(hi), dv, mv, a.out_type, out + 16 * esize);
              store8(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)), dv, mv, a.out_type, out + 24 * esize);
            }
          }
        }
      }
    }
  }
};

}  // namespace
}  // namespace anycore
