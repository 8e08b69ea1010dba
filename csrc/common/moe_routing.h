// The routing both fused MoE ops share (fused_moe.cpp, fused_moe_w8a8.cpp): per token the
// softmax of its router logits, its top_k experts, and the (token, slot) pairs grouped by expert.
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace anycore::ops {
namespace {

struct Routing {
  std::vector<float> weight;      // [tokens * top_k]
  std::vector<int64_t> expert;    // [tokens * top_k]
  std::vector<int64_t> order;     // pair ids (token * top_k + slot), grouped by expert, stable
  std::vector<int64_t> offsets;   // [experts + 1] into order
};

// softmax over each token's logits (fp32), its top_k (ties: the lower expert id first), then
// renormalised to sum to one when asked: what every supported model's router does.
Routing route(const at::Tensor& logits_in, int64_t top_k, bool renormalize) {
  at::Tensor logits = logits_in.to(at::kFloat).contiguous();
  const int64_t t = logits.size(0), e = logits.size(1);
  const float* l = logits.data_ptr<float>();
  Routing r;
  r.weight.resize(t * top_k);
  r.expert.resize(t * top_k);
  std::vector<float> prob(e);
  std::vector<int64_t> idx(e);
  for (int64_t i = 0; i < t; ++i) {
    const float* row = l + i * e;
    const float mx = *std::max_element(row, row + e);
    float sum = 0.0f;
    for (int64_t j = 0; j < e; ++j) sum += (prob[j] = std::exp(row[j] - mx));
    for (int64_t j = 0; j < e; ++j) prob[j] /= sum;
    std::iota(idx.begin(), idx.end(), int64_t{0});
    std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(), [&](int64_t a, int64_t b) {
      return prob[a] > prob[b] || (prob[a] == prob[b] && a < b);
    });
    float top = 0.0f;
    for (int64_t s = 0; s < top_k; ++s) top += prob[idx[s]];
    for (int64_t s = 0; s < top_k; ++s) {
      r.expert[i * top_k + s] = idx[s];
      r.weight[i * top_k + s] = renormalize ? prob[idx[s]] / top : prob[idx[s]];
    }
  }
  r.offsets.assign(e + 1, 0);
  for (int64_t x : r.expert) ++r.offsets[x + 1];
  for (int64_t j = 0; j < e; ++j) r.offsets[j + 1] += r.offsets[j];
  r.order.resize(t * top_k);
  std::vector<int64_t> fill(r.offsets.begin(), r.offsets.end() - 1);
  for (int64_t p = 0; p < t * top_k; ++p) r.order[fill[r.expert[p]]++] = p;
  return r;
}

template <typename T>
void combine(float* out, const T* y, const Routing& r, int64_t begin, int64_t end, int64_t top_k, int64_t h) {
  for (int64_t row = begin; row < end; ++row) {
    const int64_t pair = r.order[row];
    const float w = r.weight[pair];
    float* o = out + (pair / top_k) * h;
    const T* yr = y + row * h;
    for (int64_t j = 0; j < h; ++j) o[j] += w * static_cast<float>(yr[j]);
  }
}

}  // namespace
}  // namespace anycore::ops
