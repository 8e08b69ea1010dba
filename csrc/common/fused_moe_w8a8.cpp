// fused_moe_w8a8: one Mixture-of-Experts layer's routed int8 experts in one call, on variant
// `impl`'s own int8 kernels (int8_impl.h: VNNI VPDPBUSD, Arm SDOT / SMMLA, AMX tiles, generic
// C++). The oracle is anycore/kernels/moe.py fused_moe_reference with the scales given.
//
// Each expert's two projections are packed once at load by that variant's int8_pack (its own
// layout), stacked per layer: w13 [E, packed_bytes(2I, H)], w2 [E, packed_bytes(H, I)] int8.
// Per expert that got tokens: its rows gathered, quantized per token and multiplied by the
// packed gate/up weight (one w8a8_linear of the variant), silu_and_mul in the activation dtype,
// the same for the down projection; then the weighted combine in fp32. An expert no token chose
// is never read, so a batch-1 decode streams exactly top_k experts' int8 weights.
//
// One token (batch-1 decode) takes another schedule of the same kernels: its top_k experts'
// projections in one thread team (quantize_row + gemm_panels, the two steps w8a8_linear takes
// for one row, so the same bits), each thread taking one contiguous share of the 16-column panel
// runs of all the chosen experts (static: one unbroken stretch of weight memory per thread); two
// barriers instead of a fork and join per expert projection.
//
// Compiled for the baseline ISA like fused_moe.cpp: it only routes, gathers and calls through
// the variant's table.
#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "moe_routing.h"
#include "ops.h"
#include "parallel.h"

namespace anycore::ops {

namespace {

constexpr int64_t kPanel = 16;        // output columns per panel of a packed int8 weight (int8_impl.h)
constexpr int64_t kChunkPanels = 4;   // panels a thread takes at a time

// The single-token schedule: rows[s] (s in [0, top_k), grouped by expert as r.order) through
// expert r.expert[r.order[s]]'s gate/up, silu_and_mul, down into y[s]. False when the variant
// lacks the two-step kernels (the caller then takes the per-expert calls).
bool one_token_team(const Int8Kernels& k8, GatedActFn silu_mul, const at::Tensor& x, const Routing& r, int64_t pairs,
                    const int8_t* p13, int64_t b13, const float* s13, const int8_t* p2, int64_t b2, const float* s2,
                    int64_t h, int64_t inter, int io, at::Tensor& gate_up, at::Tensor& act, at::Tensor& y) {
  if (k8.quantize_row == nullptr || k8.gemm_panels == nullptr) return false;
  const int64_t two_i = 2 * inter, es = x.element_size();
  const int64_t c13 = (two_i + kPanel - 1) / kPanel, c2 = (h + kPanel - 1) / kPanel;  // panels per expert
  const int64_t g13 = (c13 + kChunkPanels - 1) / kChunkPanels, g2 = (c2 + kChunkPanels - 1) / kChunkPanels;
  const int64_t nt = team_size(pairs * g13, 1);
  const int64_t ws_bytes = (std::max(k8.workspace_bytes(1, h), k8.workspace_bytes(1, inter)) + 63) / 64 * 64;
  at::Tensor work = at::empty({nt * ws_bytes}, x.options().dtype(at::kByte));
  std::vector<int64_t> expert(pairs);
  for (int64_t s = 0; s < pairs; ++s) expert[s] = r.expert[r.order[s]];
  char* gu = static_cast<char*>(gate_up.data_ptr());
  char* ac = static_cast<char*>(act.data_ptr());
  char* yo = static_cast<char*>(y.data_ptr());
  auto args = [&](const void* in, int64_t k, int64_t n, void* ws) {
    W8A8Args a{};
    a.x = in, a.x_stride = k, a.x_type = io, a.out_type = io;
    a.m = 1, a.n = n, a.k = k;
    a.workspace = ws;
    return a;
  };
#pragma omp parallel num_threads(static_cast<int>(nt))
  {
    void* ws = static_cast<char*>(work.data_ptr()) + omp_get_thread_num() * ws_bytes;
    W8A8Args a = args(x.data_ptr(), h, two_i, ws);  // the token, quantized once per thread
    k8.quantize_row(a);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < pairs * g13; ++c) {
      const int64_t s = c / g13, q = c % g13, j = expert[s];
      a.w = p13 + j * b13, a.w_scale = s13 + j * two_i, a.out = gu + s * two_i * es;
      k8.gemm_panels(a, q * kChunkPanels, std::min((q + 1) * kChunkPanels, c13));
    }
#pragma omp for schedule(static)
    for (int64_t s = 0; s < pairs; ++s) silu_mul(ac + s * inter * es, gu + s * two_i * es, two_i, 1, inter);
    int64_t quantized = -1;  // the act row in this thread's workspace
    W8A8Args d{};
#pragma omp for schedule(static)
    for (int64_t c = 0; c < pairs * g2; ++c) {
      const int64_t s = c / g2, q = c % g2, j = expert[s];
      if (s != quantized) {
        d = args(ac + s * inter * es, inter, h, ws);
        k8.quantize_row(d);
        quantized = s;
      }
      d.w = p2 + j * b2, d.w_scale = s2 + j * h, d.out = yo + s * h * es;
      k8.gemm_panels(d, q * kChunkPanels, std::min((q + 1) * kChunkPanels, c2));
    }
  }
  return true;
}

// The weighted combine of the pairs' outputs y (grouped by expert), in fp32, cast back.
at::Tensor finish(const Routing& r, const at::Tensor& y, int64_t t, int64_t h, int64_t top_k, int64_t pairs, int dt,
                  const at::TensorOptions& options) {
  at::Tensor out = at::zeros({t, h}, options.dtype(at::kFloat));
  if (dt == 0) {
    combine(out.data_ptr<float>(), y.data_ptr<float>(), r, 0, pairs, top_k, h);
  } else {
    combine(out.data_ptr<float>(), y.data_ptr<at::BFloat16>(), r, 0, pairs, top_k, h);
  }
  return out.to(options.dtype());
}

}  // namespace

at::Tensor fused_moe_w8a8(const at::Tensor& x_in, const at::Tensor& router_logits, const at::Tensor& w13,
                          const at::Tensor& w2, int64_t top_k, bool renormalize, const at::Tensor& w13_scale,
                          const at::Tensor& w2_scale, int64_t impl) {
  const int dt = dtype_index(x_in);
  TORCH_CHECK(x_in.dim() == 2 && w13.dim() == 2 && w2.dim() == 2 && w13_scale.dim() == 2 && w2_scale.dim() == 2,
              "fused_moe_w8a8: x [T, H], packed w13 [E, bytes], w2 [E, bytes], w13_scale [E, 2I], w2_scale [E, H]");
  at::Tensor x = x_in.contiguous();
  const int64_t t = x.size(0), h = x.size(1), e = w13.size(0), two_i = w13_scale.size(1), inter = two_i / 2;
  const Int8Kernels& k8 = int8_table(impl);
  TORCH_CHECK(two_i % 2 == 0 && inter > 0 && h > 0, "fused_moe_w8a8: empty or odd expert width");
  TORCH_CHECK(w13.scalar_type() == at::kChar && w2.scalar_type() == at::kChar && w13.is_contiguous() &&
                  w2.is_contiguous() && w2.size(0) == e && w13.size(1) == k8.packed_bytes(two_i, h) &&
                  w2.size(1) == k8.packed_bytes(h, inter),
              "fused_moe_w8a8: w13 / w2 are not this variant's packed [", two_i, ", ", h, "] / [", h, ", ", inter,
              "] int8 experts");
  TORCH_CHECK(w13_scale.scalar_type() == at::kFloat && w2_scale.scalar_type() == at::kFloat &&
                  w13_scale.is_contiguous() && w2_scale.is_contiguous() && w13_scale.size(0) == e &&
                  w2_scale.sizes() == at::IntArrayRef({e, h}),
              "fused_moe_w8a8: scales must be contiguous fp32 w13_scale [E, 2I], w2_scale [E, H]");
  TORCH_CHECK(router_logits.dim() == 2 && router_logits.size(0) == t && router_logits.size(1) == e,
              "fused_moe_w8a8: router_logits must be [T, E]");
  TORCH_CHECK(top_k >= 1 && top_k <= e, "fused_moe_w8a8: top_k must be in [1, experts]");
  GatedActFn silu_mul = ANYCORE_PICK(silu_and_mul, impl, dt);

  const Routing r = route(router_logits, top_k, renormalize);
  const int64_t pairs = t * top_k;
  int64_t most = 0;  // the largest group: one workspace serves every expert's two calls
  for (int64_t j = 0; j < e; ++j) most = std::max(most, r.offsets[j + 1] - r.offsets[j]);
  at::Tensor order = at::from_blob(const_cast<int64_t*>(r.order.data()), {pairs}, at::kLong);
  at::Tensor rows = x.index_select(0, at::floor_divide(order, top_k));  // pairs' rows, grouped by expert
  at::Tensor gate_up = at::empty({pairs, two_i}, x.options());
  at::Tensor act = at::empty({pairs, inter}, x.options());
  at::Tensor y = at::empty({pairs, h}, x.options());
  const int io = dt == 0 ? kInt8Fp32 : kInt8Bf16;
  const int8_t* p13 = w13.data_ptr<int8_t>();
  const int8_t* p2 = w2.data_ptr<int8_t>();
  const float* s13 = w13_scale.data_ptr<float>();
  const float* s2 = w2_scale.data_ptr<float>();
  if (t == 1 && one_token_team(k8, silu_mul, x, r, pairs, p13, w13.size(1), s13, p2, w2.size(1), s2, h, inter, io,
                               gate_up, act, y))
    return finish(r, y, t, h, top_k, pairs, dt, x.options());
  at::Tensor work = at::empty({std::max(k8.workspace_bytes(most, h), k8.workspace_bytes(most, inter))},
                              x.options().dtype(at::kByte));  // (CPU allocations are 64-byte aligned)
  const int64_t es = x.element_size();
  auto run = [&](const at::Tensor& in, int64_t k, const int8_t* w, const float* ws, at::Tensor& out, int64_t n,
                 int64_t b, int64_t c) {
    W8A8Args a{};
    a.x = static_cast<const char*>(in.data_ptr()) + b * k * es;
    a.x_stride = k;
    a.x_type = io;
    a.w = w;
    a.w_scale = ws;
    a.out = static_cast<char*>(out.data_ptr()) + b * n * es;
    a.out_type = io;
    a.m = c, a.n = n, a.k = k;
    a.workspace = work.data_ptr();
    k8.w8a8_linear(a);
  };
  for (int64_t j = 0; j < e; ++j) {
    const int64_t b = r.offsets[j], c = r.offsets[j + 1] - b;
    if (c == 0) continue;  // no token chose expert j: its weights stay unread
    run(rows, h, p13 + j * w13.size(1), s13 + j * two_i, gate_up, two_i, b, c);
    silu_mul(static_cast<char*>(act.data_ptr()) + b * inter * es,
             static_cast<const char*>(gate_up.data_ptr()) + b * two_i * es, two_i, c, inter);
    run(act, inter, p2 + j * w2.size(1), s2 + j * h, y, h, b, c);
  }
  return finish(r, y, t, h, top_k, pairs, dt, x.options());
}

}  // namespace anycore::ops
