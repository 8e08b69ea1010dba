// The C ABI between the op registration (common/ops.cpp, compiled for the baseline ISA) and
// the kernel variants (one translation unit per ISA level). A variant exports exactly one
// constant-initialised KernelTable object and nothing else that runs at load time, so loading
// the library on a CPU without that ISA is safe; only calling through the table is not.
//
// Index [0] of each function array is fp32, [1] is bf16. Pointers are to row-major data with
// unit stride in the last dimension; row strides are in elements.
#pragma once
#include <cstdint>

namespace anycore {

struct AttnArgs {
  void* out;               // [tokens, heads, head_dim] contiguous
  const void* q;           // [tokens, heads, head_dim] with strides q_st, q_sh
  const void* k;           // [slots, kv_heads, head_dim] with strides k_ss, k_sh
  const void* v;           // same layout as k with strides v_ss, v_sh
  int64_t q_st, q_sh, k_ss, k_sh, v_ss, v_sh;
  const int64_t* q_start;  // [batch + 1]
  const int64_t* seq_lens; // [batch]
  const int64_t* slots;    // [batch, slots_stride]
  int64_t slots_stride;
  const int64_t* items;    // work items, 4 per item: request, kv_head, first query, end query
  int64_t num_items;
  int64_t num_heads, num_kv_heads, head_dim;
  float scale;
  // Split-K ("flash decoding") when there are too few items for the threads: each item's keys
  // are cut into num_splits ranges whose partial softmax states go to `partial` (per unit:
  // rows_per_item * (head_dim + 2) floats), then merged. num_splits == 1: no workspace.
  int64_t num_splits;
  int64_t rows_per_item;  // max rows of an item (GQA group * queries per item)
  float* partial;
  // Optional visibility of the new keys (tree_attention): null = causal (paged_attention). Else
  // [tokens, mask_stride] bytes, row t = query row t: a query sees every key before its
  // request's n new ones, and new key j (0-based among them, j < n <= mask_stride) iff
  // mask[t * mask_stride + j] != 0. A lower-triangular mask is the causal extend.
  const uint8_t* mask;
  int64_t mask_stride;
  // paged_attention_window (0: off). window > 0: the query at position p sees only keys
  // p - window < k <= p, and keys older than every row's window are never read. softcap > 0:
  // scores become softcap * tanh(score / softcap) before the softmax (Gemma 2's logit cap).
  int64_t window;
  float softcap;
};

using RmsNormFn = void (*)(void* out, const void* x, int64_t x_stride, const void* w, int64_t rows,
                           int64_t cols, float eps);
using AddRmsNormFn = void (*)(void* out, void* sum_out, const void* x, int64_t x_stride,
                              const void* res, int64_t res_stride, const void* w, int64_t rows,
                              int64_t cols, float eps);
using RotaryFn = void (*)(void* out, const void* x, int64_t x_stride, const float* cos,
                          const float* sin, int64_t cs_stride, int64_t rows, int64_t heads,
                          int64_t head_dim);
// act(x[:, :d]) * x[:, d:] for x [rows, 2d] (SwiGLU silu_and_mul, GeGLU gelu_tanh_and_mul)
using GatedActFn = void (*)(void* out, const void* x, int64_t x_stride, int64_t rows, int64_t d);
using AttnFn = void (*)(const AttnArgs& args);
// The same attention in pieces, for callers that are already inside a parallel region (the
// batch-1 decode team, decode_team.cpp): units [begin, end) (unit u = item u / num_splits, key
// range u % num_splits) with the caller's scratch of attn_scratch_floats(head_dim) floats, then,
// when num_splits > 1 and every unit is done, the merge of items [begin, end).
using AttnUnitsFn = void (*)(const AttnArgs& args, int64_t begin, int64_t end, float* scratch);
using AttnMergeFn = void (*)(const AttnArgs& args, int64_t begin, int64_t end);
// out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]); small M (decode), w row-major [N, K].
using LinearFn = void (*)(void* out, const void* x, int64_t x_stride, const void* w, const void* bias,
                          int64_t m, int64_t n, int64_t k);

// W8A8 INT8 linear (see anycore/kernels/int8.py for the scheme). Each variant owns the layout of
// its packed weight (pack/unpack/packed_bytes) and of the quantized activations in `workspace`
// (workspace_bytes); ops.cpp only moves bytes. Element types: kInt8Fp32/kInt8Bf16 for float
// activations/outputs; x_type kInt8Raw means x is already int8 [m, k] (scales unused) and
// out_type kInt8Acc writes the exact int32 accumulator [m, n] (tests' debug entry).
enum Int8Type : int { kInt8Fp32 = 0, kInt8Bf16 = 1, kInt8Raw = 2, kInt8Acc = 2 };

struct W8A8Args {
  const void* x;         // [m, k], row stride x_stride (elements), type x_type
  int64_t x_stride;
  int x_type;
  const void* w;         // packed weight (this variant's layout)
  const float* w_scale;  // [n]
  const float* bias;     // [n] fp32 or null
  void* out;             // [m, n] contiguous, type out_type
  int out_type;
  int64_t m, n, k;
  void* workspace;       // workspace_bytes(m, k) bytes, 64-byte aligned
};

struct Int8Kernels {
  int64_t (*packed_bytes)(int64_t n, int64_t k);
  void (*pack)(void* dst, const int8_t* w, int64_t n, int64_t k);  // w: int8 [n, k] row-major
  // rows[0..count) of the [n, k] weight (rows null: 0..count-1) -> int8 [count, k]; the ids
  // are trusted to be in [0, n) (ops.cpp checks them)
  void (*unpack)(int8_t* w, const void* src, int64_t n, int64_t k, const int64_t* rows, int64_t count);
  int64_t (*workspace_bytes)(int64_t m, int64_t k);
  void (*w8a8_linear)(const W8A8Args& args);
  // w8a8_linear in two steps for callers inside their own parallel region, one activation row
  // (m = 1: the batch-1 decode team): quantize it into the workspace, then compute any split
  // of the output columns in 16-column panels [p0, p1) (outputs at their own column).
  void (*quantize_row)(const W8A8Args& args);
  void (*gemm_panels)(const W8A8Args& args, int64_t p0, int64_t p1);
};

// GGUF block-quantized linear (see anycore/kernels/gguf.py and gguf_kquants.py for the block formats
// and the scheme): the weight is the file's own blocks, uint8 [n, gguf_row_bytes(qtype, k)] row-major;
// activations are quantized to int8 per 32-block in `workspace` (gguf_workspace_bytes, gguf_impl.h).
enum GgufType : int {
  kGgufQ4_0 = 2, kGgufQ4_1 = 3, kGgufQ5_0 = 6, kGgufQ8_0 = 8, kGgufQ4_K = 12, kGgufQ5_K = 13, kGgufQ6_K = 14
};

struct GgufArgs {
  const void* x;         // [m, k] fp32 (x_type 0) or bf16 (1), row stride x_stride (elements)
  int64_t x_stride;
  int x_type;
  const uint8_t* w;      // [n] rows of gguf_row_bytes(qtype, k) bytes
  int qtype;
  const float* bias;     // [n] fp32 or null
  void* out;             // [m, n] contiguous, fp32 (out_type 0) or bf16 (1)
  int out_type;
  int64_t m, n, k;
  void* workspace;       // gguf_workspace_bytes(m, k), 64-byte aligned
};

// The 16-row interleaved layout (qtype + kGgufX16, anycore/kernels/gguf.py interleave16): a
// Q4_0, Q4_1 or Q8_0 weight of n = 16 g rows rewritten as g groups of 16 rows, each group k / 32
// tiles, a tile the same 32-block of its 16 rows side by side (the same bytes as the 16 blocks):
//   the 16 fp16 d, (Q4_1) the 16 fp16 m, then 64-byte chunks c (4 for Q4, 8 for Q8_0) whose
//   bytes 4 l .. 4 l + 3 are row l's quant bytes 4 c .. 4 c + 3 (Q4: the nibble bytes, low
//   nibble element 4 c + i, high 4 c + i + 16; Q8_0: the int8 q + 128, stored unsigned).
// One 512-bit load then holds the same 4 weights of 16 rows: a VPDPBUSD against the 4 activation
// bytes broadcast makes 16 outputs' partial sums, and the block's scales are applied to 16 lanes
// at once; a group is one sequential stream. Only types a variant has a micro-kernel for (GgufKernels
// ::interleaved16) get weights in it; every variant still runs every type of it (portable C++).
constexpr int kGgufX16 = 100;
constexpr int64_t kGgufX16Rows = 16;

namespace {  // (internal linkage: each translation unit keeps its own copy, see csrc/README.md)
constexpr int64_t kGgufBlock = 32;  // weights per activation block and per (sub-)block of every format
constexpr bool gguf_is_x16(int qtype) { return qtype >= kGgufX16; }
constexpr int gguf_base(int qtype) { return qtype >= kGgufX16 ? qtype - kGgufX16 : qtype; }
constexpr bool gguf_x16_format(int base) { return base == kGgufQ4_0 || base == kGgufQ4_1 || base == kGgufQ8_0; }
constexpr int64_t gguf_block_bytes(int qtype) {
  if (gguf_is_x16(qtype)) qtype = gguf_x16_format(gguf_base(qtype)) ? gguf_base(qtype) : 0;
  return qtype == kGgufQ4_0   ? 18
         : qtype == kGgufQ4_1 ? 20
         : qtype == kGgufQ5_0 ? 22
         : qtype == kGgufQ8_0 ? 34
         : qtype == kGgufQ4_K ? 144
         : qtype == kGgufQ5_K ? 176
         : qtype == kGgufQ6_K ? 210
                              : 0;
}
constexpr bool gguf_is_k(int qtype) { return qtype == kGgufQ4_K || qtype == kGgufQ5_K || qtype == kGgufQ6_K; }
// weights per block: 256 for the K-quant super-blocks, 32 otherwise
constexpr int64_t gguf_block_elems(int qtype) { return gguf_is_k(qtype) ? 256 : kGgufBlock; }
constexpr int64_t gguf_row_bytes(int qtype, int64_t k) { return k / gguf_block_elems(qtype) * gguf_block_bytes(qtype); }
// IEEE half -> float, exact (also subnormals); portable, for the scales of a block.
inline float gguf_half(const uint8_t* p) {
  const uint16_t h = static_cast<uint16_t>(p[0] | (p[1] << 8));
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {
    const float f = static_cast<float>(man) * (1.0f / 16777216.0f);  // man * 2^-24
    return sign ? -f : f;
  }
  const uint32_t bits = exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112) << 23) | (man << 13));
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
// Sub-block j (0..7) of a Q4_K/Q5_K super-block: its 6-bit scale and minimum from the 12 packed bytes.
inline void gguf_scale_min_k4(int j, const uint8_t* sc, int* s, int* m) {
  if (j < 4) {
    *s = sc[j] & 63, *m = sc[j + 4] & 63;
  } else {
    *s = (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4), *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
  }
}
// 32-block b of a row of type qtype, in the form w[i] = s[i / 16] * q[i] + mw: q unsigned except
// Q8_0's and Q6_K's (signed), s the scales of the two halves (different only in Q6_K). The scale
// products are GGML's (d * sc, dmin * m in fp32), so dequantizing matches the gguf package.
inline void gguf_decode32(const uint8_t* row, int qtype, int64_t b, int32_t* q, float* s, float* mw) {
  if (gguf_is_k(qtype)) {
    const uint8_t* sb = row + (b / 8) * gguf_block_bytes(qtype);
    const int j = static_cast<int>(b % 8);
    if (qtype == kGgufQ6_K) {
      const int h = j / 4, t = j % 4;
      const uint8_t* ql = sb + 64 * h + 32 * (t % 2);
      const uint8_t* qh = sb + 128 + 32 * h;
      for (int l = 0; l < 32; ++l)
        q[l] = (((ql[l] >> (4 * (t / 2))) & 0x0F) | (((qh[l] >> (2 * t)) & 3) << 4)) - 32;
      const float d = gguf_half(sb + 208);
      s[0] = d * static_cast<float>(static_cast<int8_t>(sb[192 + 2 * j]));
      s[1] = d * static_cast<float>(static_cast<int8_t>(sb[193 + 2 * j]));
      *mw = 0.0f;
      return;
    }
    int sc, mn;
    gguf_scale_min_k4(j, sb + 4, &sc, &mn);
    const uint8_t* qs = sb + (qtype == kGgufQ5_K ? 48 : 16) + 32 * (j / 2);
    for (int l = 0; l < 32; ++l) q[l] = (qs[l] >> (4 * (j % 2))) & 0x0F;
    if (qtype == kGgufQ5_K)
      for (int l = 0; l < 32; ++l) q[l] |= ((sb[16 + l] >> j) & 1) << 4;
    s[0] = s[1] = gguf_half(sb) * static_cast<float>(sc);
    *mw = -(gguf_half(sb + 2) * static_cast<float>(mn));
    return;
  }
  const uint8_t* blk = row + b * gguf_block_bytes(qtype);
  const float d = gguf_half(blk);
  s[0] = s[1] = d;
  if (qtype == kGgufQ8_0) {
    for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(blk[2 + i]);
    *mw = 0.0f;
    return;
  }
  const uint8_t* qs = blk + (qtype == kGgufQ4_0 ? 2 : qtype == kGgufQ4_1 ? 4 : 6);
  for (int i = 0; i < 16; ++i) q[i] = qs[i] & 0x0F, q[i + 16] = qs[i] >> 4;
  if (qtype == kGgufQ5_0) {
    const uint32_t qh = static_cast<uint32_t>(blk[2]) | (static_cast<uint32_t>(blk[3]) << 8) |
                        (static_cast<uint32_t>(blk[4]) << 16) | (static_cast<uint32_t>(blk[5]) << 24);
    for (int i = 0; i < 32; ++i) q[i] |= static_cast<int32_t>((qh >> i) & 1u) << 4;
  }
  *mw = qtype == kGgufQ4_1 ? gguf_half(blk + 2) : qtype == kGgufQ4_0 ? -8.0f * d : -16.0f * d;
}
// 32-block b of a row -> 32 floats (w = s * q + mw).
inline void gguf_dequantize_block32(const uint8_t* row, int qtype, int64_t b, float* out) {
  int32_t q[kGgufBlock];
  float s[2], mw;
  gguf_decode32(row, qtype, b, q, s, &mw);
  for (int i = 0; i < kGgufBlock; ++i) out[i] = s[i / 16] * static_cast<float>(q[i]) + mw;
}
// Lane l's 32-block of an interleaved tile (see kGgufX16), as gguf_decode32 gives a row's.
inline void gguf_decode32_x16(const uint8_t* tile, int base, int l, int32_t* q, float* s, float* mw) {
  const float d = gguf_half(tile + 2 * l);
  s[0] = s[1] = d;
  if (base == kGgufQ8_0) {
    for (int i = 0; i < 32; ++i) q[i] = static_cast<int32_t>(tile[32 + (i / 4) * 64 + 4 * l + i % 4]) - 128;
    *mw = 0.0f;
    return;
  }
  const uint8_t* qs = tile + (base == kGgufQ4_1 ? 64 : 32);
  for (int i = 0; i < 16; ++i) {
    const uint8_t byte = qs[(i / 4) * 64 + 4 * l + i % 4];
    q[i] = byte & 0x0F, q[i + 16] = byte >> 4;
  }
  *mw = base == kGgufQ4_1 ? gguf_half(tile + 32 + 2 * l) : -8.0f * d;
}
// workspace of one call: int8 qx [m, k], then fp32 dx and sx and int32 sum(qx) [m, k / 32] each
constexpr int64_t gguf_workspace_bytes(int64_t m, int64_t k) { return m * k + 12 * m * (k / 32) + 64; }
}  // namespace

struct GgufKernels {
  void (*gguf_linear)(const GgufArgs& args);  // null: the variant has none (generic's runs)
  // gguf_linear in two steps for callers inside their own parallel region (the batch-1 decode
  // team): quantize the m activation rows into the workspace, then any range [n0, n1) of the
  // output rows (each written at its own column of out)
  void (*quantize_rows)(const GgufArgs& args);
  void (*gemv_rows)(const GgufArgs& args, int64_t n0, int64_t n1);
  // weight rows [n0, n1) dequantized into out ([n, k] of out_type): gguf_linear's dense path for
  // more than gguf_int8_max_rows() activation rows (ops.h; x, m, bias and workspace unused)
  void (*dequantize_rows)(const GgufArgs& args, int64_t n0, int64_t n1);
  // file types (bit t: type t) with a micro-kernel of the variant's own for their 16-row
  // interleaved layout (kGgufX16); 0: none
  uint32_t interleaved16;
};

// The kernels a vector variant (kernels_impl.h, ANYCORE_DEFINE_TABLE) writes once over its vector
// type V, by family: X(table field, function type, kernel template<V, T>). Each becomes a
// [fp32, bf16] pair in KernelTable and is instantiated for every vector variant; a new op of a
// family is one line here plus its kernel in that family's header (elementwise_kernels.h,
// attention_kernels.h, gemv_kernels.h). Field names are the op names of
// anycore/kernels/ops.py where the entry is an op (attention_units/_merge are attention's parts).
#define ANYCORE_ELEMENTWISE_KERNELS(X)                     \
  X(rms_norm, RmsNormFn, rms_norm_kernel)                  \
  X(add_rms_norm, AddRmsNormFn, add_rms_norm_kernel)       \
  X(apply_rotary, RotaryFn, rotary_kernel)                 \
  X(silu_and_mul, GatedActFn, silu_and_mul_kernel)          \
  X(gemma_rms_norm, RmsNormFn, gemma_rms_norm_kernel)      \
  X(gelu_tanh_and_mul, GatedActFn, gelu_tanh_and_mul_kernel)
// tree_attention and paged_attention_window are paged_attention's kernel with AttnArgs::mask,
// ::window or ::softcap set: one kernel, listed under each op name so a variant's table says it
// fills each op.
#define ANYCORE_ATTENTION_KERNELS(X)                     \
  X(paged_attention, AttnFn, paged_attention_kernel)     \
  X(tree_attention, AttnFn, paged_attention_kernel)      \
  X(paged_attention_window, AttnFn, paged_attention_kernel) \
  X(attention_units, AttnUnitsFn, attention_units_kernel) \
  X(attention_merge, AttnMergeFn, attention_merge_kernel)
#define ANYCORE_GEMV_KERNELS(X) X(linear, LinearFn, linear_kernel)
#define ANYCORE_VECTOR_KERNELS(X) ANYCORE_ELEMENTWISE_KERNELS(X) ANYCORE_ATTENTION_KERNELS(X) ANYCORE_GEMV_KERNELS(X)

struct KernelTable {
  const char* name;
  // a null entry falls back to the generic variant's (ANYCORE_PICK in ops.h)
#define ANYCORE_TABLE_FIELD(FIELD, FN, KERNEL) FN FIELD[2];
  ANYCORE_VECTOR_KERNELS(ANYCORE_TABLE_FIELD)
#undef ANYCORE_TABLE_FIELD
  Int8Kernels int8;  // all null: the variant has no int8 kernels (ops.cpp then uses generic's)
  GgufKernels gguf;  // null: no GGUF kernels of its own (ops.cpp then uses generic's)
};

namespace {

// The table of a variant with only int8 (and GGUF) kernels (every other entry null). constexpr, and the
// variant's table is declared constexpr with it, so it is constant-initialised: no load-time code.
constexpr KernelTable int8_only_table(const char* name, Int8Kernels int8, GgufKernels gguf = {}) {
  KernelTable t{};
  t.name = name;
  t.int8 = int8;
  t.gguf = gguf;
  return t;
}

}  // namespace

// Attention scratch limits shared by the work splitter and the kernels.
constexpr int64_t kMaxHeadDim = 512;
constexpr int64_t kMaxAttnRows = 64;  // (queries per item) * (heads per kv head)
// a request with at most this many new tokens is attended as decode rows are (attention_kernels.h
// attn_item): speculative verifies and trees up to 1 + 15 tokens
constexpr int64_t kDecodeShapedQueries = 16;
constexpr int64_t kKeyBlock = 32;
constexpr int64_t kMaxVecWidth = 16;  // fp32 lanes of the widest vector type V

// Floats of attention scratch one thread needs (q, accumulators, scores, a K and a V block).
constexpr int64_t attn_scratch_floats(int64_t head_dim) {
  const int64_t dpad = (head_dim + kMaxVecWidth - 1) / kMaxVecWidth * kMaxVecWidth;
  return 2 * kMaxAttnRows * dpad + kMaxAttnRows * kKeyBlock + 2 * dpad * kKeyBlock + kMaxVecWidth;
}

}  // namespace anycore
