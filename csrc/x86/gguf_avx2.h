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
        const float d = gguf_half(blk + 208);
        for (int j = 0; j < kSub; ++j)
          s0[j] = d * static_cast<float>(static_cast<int8_t>(blk[192 + 2 * j])),
          s1[j] = d * static_cast<float>(static_cast<int8_t>(blk[193 + 2 * j])), mw[j] = 0.0f;
      } else if constexpr (gguf_is_k(QT)) {
        const float d = gguf_half(blk), dmin = gguf_half(blk + 2);
        for (int j = 0; j < kSub; ++j) {
          int sc, mn;
          gguf_scale_min_k4(j, blk + 4, &sc, &mn);
          s0[j] = s1[j] = d * static_cast<float>(sc), mw[j] = -(dmin * static_cast<float>(mn));
        }
      } else {
        const float d = gguf_half(blk);
        s0[0] = s1[0] = d;
        mw[0] = QT == kGgufQ4_1 ? gguf_half(blk + 2) : QT == kGgufQ4_0 ? -8.0f * d : QT == kGgufQ5_0 ? -16.0f * d : 0.0f;
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
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(s8, _mm256_set1_ps(dx[r * nb + b])), acc[r]);
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
};

}  // namespace
}  // namespace anycore
