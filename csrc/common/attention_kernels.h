// Paged attention over a vector type V and a storage type T (ANYCORE_ATTENTION_KERNELS in
// kernel_table.h): the whole op, and its parts (units of work, the split-K merge) for callers
// already inside a parallel region. The work items and the split count are planned by
// attention_plan.h (baseline code, shared with the decode team).
//
// One work item = (request, kv head, block of queries); its rows are (query, head in group)
// pairs sharing the same K/V. Keys are visited in blocks of kKeyBlock with an online softmax
// (running max m, running sum l, unnormalised accumulator acc), so scratch is bounded.
//
// Visibility: row r sees keys up to pos[r], its last visible key (the query's own position in a
// causal extend). With AttnArgs::mask (tree_attention) pos[r] is the last new key the mask
// shows it, and keys of the new ones inside [0, pos[r]] that it hides get score -inf and
// probability exactly 0 (the clamped exp alone would leave ~1e-38). Without a mask every step
// is the causal kernel's, operation for operation: paged_attention's results stay bit-identical
// (the decode team and the native stack compare against them). AttnArgs::window gives row r a
// first visible key lo[r] too: the keys before it are hidden as the mask hides keys, and the
// item's key range starts at the smallest lo[r]. AttnArgs::softcap caps each score before any
// of that (the reference's order: cap, then mask).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernel_helpers.h"
#include "kernel_table.h"
#include "parallel.h"

namespace anycore {
namespace {

template <typename V, typename T>
inline float dot_qk(const float* qf, const T* qraw, const T* k, int64_t d) {
  if constexpr (V::kBf16Dot && kIsBf16<T>) {
    return V::dot_bf16(qraw, k, d);
  } else {
    V acc = V::zero();
    for (int64_t i = 0; i < d; i += V::W) acc = V::fma(V::load(qf + i), load_any<V>(k + i, d - i), acc);
    return acc.sum();
  }
}

// A vector type with V::dot_pairs (bf16 pairs multiplied and summed into fp32 lanes: VDPBF16PS,
// BFDOT) runs the blocked path's two products on bf16 pairs, half the instructions of fp32 FMAs:
// scores from K laid out as pairs of head dimensions per key, P V from V laid out as pairs of
// keys per head dimension, with P rounded to bf16 (as a bf16 GEMM of P and V would). The scores
// lose nothing (bf16 products are exact in fp32); the output differs from the fp32 path by about
// a bf16 ulp of P.
template <typename V, typename = void>
inline constexpr bool kPairDot = false;
template <typename V>
inline constexpr bool kPairDot<V, std::void_t<decltype(V::kBf16PairDot)>> = V::kBf16PairDot;

inline uint32_t bf16_pair(const bf16* p) {  // p[0] in the low half, p[1] in the high half
  uint32_t u;
  std::memcpy(&u, p, sizeof(u));
  return u;
}

// pairs: K and V of one key block (bn <= kKeyBlock keys) into the pair layouts, then the scaled
// scores of every row for the block's kKeyBlock columns into sc (as the fp32 blocked path).
template <typename V>
void pair_block_scores(const AttnArgs& a, const bf16* const* kp, const bf16* const* vp, int64_t bn, int64_t rows,
                       int64_t kb, const int64_t* pos, const bf16* const* qrow, uint32_t* kt2, bf16* vb2,
                       int64_t dpad, float* sc) {
  const int64_t D = a.head_dim, half = D / 2;
  // Zeros where no key writes but a loop reads: the score columns past a short last block (never
  // used, but kept finite) and the padded head dimensions of V (multiplied by p, so they must be
  // finite). The odd key of a short block's last pair is zeros too (below), with p == 0.
  if (bn < kKeyBlock) std::fill(kt2, kt2 + half * kKeyBlock, 0u);
  if (dpad != D) std::fill(vb2, vb2 + kKeyBlock * dpad, bf16{});
  for (int64_t b = 0; b < bn; ++b) {
    for (int64_t i = 0; i < half; ++i) kt2[i * kKeyBlock + b] = bf16_pair(kp[b] + 2 * i);
  }
  static const bf16 kZeros[kMaxHeadDim] = {};
  for (int64_t b = 0; b < bn; b += 2) {  // keys b and b + 1 (zeros past the block's last key)
    const bf16* v0 = vp[b];
    const bf16* v1 = b + 1 < bn ? vp[b + 1] : kZeros;
    bf16* dst = vb2 + (b / 2) * dpad * 2;
    int64_t d = 0;
    for (; d + V::W <= D; d += V::W) V::zip_bf16(v0 + d, v1 + d, dst + 2 * d);
    for (; d < D; ++d) dst[2 * d] = v0[d], dst[2 * d + 1] = v1[d];
  }
  // four rows at a time: eight independent dot chains (two per row) share each K load, enough
  // to cover the dot instruction's latency (two rows' four chains left it idle about a third of
  // the time). A short last group repeats its last row (the same values, stored again).
  const V vscale = V::set1(a.scale);
  for (int64_t r = 0; r < rows; r += 4) {
    int64_t rr[4];
    for (int64_t j = 0; j < 4; ++j) rr[j] = r + j < rows ? r + j : rows - 1;
    if (std::max(std::max(pos[rr[0]], pos[rr[1]]), std::max(pos[rr[2]], pos[rr[3]])) < kb) continue;  // none sees a key here
    const bf16* q0 = qrow[rr[0]];
    const bf16* q1 = qrow[rr[1]];
    const bf16* q2 = qrow[rr[2]];
    const bf16* q3 = qrow[rr[3]];
    V a0 = V::zero(), a1 = V::zero(), b0 = V::zero(), b1 = V::zero();
    V c0 = V::zero(), c1 = V::zero(), d0 = V::zero(), d1 = V::zero();
    for (int64_t i = 0; i < half; ++i) {
      const bf16* k0 = reinterpret_cast<const bf16*>(kt2 + i * kKeyBlock);  // keys 0..W-1, then W..2W-1
      const bf16* k1 = k0 + 2 * V::W;
      const uint32_t x = bf16_pair(q0 + 2 * i), y = bf16_pair(q1 + 2 * i);
      const uint32_t z = bf16_pair(q2 + 2 * i), w = bf16_pair(q3 + 2 * i);
      a0 = V::dot_pairs(a0, x, k0);
      a1 = V::dot_pairs(a1, x, k1);
      b0 = V::dot_pairs(b0, y, k0);
      b1 = V::dot_pairs(b1, y, k1);
      c0 = V::dot_pairs(c0, z, k0);
      c1 = V::dot_pairs(c1, z, k1);
      d0 = V::dot_pairs(d0, w, k0);
      d1 = V::dot_pairs(d1, w, k1);
    }
    (d0 * vscale).store(sc + rr[3] * kKeyBlock);
    (d1 * vscale).store(sc + rr[3] * kKeyBlock + V::W);
    (c0 * vscale).store(sc + rr[2] * kKeyBlock);
    (c1 * vscale).store(sc + rr[2] * kKeyBlock + V::W);
    (b0 * vscale).store(sc + rr[1] * kKeyBlock);
    (b1 * vscale).store(sc + rr[1] * kKeyBlock + V::W);
    (a0 * vscale).store(sc + rr[0] * kKeyBlock);
    (a1 * vscale).store(sc + rr[0] * kKeyBlock + V::W);
  }
}

// One pass of pair_block_pv over NC head-dimension vectors from d0, for rows ra and rb. NC is a
// compile-time count so the 2 x NC accumulators stay in registers (a run-time count kept them on
// the stack: a store and a reload around every dot).
template <typename V, int NC>
inline void pair_pv_pass(int64_t npairs, const bf16* pa, const bf16* pb, float alpha_a, float alpha_b,
                         const bf16* vb2, int64_t dpad, int64_t d0, float* acc_a, float* acc_b) {
  V xa[NC], xb[NC];
  for (int c = 0; c < NC; ++c) {
    xa[c] = V::load(acc_a + d0 + c * V::W) * V::set1(alpha_a);
    xb[c] = V::load(acc_b + d0 + c * V::W) * V::set1(alpha_b);
  }
  for (int64_t j = 0; j < npairs; ++j) {
    const uint32_t x = bf16_pair(pa + 2 * j), y = bf16_pair(pb + 2 * j);
    const bf16* vj = vb2 + (j * dpad + d0) * 2;
    for (int c = 0; c < NC; ++c) {
      xa[c] = V::dot_pairs(xa[c], x, vj + c * 2 * V::W);
      xb[c] = V::dot_pairs(xb[c], y, vj + c * 2 * V::W);
    }
  }
  for (int c = 0; c < NC; ++c) {  // b last: it is a on an odd last row
    xa[c].store(acc_a + d0 + c * V::W);
    xb[c].store(acc_b + d0 + c * V::W);
  }
}

// pairs: acc = acc * alpha + P V for every row, P rounded to bf16 and paired by keys. Masked keys
// have p == 0 (and zero V) and masked rows alpha == 1, so every row runs the same loop.
template <typename V>
void pair_block_pv(int64_t bn, int64_t rows, int64_t kb, const int64_t* pos, const float* alpha, const bf16* vb2,
                   int64_t dpad, const float* sc, float* acc) {
  constexpr int64_t kChunks = 4;  // head-dimension vectors per pass: 2 x 4 independent chains
  const int64_t npairs = (bn + 1) / 2;
  alignas(64) bf16 pa[kKeyBlock], pb[kKeyBlock];
  for (int64_t r = 0; r < rows; r += 2) {
    const int64_t r1 = r + 1 < rows ? r + 1 : r;
    if (std::max(pos[r], pos[r1]) < kb) continue;
    for (int64_t b = 0; b < kKeyBlock; b += V::W) {
      V::load(sc + r * kKeyBlock + b).store(pa + b);
      V::load(sc + r1 * kKeyBlock + b).store(pb + b);
    }
    float* acc_a = acc + r * dpad;
    float* acc_b = acc + r1 * dpad;
    for (int64_t d0 = 0; d0 < dpad; d0 += kChunks * V::W) {
      switch (std::min<int64_t>(kChunks, (dpad - d0) / V::W)) {
        case 4: pair_pv_pass<V, 4>(npairs, pa, pb, alpha[r], alpha[r1], vb2, dpad, d0, acc_a, acc_b); break;
        case 3: pair_pv_pass<V, 3>(npairs, pa, pb, alpha[r], alpha[r1], vb2, dpad, d0, acc_a, acc_b); break;
        case 2: pair_pv_pass<V, 2>(npairs, pa, pb, alpha[r], alpha[r1], vb2, dpad, d0, acc_a, acc_b); break;
        default: pair_pv_pass<V, 1>(npairs, pa, pb, alpha[r], alpha[r1], vb2, dpad, d0, acc_a, acc_b); break;
      }
    }
  }
}

template <typename V, typename T>
void attn_item(const AttnArgs& a, const int64_t* item, int64_t split, float* scratch) {
  static_assert(kKeyBlock == 2 * V::W, "the blocked path handles a key block as two vectors");
  const int64_t req = item[0], kvh = item[1], q0 = item[2], q1 = item[3];
  const int64_t D = a.head_dim, group = a.num_heads / a.num_kv_heads;
  const int64_t rows = (q1 - q0) * group;
  const int64_t dpad = (D + V::W - 1) / V::W * V::W;
  const int64_t seq_len = a.seq_lens[req];
  const int64_t qbase = a.q_start[req];
  const int64_t n_new = a.q_start[req + 1] - qbase;
  const int64_t first_pos = seq_len - n_new;  // the first new key
  const int64_t* slots = a.slots + req * a.slots_stride;
  const T* q = static_cast<const T*>(a.q);
  const T* kc = static_cast<const T*>(a.k);
  const T* vc = static_cast<const T*>(a.v);
  T* out = static_cast<T*>(a.out);

  float* qf = scratch;                     // [rows, dpad]
  float* acc = qf + kMaxAttnRows * dpad;   // [rows, dpad]
  float* sc = acc + kMaxAttnRows * dpad;   // [rows, kKeyBlock] scores, then probabilities
  float* kt = sc + kMaxAttnRows * kKeyBlock;  // [dpad, kKeyBlock] K block transposed (fp32)
  float* vb = kt + dpad * kKeyBlock;          // [kKeyBlock, dpad] V block (fp32)
  // Many rows (prefill, big GQA groups): convert the K/V block to fp32 once and compute 16
  // scores per FMA chain from K transposed (no horizontal sums). Few rows (decode): one dot
  // product per (row, key) straight from the cache. Every path computes each row on its own
  // (no sum runs across rows), but the paths round differently; a request with at most
  // kDecodeShapedQueries new tokens (a speculative verify, a tree) takes the path a one-token
  // decode of the same model takes (its rows: one GQA group), so each verified row is bit for
  // bit the row plain decoding would have computed and greedy speculation stays lossless in bf16.
  const bool blocked = n_new <= kDecodeShapedQueries ? group >= 8 : rows >= 8;
  bool pairs = false;  // the blocked path on bf16 pairs (kPairDot)
  if constexpr (kPairDot<V> && kIsBf16<T>) pairs = blocked && D % 2 == 0;
  uint32_t* kt2 = reinterpret_cast<uint32_t*>(kt);  // pairs: [D / 2, kKeyBlock] K pairs per key
  bf16* vb2 = reinterpret_cast<bf16*>(vb);           // pairs: [kKeyBlock / 2, dpad, 2] V per key pair
  float m[kMaxAttnRows], l[kMaxAttnRows], alpha[kMaxAttnRows];
  int64_t pos[kMaxAttnRows], lo[kMaxAttnRows];  // each row's last and first visible key
  const T* qrow[kMaxAttnRows];
  for (int64_t r = 0; r < rows; ++r) {
    int64_t qi = q0 + r / group, h = kvh * group + r % group;
    qrow[r] = q + (qbase + qi) * a.q_st + h * a.q_sh;
    for (int64_t i = 0; i < dpad; ++i) qf[r * dpad + i] = i < D ? to_float(qrow[r][i]) : 0.0f;
    for (int64_t i = 0; i < dpad; ++i) acc[r * dpad + i] = 0.0f;
    m[r] = -INFINITY;
    l[r] = 0.0f;
    pos[r] = first_pos + qi;
    if (a.mask) {  // the last new key the mask shows this query (first_pos - 1: none)
      const uint8_t* mr = a.mask + (qbase + qi) * a.mask_stride;
      int64_t j = n_new - 1;
      while (j >= 0 && !mr[j]) --j;
      pos[r] = first_pos + j;
    }
    lo[r] = a.window > 0 ? std::max<int64_t>(0, pos[r] - a.window + 1) : 0;
  }
  // keys [kv_begin, kv_end): from the first key any row sees through the last (first_pos + q1 causal)
  int64_t kv_begin = 0, kv_end = first_pos + q1;
  if (a.mask) {
    kv_end = 0;
    for (int64_t r = 0; r < rows; ++r) kv_end = std::max(kv_end, pos[r] + 1);
  }
  if (a.window > 0) {
    kv_begin = kv_end;
    for (int64_t r = 0; r < rows; ++r) kv_begin = std::min(kv_begin, lo[r]);
  }
  if (a.num_splits > 1) {  // this unit's share of the keys, in whole key blocks
    const int64_t base = kv_begin;
    const int64_t blocks = (kv_end - base + kKeyBlock - 1) / kKeyBlock;
    const int64_t per = (blocks + a.num_splits - 1) / a.num_splits;
    kv_begin = base + split * per * kKeyBlock;
    kv_end = std::min(kv_end, base + (split + 1) * per * kKeyBlock);
  }
  const T* kp[kKeyBlock];
  const T* vp[kKeyBlock];
  for (int64_t kb = kv_begin; kb < kv_end; kb += kKeyBlock) {
    const int64_t bn = kv_end - kb < kKeyBlock ? kv_end - kb : kKeyBlock;
    for (int64_t b = 0; b < bn; ++b) {
      int64_t slot = slots[kb + b];
      kp[b] = kc + slot * a.k_ss + kvh * a.k_sh;
      vp[b] = vc + slot * a.v_ss + kvh * a.v_sh;
    }
    if (pairs) {
      if constexpr (kPairDot<V> && kIsBf16<T>) pair_block_scores<V>(a, kp, vp, bn, rows, kb, pos, qrow, kt2, vb2, dpad, sc);
    } else if (blocked) {
      // a short last block: the score loop reads all kKeyBlock columns, so zero the unused ones
      if (bn < kKeyBlock) std::fill(kt, kt + dpad * kKeyBlock, 0.0f);
      for (int64_t b = 0; b < bn; ++b) {
        for (int64_t d = 0; d < D; ++d) kt[d * kKeyBlock + b] = to_float(kp[b][d]);
        for (int64_t d = 0; d < dpad; d += V::W) load_any<V>(vp[b] + d, D - d).store(vb + b * dpad + d);
      }
      // scores of two rows x kKeyBlock keys: four independent FMA chains share each K load
      const V vscale = V::set1(a.scale);
      for (int64_t r = 0; r < rows; r += 2) {
        const int64_t r1 = r + 1 < rows ? r + 1 : r;
        if (std::max(pos[r], pos[r1]) < kb) continue;  // both rows see nothing here
        const float* qa = qf + r * dpad;
        const float* qb = qf + r1 * dpad;
        V a0 = V::zero(), a1 = V::zero(), b0 = V::zero(), b1 = V::zero();
        for (int64_t d = 0; d < D; ++d) {
          const V k0 = V::load(kt + d * kKeyBlock), k1 = V::load(kt + d * kKeyBlock + V::W);
          const V x = V::set1(qa[d]), y = V::set1(qb[d]);
          a0 = V::fma(x, k0, a0);
          a1 = V::fma(x, k1, a1);
          b0 = V::fma(y, k0, b0);
          b1 = V::fma(y, k1, b1);
        }
        (a0 * vscale).store(sc + r * kKeyBlock);
        (a1 * vscale).store(sc + r * kKeyBlock + V::W);
        (b0 * vscale).store(sc + r1 * kKeyBlock);
        (b1 * vscale).store(sc + r1 * kKeyBlock + V::W);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* p = sc + r * kKeyBlock;
      int64_t visible = pos[r] - kb + 1;  // keys kb..pos[r]
      if (visible > bn) visible = bn;
      alpha[r] = 1.0f;
      if (visible <= 0 || lo[r] >= kb + visible) {  // nothing of this block is in the row's view
        if (blocked) std::fill(p, p + kKeyBlock, 0.0f);
        continue;
      }
      if (a.softcap > 0.0f && blocked) {
        for (int64_t b = 0; b < visible; ++b) p[b] = a.softcap * std::tanh(p[b] / a.softcap);
      }
      // masked or windowed: which of keys kb .. kb + visible - 1 row r sees (the mask hides only
      // new keys, the window only keys before lo[r])
      bool hides = false;
      bool see[kKeyBlock];
      if ((a.mask && kb + visible > first_pos) || lo[r] > kb) {
        const uint8_t* mr = a.mask ? a.mask + (qbase + q0 + r / group) * a.mask_stride : nullptr;
        for (int64_t b = 0; b < visible; ++b) {
          see[b] = kb + b >= lo[r] && (kb + b < first_pos || !mr || mr[kb + b - first_pos]);
          hides |= !see[b];
        }
        if (hides && blocked) {
          for (int64_t b = 0; b < visible; ++b) p[b] = see[b] ? p[b] : -INFINITY;
        }
      }
      float mb = -INFINITY;
      int64_t b0 = 0;
      if (blocked) {  // scores are there already: vector max over whole vectors, scalar tail
        if (visible >= V::W) {
          V vmax = V::load(p);
          for (b0 = V::W; b0 + V::W <= visible; b0 += V::W) vmax = V::max(vmax, V::load(p + b0));
          mb = vmax.hmax();
        }
      }
      for (int64_t b = b0; b < visible; ++b) {
        if (!blocked) {
          if (hides && !see[b]) {
            p[b] = -INFINITY;
          } else {
            p[b] = dot_qk<V, T>(qf + r * dpad, qrow[r], kp[b], D) * a.scale;
            if (a.softcap > 0.0f) p[b] = a.softcap * std::tanh(p[b] / a.softcap);
          }
        }
        mb = p[b] > mb ? p[b] : mb;
      }
      if (hides && mb == -INFINITY) {  // the mask hides every key of this block from row r
        if (blocked) std::fill(p, p + kKeyBlock, 0.0f);
        continue;
      }
      const float m_new = mb > m[r] ? mb : m[r];
      alpha[r] = std::exp(m[r] - m_new);
      const V vm = V::set1(m_new);
      V psum = V::zero();
      for (int64_t b = 0; b < visible; b += V::W) {
        int64_t n = visible - b;
        V e = (load_any<V>(p + b, n) - vm).exp();
        store_any(e, p + b, n);
        if (hides) {  // hidden keys: probability 0, then the sum of what is left
          for (int64_t i = b; i < b + std::min<int64_t>(n, V::W); ++i) p[i] = see[i] ? p[i] : 0.0f;
          e = load_any<V>(p + b, n);
        } else if (n < V::W) {
          e = V::template load_n<float>(p + b, static_cast<int>(n));  // zero the tail
        }
        psum = psum + e;
      }
      if (blocked) std::fill(p + visible, p + kKeyBlock, 0.0f);
      l[r] = l[r] * alpha[r] + psum.sum();
      m[r] = m_new;
      if (blocked) continue;
      const V va = V::set1(alpha[r]);
      float* ar = acc + r * dpad;
      for (int64_t d = 0; d < D; d += V::W) {
        V s = V::load(ar + d) * va;
        for (int64_t b = 0; b < visible; ++b) s = V::fma(V::set1(p[b]), load_any<V>(vp[b] + d, D - d), s);
        s.store(ar + d);
      }
    }
    if (pairs) {
      if constexpr (kPairDot<V> && kIsBf16<T>) pair_block_pv<V>(bn, rows, kb, pos, alpha, vb2, dpad, sc, acc);
    } else if (blocked) {
      // acc = acc * alpha + P V for two rows at a time, even/odd keys in separate chains;
      // masked keys have p == 0 and masked rows alpha == 1, so every row runs the same loop.
      for (int64_t r = 0; r < rows; r += 2) {
        const int64_t r1 = r + 1 < rows ? r + 1 : r;
        if (std::max(pos[r], pos[r1]) < kb) continue;
        const float* pa = sc + r * kKeyBlock;
        const float* pb = sc + r1 * kKeyBlock;
        for (int64_t d = 0; d < dpad; d += V::W) {
          V xa = V::load(acc + r * dpad + d) * V::set1(alpha[r]), xa2 = V::zero();
          V xb = V::load(acc + r1 * dpad + d) * V::set1(alpha[r1]), xb2 = V::zero();
          int64_t b = 0;
          for (; b + 1 < bn; b += 2) {
            const V v0 = V::load(vb + b * dpad + d), v1 = V::load(vb + (b + 1) * dpad + d);
            xa = V::fma(V::set1(pa[b]), v0, xa);
            xb = V::fma(V::set1(pb[b]), v0, xb);
            xa2 = V::fma(V::set1(pa[b + 1]), v1, xa2);
            xb2 = V::fma(V::set1(pb[b + 1]), v1, xb2);
          }
          if (b < bn) {
            const V v0 = V::load(vb + b * dpad + d);
            xa = V::fma(V::set1(pa[b]), v0, xa);
            xb = V::fma(V::set1(pb[b]), v0, xb);
          }
          (xb + xb2).store(acc + r1 * dpad + d);
          (xa + xa2).store(acc + r * dpad + d);  // after r1's store: r1 == r on an odd last row
        }
      }
    }
  }
  if (a.num_splits > 1) {  // unnormalised state for attn_merge: acc [rows, D], then m, l
    float* dst = a.partial + ((item - a.items) / 4 * a.num_splits + split) * a.rows_per_item * (D + 2);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t d = 0; d < D; ++d) dst[r * (D + 2) + d] = acc[r * dpad + d];
      dst[r * (D + 2) + D] = m[r];
      dst[r * (D + 2) + D + 1] = l[r];
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    int64_t qi = q0 + r / group, h = kvh * group + r % group;
    T* o = out + ((qbase + qi) * a.num_heads + h) * D;
    const V inv = V::set1(l[r] > 0.0f ? 1.0f / l[r] : 0.0f);
    for (int64_t d = 0; d < D; d += V::W) store_any(V::load(acc + r * dpad + d) * inv, o + d, D - d);
  }
}

// Combines the num_splits partial states of one item: rescale each by exp(m_s - max m).
template <typename V, typename T>
void attn_merge(const AttnArgs& a, int64_t it) {
  const int64_t* item = a.items + 4 * it;
  const int64_t kvh = item[1], q0 = item[2], q1 = item[3], D = a.head_dim;
  const int64_t group = a.num_heads / a.num_kv_heads, rows = (q1 - q0) * group;
  const int64_t qbase = a.q_start[item[0]], stride = a.rows_per_item * (D + 2);
  const float* src = a.partial + it * a.num_splits * stride;
  T* out = static_cast<T*>(a.out);
  float acc[kMaxHeadDim];
  for (int64_t r = 0; r < rows; ++r) {
    float mx = -INFINITY, l = 0.0f;
    for (int64_t s = 0; s < a.num_splits; ++s) mx = std::max(mx, src[s * stride + r * (D + 2) + D]);
    for (int64_t d = 0; d < D; ++d) acc[d] = 0.0f;
    for (int64_t s = 0; s < a.num_splits; ++s) {
      const float* p = src + s * stride + r * (D + 2);
      if (p[D + 1] <= 0.0f) continue;  // a split with no visible keys
      const float w = std::exp(p[D] - mx);
      l += p[D + 1] * w;
      for (int64_t d = 0; d < D; ++d) acc[d] += p[d] * w;
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    T* o = out + ((qbase + q0 + r / group) * a.num_heads + kvh * group + r % group) * D;
    for (int64_t d = 0; d < D; ++d) o[d] = from_float<T>(acc[d] * inv);
  }
}

template <typename V, typename T>
void attention_units_kernel(const AttnArgs& a, int64_t begin, int64_t end, float* scratch) {
  static_assert(V::W <= kMaxVecWidth, "attn_scratch_floats assumes at most kMaxVecWidth lanes");
  const int64_t splits = a.num_splits > 1 ? a.num_splits : 1;
  for (int64_t u = begin; u < end; ++u) attn_item<V, T>(a, a.items + 4 * (u / splits), u % splits, scratch);
}

template <typename V, typename T>
void attention_merge_kernel(const AttnArgs& a, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) attn_merge<V, T>(a, i);
}

template <typename V, typename T>
void paged_attention_kernel(const AttnArgs& a) {
  const int64_t splits = a.num_splits > 1 ? a.num_splits : 1, units = a.num_items * splits;
  const int64_t max_threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int nt = static_cast<int>(units < max_threads ? units : max_threads);
#pragma omp parallel num_threads(nt > 0 ? nt : 1)
  {
    float* scratch = static_cast<float*>(std::malloc(sizeof(float) * attn_scratch_floats(a.head_dim)));
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < units; ++u) attention_units_kernel<V, T>(a, u, u + 1, scratch);
    std::free(scratch);
    if (splits > 1) {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < a.num_items; ++i) attn_merge<V, T>(a, i);
    }
  }
}

}  // namespace
}  // namespace anycore
