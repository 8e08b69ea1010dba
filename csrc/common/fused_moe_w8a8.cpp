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
// Compiled for the baseline ISA like fused_moe.cpp: it only routes, gathers and calls through
// the variant's table.
#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "moe_routing.h"
#include "ops.h"

namespace anycore::ops {

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
  SiluMulFn silu_mul = ANYCORE_PICK(silu_and_mul, impl, dt);

  const Routing r = route(router_logits, top_k, renormalize);
  const int64_t pairs = t * top_k;
  int64_t most = 0;  // the largest group: one workspace serves every expert's two calls
  for (int64_t j = 0; j < e; ++j) most = std::max(most, r.offsets[j + 1] - r.offsets[j]);
  at::Tensor order = at::from_blob(const_cast<int64_t*>(r.order.data()), {pairs}, at::kLong);
  at::Tensor rows = x.index_select(0, at::floor_divide(order, top_k));  // pairs' rows, grouped by expert
  at::Tensor gate_up = at::empty({pairs, two_i}, x.options());
  at::Tensor act = at::empty({pairs, inter}, x.options());
  at::Tensor y = at::empty({pairs, h}, x.options());
  at::Tensor work = at::empty({std::max(k8.workspace_bytes(most, h), k8.workspace_bytes(most, inter))},
                              x.options().dtype(at::kByte));  // (CPU allocations are 64-byte aligned)
  const int io = dt == 0 ? kInt8Fp32 : kInt8Bf16;
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
  const int8_t* p13 = w13.data_ptr<int8_t>();
  const int8_t* p2 = w2.data_ptr<int8_t>();
  const float* s13 = w13_scale.data_ptr<float>();
  const float* s2 = w2_scale.data_ptr<float>();
  for (int64_t j = 0; j < e; ++j) {
    const int64_t b = r.offsets[j], c = r.offsets[j + 1] - b;
    if (c == 0) continue;  // no token chose expert j: its weights stay unread
    run(rows, h, p13 + j * w13.size(1), s13 + j * two_i, gate_up, two_i, b, c);
    silu_mul(static_cast<char*>(act.data_ptr()) + b * inter * es,
             static_cast<const char*>(gate_up.data_ptr()) + b * two_i * es, two_i, c, inter);
    run(act, inter, p2 + j * w2.size(1), s2 + j * h, y, h, b, c);
  }
  at::Tensor out = at::zeros({t, h}, x.options().dtype(at::kFloat));
  if (dt == 0) {
    combine(out.data_ptr<float>(), y.data_ptr<float>(), r, 0, pairs, top_k, h);
  } else {
    combine(out.data_ptr<float>(), y.data_ptr<at::BFloat16>(), r, 0, pairs, top_k, h);
  }
  return out.to(x.scalar_type());
}

}  // namespace anycore::ops
