// One request's greedy decode, several tokens in one call: per token the embedding row,
// decoder_stack (the decode team), the final norm, the logits head and the argmax, with no
// Python between tokens.
//
// Why: a batch-1 bf16 step of SmolLM2-135M is ~13 ms, of which ~0.9 ms ran in Python (building
// the step's tensors, the embedding and RoPE lookups, the final norm and head calls, the argmax,
// the scheduler and the engine's bookkeeping): 7% of the step, the largest cost left besides
// streaming the weights. The scheduler plans such a multi-step decode only for a request
// decoding alone with plain greedy sampling (Scheduler.schedule(max_steps)); the runner's
// NativeExecutor marshals the call and Scheduler.update applies the stop conditions to the
// returned tokens, as for any step.
//
// Invariant: every token goes through the same ops, with the same inputs, as the engine's
// one-token step (LlamaForCausalLM.forward, LogitsHead.forward, sampler.argmax_rows), so the tokens
// are the ones single steps would produce (tests/kernels/test_decode_greedy.py).
//
// decode_logits is one such step that returns the logits instead of the argmax: a request
// decoding alone with any other sampling (temperature, top-k/p, penalties, logprobs) samples
// from them in Python (engine/sampler.py) without the runner's batch, the model's Python
// forward or the separate head call (~0.4 ms of a ~4.5 ms Q4_1 step, measured in-process).
// Given n > 1 tokens it is one causal extend of them (positions start .. start + n - 1): a
// request verifying a chain draft alone gets every row's logits the same way (the extend the
// runner's batch would run, engine/spec_verify.py verifies them).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops.h"

namespace anycore::ops {

// The rows `ids` (int64) of a GGUF table's blocks uint8 [vocab, row bytes] of type qtype (either
// layout), as VocabEmbedding's torch form computes them: each block dequantized in fp32 (variant
// impl's dequantizer, the dense path's), then rounded to bf16 where `bf16`.
at::Tensor gguf_embedding(const at::Tensor& blocks, int64_t qtype_in, const at::Tensor& ids_in, bool bf16,
                          int64_t impl) {
  const int qtype = static_cast<int>(qtype_in);
  TORCH_CHECK(gguf_block_bytes(qtype) > 0, "gguf_embedding: unsupported block type ", qtype);
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous() &&
                  blocks.size(1) % gguf_block_bytes(qtype) == 0,
              "gguf_embedding: blocks must be a contiguous uint8 [vocab, row bytes]");
  const int64_t vocab = blocks.size(0), hidden = blocks.size(1) / gguf_block_bytes(qtype) * gguf_block_elems(qtype);
  TORCH_CHECK(!gguf_is_x16(qtype) || vocab % kGgufX16Rows == 0,
              "gguf_embedding: interleaved blocks need whole groups of 16 rows");
  const at::Tensor ids = ids_in.to(at::kLong).contiguous().view({-1});
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    TORCH_CHECK(id[i] >= 0 && id[i] < vocab, "gguf_embedding: token ", id[i], " outside the vocabulary");
  at::Tensor rows = at::empty({ids.numel(), hidden}, blocks.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  const int64_t elem = bf16 ? 2 : 4;
  GgufArgs a{};  // one row at a time through the variant's dequantizer (the dense path's)
  a.qtype = qtype, a.k = hidden, a.out_type = bf16 ? 1 : 0;
  // interleaved (kGgufX16): the row is lane id % 16 of its group, decoded into a 16-row scratch
  const int64_t group = gguf_is_x16(qtype) ? kGgufX16Rows : 1;
  std::vector<char> scratch(group > 1 ? group * hidden * elem : 0);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t lane = id[i] % group;
    char* dst = static_cast<char*>(rows.data_ptr()) + i * hidden * elem;
    a.w = blocks.data_ptr<uint8_t>() + (id[i] - lane) * blocks.size(1);
    a.n = group;
    a.out = group == 1 ? static_cast<void*>(dst) : static_cast<void*>(scratch.data());
    gguf_table(impl).dequantize_rows(a, lane, lane + 1);
    if (group > 1) std::memcpy(dst, scratch.data() + lane * hidden * elem, hidden * elem);
  }
  return rows;
}

namespace {

// numpy's argmax (sampler.argmax_rows): the first NaN if any, else the first maximum
int64_t first_argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > x[best]) best = i;
  }
  return best;
}

// The token's row of the embedding table, as VocabEmbedding.forward computes it: a bf16 table
// [weight]; int8 rows [qweight, row_scale]; a GGUF file's blocks [blocks, qtype] (uint8 rows,
// the block type as int64 [1]; each block dequantized in fp32, then rounded to bf16); or the
// rows of a tied int8 head [packed, w_scale, inv_smooth or None] (variant impl's packed layout,
// table [vocab, hidden]).
at::Tensor embedding_row(const c10::List<std::optional<at::Tensor>>& embed, int64_t impl, int64_t vocab,
                         int64_t hidden, const at::Tensor& ids) {
  const at::Tensor first = *embed.get(0);
  if (embed.size() == 1) return first.index_select(0, ids);
  if (embed.size() == 2 && embed.get(1)->scalar_type() == at::kLong) {
    at::Tensor rows = gguf_embedding(first, embed.get(1)->item<int64_t>(), ids, true, impl);
    TORCH_CHECK(first.size(0) == vocab && rows.size(1) == hidden,
                "decode_greedy: gguf embedding blocks must be [vocab, hidden] of their type");
    return rows;
  }
  if (embed.size() == 2) {
    return (first.index_select(0, ids).to(at::kFloat) * embed.get(1)->index_select(0, ids).unsqueeze(1))
        .to(at::kBFloat16);
  }
  at::Tensor rows = int8_unpack(first, vocab, hidden, impl, ids).to(at::kFloat);
  rows.mul_(embed.get(1)->index_select(0, ids).unsqueeze(1));
  const std::optional<at::Tensor> inv = embed.get(2);
  if (inv.has_value() && inv->defined()) rows.mul_(*inv);
  return rows.to(at::kBFloat16);
}

}  // namespace

// embed: see embedding_row (embed_impl: the packed head's variant, for the tied int8 rows);
// vocab x hidden is the table's shape. head: [weight] (bf16 [vocab, hidden], the native
// `linear` variant head_impl), [blocks, qtype] (a GGUF file's blocks uint8 [vocab, row bytes]
// and their block type as int64 [1], `gguf_linear` variant head_impl, fp32 input) or
// [packed, w_scale, inv_smooth or None] (W8A8, `w8a8_linear` variant head_impl, fp32 input).
// slot_row: int64 [1, >= start + steps], the request's KV slots by position; the slots of
// positions start .. start + steps - 1 are written.
namespace {

// The arguments both entry points check the same way (`steps` positions from `start`).
void check_decode_args(int64_t start, int64_t steps, const c10::List<std::optional<at::Tensor>>& embed, int64_t vocab,
                       int64_t hidden_size, const at::Tensor& slot_row, const at::Tensor& cos_table,
                       const at::Tensor& sin_table, const c10::List<std::optional<at::Tensor>>& head) {
  TORCH_CHECK(steps >= 1 && start >= 0, "decode_greedy: steps >= 1 and start >= 0");
  TORCH_CHECK(embed.size() >= 1 && embed.size() <= 3 && embed.get(0).has_value(),
              "decode_greedy: embed is [weight], [qweight, row_scale] or [packed, w_scale, inv_smooth]");
  TORCH_CHECK(embed.size() != 1 || (embed.get(0)->scalar_type() == at::kBFloat16 && embed.get(0)->dim() == 2 &&
                                    embed.get(0)->size(0) == vocab && embed.get(0)->size(1) == hidden_size),
              "decode_greedy: a float embedding table must be bf16 [vocab, hidden]");
  TORCH_CHECK(slot_row.dim() == 2 && slot_row.size(0) == 1 && slot_row.scalar_type() == at::kLong &&
                  slot_row.size(1) >= start + steps,
              "decode_greedy: slot_row must be int64 [1, >= start + steps]");
  TORCH_CHECK(cos_table.dim() == 2 && sin_table.sizes() == cos_table.sizes() && cos_table.size(0) >= start + steps,
              "decode_greedy: cos/sin tables must cover positions up to start + steps");
  TORCH_CHECK(head.size() >= 1 && head.size() <= 3,
              "decode_greedy: head is [weight], [blocks, qtype] or [packed, w_scale, inv_smooth]");
}

// One step of the request: `tokens` (int64 [n]) at positions pos .. pos + n - 1 through the
// embedding rows, the stack (a causal extend; their KV written to slot_row[pos ..]), the final
// norm and the logits head -> fp32 logits [n, vocab].
at::Tensor step_logits(const at::Tensor& tokens, int64_t pos, const c10::List<std::optional<at::Tensor>>& embed,
                       int64_t embed_impl, int64_t vocab, int64_t hidden_size,
                       const c10::intrusive_ptr<StackWeights>& stack, const at::Tensor& k_pool,
                       const at::Tensor& v_pool, const at::Tensor& slot_row, const at::Tensor& cos_table,
                       const at::Tensor& sin_table, const at::Tensor& final_norm,
                       const c10::List<std::optional<at::Tensor>>& head, int64_t head_impl, int64_t num_heads,
                       int64_t num_kv_heads, int64_t head_dim, double eps, double final_eps, double scale) {
  const int64_t n = tokens.numel();
  const int64_t* ids = tokens.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(ids[i] >= 0 && ids[i] < vocab, "decode_greedy: token ", ids[i], " outside the vocabulary");
  const at::Tensor q_start = at::tensor({int64_t{0}, n}, slot_row.options());
  at::Tensor hidden = embedding_row(embed, embed_impl, vocab, hidden_size, tokens);
  auto [h, res] = decoder_stack(hidden, stack, k_pool, v_pool, slot_row.select(0, 0).narrow(0, pos, n),
                                cos_table.narrow(0, pos, n), sin_table.narrow(0, pos, n), q_start,
                                at::full({1}, pos + n, slot_row.options()), slot_row.narrow(1, 0, pos + n), num_heads,
                                num_kv_heads, head_dim, eps, scale);
  at::Tensor normed = std::get<0>(add_rms_norm(h, res, final_norm, final_eps, stack->op_impls[kOpAddRmsNorm]));
  at::Tensor logits;
  if (head.size() == 1) {
    logits = linear(normed, *head.get(0), std::nullopt, head_impl).to(at::kFloat);
  } else if (head.size() == 2) {
    logits = gguf_linear(normed.to(at::kFloat), *head.get(0), head.get(1)->item<int64_t>(), std::nullopt, head_impl);
  } else {
    at::Tensor x = normed.to(at::kFloat);
    const std::optional<at::Tensor> inv = head.get(2);
    if (inv.has_value() && inv->defined()) x = x * *inv;
    logits = w8a8_linear(x, *head.get(0), *head.get(1), std::nullopt, head_impl);
  }
  TORCH_CHECK(logits.is_contiguous() && logits.scalar_type() == at::kFloat, "decode_greedy: head gave ", logits.sizes());
  return logits;
}

}  // namespace

at::Tensor decode_greedy(int64_t token, int64_t start, int64_t steps, const c10::List<std::optional<at::Tensor>>& embed,
                         int64_t embed_impl, int64_t vocab, int64_t hidden_size,
                         const c10::intrusive_ptr<StackWeights>& stack, const at::Tensor& k_pool,
                         const at::Tensor& v_pool, const at::Tensor& slot_row, const at::Tensor& cos_table,
                         const at::Tensor& sin_table, const at::Tensor& final_norm,
                         const c10::List<std::optional<at::Tensor>>& head, int64_t head_impl, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_dim, double eps, double final_eps, double scale) {
  check_decode_args(start, steps, embed, vocab, hidden_size, slot_row, cos_table, sin_table, head);
  at::Tensor out = at::empty({steps}, slot_row.options());
  int64_t* out_p = out.data_ptr<int64_t>();
  at::Tensor current = at::empty({1}, slot_row.options());
  for (int64_t i = 0; i < steps; ++i) {
    current.data_ptr<int64_t>()[0] = token;
    const at::Tensor logits = step_logits(current, start + i, embed, embed_impl, vocab, hidden_size, stack, k_pool,
                                          v_pool, slot_row, cos_table, sin_table, final_norm, head, head_impl,
                                          num_heads, num_kv_heads, head_dim, eps, final_eps, scale);
    token = first_argmax(logits.data_ptr<float>(), logits.numel());
    out_p[i] = token;
  }
  return out;
}

at::Tensor decode_logits(const at::Tensor& tokens, int64_t start, const c10::List<std::optional<at::Tensor>>& embed,
                         int64_t embed_impl, int64_t vocab, int64_t hidden_size,
                         const c10::intrusive_ptr<StackWeights>& stack, const at::Tensor& k_pool,
                         const at::Tensor& v_pool, const at::Tensor& slot_row, const at::Tensor& cos_table,
                         const at::Tensor& sin_table, const at::Tensor& final_norm,
                         const c10::List<std::optional<at::Tensor>>& head, int64_t head_impl, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_dim, double eps, double final_eps, double scale) {
  TORCH_CHECK(tokens.dim() == 1 && tokens.numel() >= 1 && tokens.scalar_type() == at::kLong && tokens.is_contiguous(),
              "decode_logits: tokens must be int64 [n >= 1]");
  check_decode_args(start, tokens.numel(), embed, vocab, hidden_size, slot_row, cos_table, sin_table, head);
  return step_logits(tokens, start, embed, embed_impl, vocab, hidden_size, stack, k_pool, v_pool, slot_row, cos_table,
                     sin_table, final_norm, head, head_impl, num_heads, num_kv_heads, head_dim, eps, final_eps, scale);
}

}  // namespace anycore::ops
