// How a paged-attention call is cut into work (attention_kernels.h runs it): the work items and
// the split-K count. Baseline code for the torch-facing units (ops.cpp, decode_team.cpp), never
// included by an ISA translation unit: it is inline and shared, and a shared function compiled
// with a wider ISA's flags could be the copy the linker keeps (see csrc/README.md).
#pragma once
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernel_table.h"

namespace anycore::ops {

// Split-K for decode-only batches (max_q == 1) with too few (request, kv head) items to fill
// the threads and long enough contexts (>= 4 key blocks per split); 1 otherwise. Shared by
// paged_attention and the decode team, whose results must agree bit for bit.
inline int64_t attention_splits(int64_t num_items, int64_t max_q, int64_t max_len, int64_t threads) {
  if (max_q != 1 || num_items <= 0 || num_items >= threads) return 1;
  return std::max<int64_t>(1, std::min((2 * threads + num_items - 1) / num_items, max_len / (4 * kKeyBlock)));
}

// Split-K for a batch whose longest request is prefill-shaped (more than kDecodeShapedQueries
// new tokens) when its items are too few to share out evenly: a short extend over a long cached
// prefix (a shared-prefix hit: 20 new tokens over ~1000 cached keys are one item per kv head,
// 3 items for SmolLM2, which 2 threads run 2 + 1 and 16 threads 1 + 1 + 1 with 13 idle). The
// smallest count whose units divide evenly over the threads or number 4 per thread, at most
// one split per 4 key blocks. Never for a batch with a decode-shaped multi-token request (a
// verify or tree keeps the unsplit rows plain decoding computes, attn_item), nor with a mask.
inline int64_t prefill_attention_splits(int64_t num_items, int64_t max_len, int64_t threads) {
  if (num_items <= 0 || threads <= 1 || num_items % threads == 0 || num_items >= 4 * threads) return 1;
  const int64_t most = max_len / (4 * kKeyBlock);
  int64_t s = 2;
  while (s < most && (num_items * s) % threads != 0 && num_items * s < 4 * threads) ++s;
  return std::max<int64_t>(1, std::min(s, most));
}

struct AttentionPlan {
  std::vector<int64_t> items;  // AttnArgs::items: request, kv head, first query, end query
  int64_t num_items = 0;
  int64_t num_splits = 1;     // AttnArgs::num_splits
  int64_t rows_per_item = 0;  // AttnArgs::rows_per_item
};

// Work items for a batch (q_start [batch + 1], seq_lens [batch], slot-table rows of
// `table_cols` slots, `tokens` query rows): per request, blocks of queries such that
// (queries * GQA group) <= kMaxAttnRows, each block once per kv head. `splits` > 0 forces a
// split count (tests); otherwise attention_splits (or, with `prefill_splits`,
// prefill_attention_splits) for `threads`, over the keys an item reads (with a sliding `window`
// > 0: at most window + new tokens - 1). Checks each request's bounds.
inline AttentionPlan plan_attention(const int64_t* q_start, const int64_t* seq_lens, int64_t batch,
                                    int64_t num_heads, int64_t num_kv_heads, int64_t table_cols, int64_t tokens,
                                    int64_t splits, int64_t threads, bool prefill_splits = false,
                                    int64_t window = 0) {
  const int64_t group = num_heads / num_kv_heads, per_item = std::max<int64_t>(1, kMaxAttnRows / group);
  AttentionPlan plan;
  plan.items.reserve(4 * batch * num_kv_heads);
  int64_t max_len = 0, max_q = 0;
  bool decode_shaped = false;  // a request of 2 .. kDecodeShapedQueries new tokens (a verify, a tree)
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = q_start[b + 1] - q_start[b];
    decode_shaped |= n > 1 && n <= kDecodeShapedQueries;
    TORCH_CHECK(n >= 0 && n <= seq_lens[b] && seq_lens[b] <= table_cols && q_start[b + 1] <= tokens,
                "bad request ", b);
    for (int64_t q0 = 0; q0 < n; q0 += per_item) {
      for (int64_t h = 0; h < num_kv_heads; ++h) plan.items.insert(plan.items.end(), {b, h, q0, std::min(n, q0 + per_item)});
    }
    max_len = std::max(max_len, window > 0 ? std::min(seq_lens[b], window + n - 1) : seq_lens[b]);
    max_q = std::max(max_q, n);
  }
  plan.num_items = static_cast<int64_t>(plan.items.size() / 4);
  if (splits <= 0) {
    splits = prefill_splits && max_q > kDecodeShapedQueries && !decode_shaped
                 ? prefill_attention_splits(plan.num_items, max_len, threads)
                 : attention_splits(plan.num_items, max_q, max_len, threads);
  }
  plan.num_splits = std::max<int64_t>(1, splits);
  plan.rows_per_item = std::min(max_q, per_item) * group;
  return plan;
}

}  // namespace anycore::ops
