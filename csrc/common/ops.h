// The torch-facing ops shared by the baseline translation units (ops.cpp, decoder_layer.cpp).
// Each checks shapes and dtypes, then calls the kernel variant with index `impl` (see
// `variants()`); the caller (anycore/kernels/dispatch.py) decides which index the CPU can run.
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <optional>
#include <tuple>

#include "attention_plan.h"
#include "decoder_layout.h"
#include "kernel_table.h"

namespace anycore::ops {

const KernelTable& table(int64_t impl);
const KernelTable& generic_table();  // index 0: every op, portable C++

// A null entry means the variant does not specialise that op/dtype: use the generic one.
#define ANYCORE_PICK(FIELD, IMPL, DT) \
  (::anycore::ops::table(IMPL).FIELD[DT] ? ::anycore::ops::table(IMPL).FIELD[DT] : ::anycore::ops::generic_table().FIELD[DT])

int dtype_index(const at::Tensor& t);  // 0: float32, 1: bfloat16; anything else is an error
at::Tensor as_rows(const at::Tensor& x);  // [rows, cols] view, unit stride in the last dim

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, int64_t impl);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& w, double eps, int64_t impl);
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t head_dim,
                        int64_t impl);
at::Tensor silu_and_mul(const at::Tensor& x, int64_t impl);
at::Tensor gemma_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, int64_t impl);
at::Tensor gelu_tanh_and_mul(const at::Tensor& x, int64_t impl);
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& q_start_loc, const at::Tensor& seq_lens, const at::Tensor& slot_table,
                           double scale, int64_t impl, int64_t splits);
at::Tensor tree_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& q_start_loc, const at::Tensor& seq_lens, const at::Tensor& slot_table,
                          const at::Tensor& mask, double scale, int64_t impl, int64_t splits);
at::Tensor paged_attention_window(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& q_start_loc, const at::Tensor& seq_lens,
                                  const at::Tensor& slot_table, double scale, int64_t window, double softcap,
                                  int64_t impl, int64_t splits);
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias, int64_t impl);
// ATen's float GEMM for what the native GEMV does not take (prefill rows), the same rule as
// anycore/kernels/torch_native.py linear: where oneDNN has no bf16 GEMM (AVX2-only x86), bf16 x
// and w of at least kWidenMinRows rows are widened to fp32 and the result rounded back to bf16.
constexpr int64_t kWidenMinRows = 4;
bool onednn_has_bf16_gemm();
at::Tensor float_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias);
void float_mm_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& w);  // out = x . w^T
at::Tensor w8a8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& w_scale,
                       const std::optional<at::Tensor>& bias, int64_t impl);
at::Tensor int8_unpack(const at::Tensor& packed, int64_t n, int64_t k, int64_t impl,
                       const std::optional<at::Tensor>& rows);  // rows (all: nullopt) of a packed weight

// fused_moe.cpp: one MoE layer's routed experts, composed of variant `impl`'s linear and
// silu_and_mul kernels (float experts) or ATen's int8 GEMM (int8 experts with their scales).
at::Tensor fused_moe(const at::Tensor& x, const at::Tensor& router_logits, const at::Tensor& w13, const at::Tensor& w2,
                     int64_t top_k, bool renormalize, const std::optional<at::Tensor>& w13_scale,
                     const std::optional<at::Tensor>& w2_scale, int64_t impl);
// fused_moe_w8a8.cpp: the same with int8 experts packed per expert by variant `impl`'s int8_pack,
// run on its int8 kernels (w13 [E, packed bytes], w2 [E, packed bytes], fp32 scales).
at::Tensor fused_moe_w8a8(const at::Tensor& x, const at::Tensor& router_logits, const at::Tensor& w13,
                          const at::Tensor& w2, int64_t top_k, bool renormalize, const at::Tensor& w13_scale,
                          const at::Tensor& w2_scale, int64_t impl);
at::Tensor gguf_linear(const at::Tensor& x, const at::Tensor& qweight, int64_t qtype,
                       const std::optional<at::Tensor>& bias, int64_t impl);
// Activation rows up to which gguf_linear runs the int8 block tiles on this CPU; more take the
// blocks dequantized through a float GEMM. 256 on x86 without AMX-BF16, else 16: the rule and
// its measurements are anycore/kernels/gguf.py int8_max_rows's, which must agree (tested).
int64_t gguf_int8_max_rows();
// The GGUF kernels of variant `impl` (generic's when it has none; the layout is the file's).
const GgufKernels& gguf_table(int64_t impl);

// The int8 kernels of variant `impl` (generic's when it has none): what packed its weights.
const Int8Kernels& int8_table(int64_t impl);

// decoder_layer.cpp: every layer in one call (pools [num_layers, slots, kv_heads, head_dim]).
std::tuple<at::Tensor, at::Tensor> decoder_stack(
    const at::Tensor& hidden, const c10::intrusive_ptr<StackWeights>& stack, const at::Tensor& k_pool,
    const at::Tensor& v_pool, const at::Tensor& slot_mapping, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& q_start_loc, const at::Tensor& seq_lens, const at::Tensor& slot_table, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_dim, double eps, double scale,
    const std::optional<at::Tensor>& tree_mask = std::nullopt);

// decode_team.cpp: decoder_stack's batch-1 decode (bf16 activations) in one OpenMP team; nullopt when the
// step or a layer does not qualify (see there).
std::optional<std::tuple<at::Tensor, at::Tensor>> decode_team(
    const at::Tensor& hidden, const StackWeights& stack, const at::Tensor& k_pool, const at::Tensor& v_pool,
    const at::Tensor& slot_mapping, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& q_start_loc,
    const at::Tensor& seq_lens, const at::Tensor& slot_table, int64_t num_heads, int64_t num_kv_heads,
    int64_t head_dim, double eps, double scale);
int64_t decode_team_steps();  // decode steps the team has run in this process (tests, diagnostics)

// decode_greedy.cpp: `steps` greedy tokens of one request after `token` at position `start`
// (embedding, decoder_stack, final norm, logits head, argmax per token; see there).
at::Tensor decode_greedy(int64_t token, int64_t start, int64_t steps, const c10::List<std::optional<at::Tensor>>& embed,
                         int64_t embed_impl, int64_t vocab, int64_t hidden_size,
                         const c10::intrusive_ptr<StackWeights>& stack, const at::Tensor& k_pool,
                         const at::Tensor& v_pool, const at::Tensor& slot_row, const at::Tensor& cos_table,
                         const at::Tensor& sin_table, const at::Tensor& final_norm,
                         const c10::List<std::optional<at::Tensor>>& head, int64_t head_impl, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_dim, double eps, double final_eps, double scale);
// The rows `ids` of a GGUF table's blocks [vocab, row bytes] (qtype, either layout), dequantized by
// variant impl in fp32 per block, bf16 or fp32 out: VocabEmbedding's lookup.
at::Tensor gguf_embedding(const at::Tensor& blocks, int64_t qtype, const at::Tensor& ids, bool bf16, int64_t impl);
// One such step's fp32 logits [n, vocab] for n tokens at positions start .. start + n - 1 (a
// causal extend; their KV written to slot_row[start ..]).
at::Tensor decode_logits(const at::Tensor& tokens, int64_t start, const c10::List<std::optional<at::Tensor>>& embed,
                         int64_t embed_impl, int64_t vocab, int64_t hidden_size,
                         const c10::intrusive_ptr<StackWeights>& stack, const at::Tensor& k_pool,
                         const at::Tensor& v_pool, const at::Tensor& slot_row, const at::Tensor& cos_table,
                         const at::Tensor& sin_table, const at::Tensor& final_norm,
                         const c10::List<std::optional<at::Tensor>>& head, int64_t head_impl, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_dim, double eps, double final_eps, double scale);

}  // namespace anycore::ops
