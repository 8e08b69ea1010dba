// fused_moe: one Mixture-of-Experts layer's routed experts in one call (the oracle is
// anycore/kernels/moe.py fused_moe_reference). Compiled for the baseline ISA, like
// decoder_layer.cpp: it routes and groups in plain C++ and composes variant `impl`'s own
// kernels: per expert that got tokens, the gate/up projection, silu_and_mul, the down
// projection, then the weighted combine in fp32.
//
// The projections follow the dense rule (native_linear_max_rows(), decoder_layout.h): bf16 with at
// most that many rows runs the variant's GEMV, anything else at::mm (oneDNN). An expert no token
// chose is never read, so a batch-1 decode streams exactly top_k experts' weights.
//
// One bf16 token (batch-1 decode) with the variant's GEMV: its top_k experts' projections in one
// thread team, each thread taking one contiguous share of the row runs of all the chosen experts
// (static: a thread streams one unbroken stretch of weight memory; measured faster than
// on-demand runs on a 2-core Zen 4, bench moe bf16 123 -> 145 tok/s; each row's dot product is the GEMV's whatever the run, so the same bits);
// two barriers instead of a fork and join per expert projection.
//
// int8 experts (w13_scale, w2_scale given; the W8A8 scheme of anycore/kernels/int8.py, weights
// [E, N, K] int8 as the torch-native implementation reads them) run the same ATen steps as
// anycore/kernels/moe.py fused_moe_torch (per-token quantization, at::_int_mm, fp32 epilogue,
// silu * up in the activation dtype); only the Python between the steps is gone (tokens are
// quantized once, not once per expert: the same rows either way).
#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <numeric>
#include <utility>
#include <vector>

#include "moe_routing.h"
#include "ops.h"
#include "parallel.h"

namespace anycore::ops {

namespace {

// out[m, n] = x[m, k] . w[n, k]: the variant's GEMV where the dense rule takes it, else ATen's GEMM.
void project(at::Tensor out, const at::Tensor& x, const at::Tensor& w, int dt, int64_t impl) {
  const int64_t m = x.size(0);
  LinearFn gemv = table(impl).linear[dt];
  if (dt == 1 && m <= native_linear_max_rows() && gemv != nullptr) {
    gemv(out.data_ptr(), x.data_ptr(), x.stride(0), w.data_ptr(), nullptr, m, w.size(0), w.size(1));
  } else {
    float_mm_out(out, x, w);
  }
}

constexpr int64_t kTeamRows = 64;  // expert weight rows a thread takes at a time

// The one-token schedule: x [1, H] through expert expert[s]'s gate/up, silu_and_mul and down for
// each pair s, into y[s]; bf16 with the variant's GEMV only.
void one_token_team(LinearFn gemv, GatedActFn silu_mul, const at::Tensor& x, const std::vector<int64_t>& expert,
                    const at::Tensor& w13, const at::Tensor& w2, at::Tensor& gate_up, at::Tensor& act, at::Tensor& y) {
  const int64_t pairs = static_cast<int64_t>(expert.size()), h = x.size(1), inter = w2.size(2), two_i = 2 * inter;
  const int64_t g13 = (two_i + kTeamRows - 1) / kTeamRows, g2 = (h + kTeamRows - 1) / kTeamRows;
  const int64_t es = x.element_size();
  const char* xp = static_cast<const char*>(x.data_ptr());
  const char* p13 = static_cast<const char*>(w13.data_ptr());
  const char* p2 = static_cast<const char*>(w2.data_ptr());
  char* gu = static_cast<char*>(gate_up.data_ptr());
  char* ac = static_cast<char*>(act.data_ptr());
  char* yo = static_cast<char*>(y.data_ptr());
#pragma omp parallel num_threads(static_cast<int>(team_size(pairs * g13, 1)))
  {
#pragma omp for schedule(static)
    for (int64_t c = 0; c < pairs * g13; ++c) {
      const int64_t s = c / g13, r0 = c % g13 * kTeamRows, n = std::min(kTeamRows, two_i - r0);
      gemv(gu + (s * two_i + r0) * es, xp, h, p13 + (expert[s] * two_i + r0) * h * es, nullptr, 1, n, h);
    }
#pragma omp for schedule(static)
    for (int64_t s = 0; s < pairs; ++s) silu_mul(ac + s * inter * es, gu + s * two_i * es, two_i, 1, inter);
#pragma omp for schedule(static)
    for (int64_t c = 0; c < pairs * g2; ++c) {
      const int64_t s = c / g2, r0 = c % g2 * kTeamRows, n = std::min(kTeamRows, h - r0);
      gemv(yo + (s * h + r0) * es, ac + s * inter * es, inter, p2 + (expert[s] * h + r0) * inter * es, nullptr, 1, n,
           inter);
    }
  }
}

// x [m, k] float -> (int8 [m, k], fp32 scales [m]): symmetric per row, range +-127 (int8.py)
std::pair<at::Tensor, at::Tensor> quantize_per_token(const at::Tensor& x) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor scale = xf.abs().amax({1}).clamp_min(1e-12) / 127.0;
  return {at::round(xf / scale.unsqueeze(1)).clamp(-127, 127).to(at::kChar), scale};
}

// W8A8: (xq, xs) . qweight[N, K]^T with the per-channel scales, cast to `dtype`
at::Tensor int8_project(const at::Tensor& xq, const at::Tensor& xs, const at::Tensor& qweight,
                        const at::Tensor& w_scale, at::ScalarType dtype) {
  at::Tensor acc = at::_int_mm(xq, qweight.t());
  return (acc.to(at::kFloat) * xs.unsqueeze(1) * w_scale.unsqueeze(0)).to(dtype);
}

}  // namespace

at::Tensor fused_moe(const at::Tensor& x_in, const at::Tensor& router_logits, const at::Tensor& w13,
                     const at::Tensor& w2, int64_t top_k, bool renormalize, const std::optional<at::Tensor>& w13_scale,
                     const std::optional<at::Tensor>& w2_scale, int64_t impl) {
  const bool int8 = w13_scale.has_value() && w13_scale->defined();
  TORCH_CHECK(int8 == (w2_scale.has_value() && w2_scale->defined()),
              "fused_moe: give both w13_scale and w2_scale (int8 experts) or neither");
  const int dt = dtype_index(x_in);
  TORCH_CHECK(x_in.dim() == 2 && w13.dim() == 3 && w2.dim() == 3, "fused_moe: x [T, H], w13 [E, 2I, H], w2 [E, H, I]");
  at::Tensor x = x_in.contiguous();
  const int64_t t = x.size(0), h = x.size(1), e = w13.size(0), inter = w2.size(2);
  if (int8) {
    TORCH_CHECK(w13.scalar_type() == at::kChar && w2.scalar_type() == at::kChar &&
                    w13_scale->scalar_type() == at::kFloat && w2_scale->scalar_type() == at::kFloat &&
                    w13_scale->sizes() == at::IntArrayRef({e, 2 * inter}) && w2_scale->sizes() == at::IntArrayRef({e, h}),
                "fused_moe: int8 experts need fp32 scales w13_scale [E, 2I] and w2_scale [E, H]");
  } else {
    TORCH_CHECK(w13.scalar_type() == x.scalar_type() && w2.scalar_type() == x.scalar_type() && w13.is_contiguous() &&
                    w2.is_contiguous(), "fused_moe: experts must be contiguous in the input dtype");
  }
  TORCH_CHECK(w13.size(1) == 2 * inter && w13.size(2) == h && w2.size(0) == e && w2.size(1) == h,
              "fused_moe: w13 [E, 2I, H] and w2 [E, H, I] do not fit x [T, H]");
  TORCH_CHECK(router_logits.dim() == 2 && router_logits.size(0) == t && router_logits.size(1) == e,
              "fused_moe: router_logits must be [T, E]");
  TORCH_CHECK(top_k >= 1 && top_k <= e, "fused_moe: top_k must be in [1, experts]");
  (void)table(impl);  // (checks impl; makes OpenMP follow torch's thread count)

  const Routing r = route(router_logits, top_k, renormalize);
  const int64_t pairs = t * top_k;
  // the pairs' rows gathered by expert, then each expert's slice through its two projections
  at::Tensor order = at::from_blob(const_cast<int64_t*>(r.order.data()), {pairs}, at::kLong);
  at::Tensor token_of = at::floor_divide(order, top_k);
  at::Tensor y = at::empty({pairs, h}, x.options());
  if (int8) {
    auto [xq, xs] = quantize_per_token(x);
    at::Tensor rows_q = xq.index_select(0, token_of), rows_s = xs.index_select(0, token_of);
    for (int64_t j = 0; j < e; ++j) {
      const int64_t b = r.offsets[j], c = r.offsets[j + 1] - b;
      if (c == 0) continue;  // no token chose expert j: its weights stay unread
      at::Tensor gate_up = int8_project(rows_q.narrow(0, b, c), rows_s.narrow(0, b, c), w13[j], (*w13_scale)[j],
                                        x.scalar_type());
      at::Tensor act = at::silu(gate_up.narrow(1, 0, inter)) * gate_up.narrow(1, inter, inter);
      auto [aq, as] = quantize_per_token(act);
      y.narrow(0, b, c).copy_(int8_project(aq, as, w2[j], (*w2_scale)[j], x.scalar_type()));
    }
  } else if (LinearFn gemv = table(impl).linear[dt]; t == 1 && dt == 1 && gemv != nullptr) {
    at::Tensor gate_up = at::empty({pairs, 2 * inter}, x.options());
    at::Tensor act = at::empty({pairs, inter}, x.options());
    std::vector<int64_t> expert(pairs);
    for (int64_t s = 0; s < pairs; ++s) expert[s] = r.expert[r.order[s]];
    one_token_team(gemv, ANYCORE_PICK(silu_and_mul, impl, dt), x, expert, w13, w2, gate_up, act, y);
  } else {
    at::Tensor rows = x.index_select(0, token_of);
    at::Tensor gate_up = at::empty({pairs, 2 * inter}, x.options());
    at::Tensor act = at::empty({pairs, inter}, x.options());
    GatedActFn silu_mul = ANYCORE_PICK(silu_and_mul, impl, dt);
    auto one_expert = [&](int64_t j) {
      const int64_t b = r.offsets[j], c = r.offsets[j + 1] - b;
      if (c == 0) return;  // no token chose expert j: its weights stay unread
      project(gate_up.narrow(0, b, c), rows.narrow(0, b, c), w13[j], dt, impl);
      silu_mul(act.narrow(0, b, c).data_ptr(), gate_up.narrow(0, b, c).data_ptr(), 2 * inter, c, inter);
      project(y.narrow(0, b, c), act.narrow(0, b, c), w2[j], dt, impl);
    };
    // Experts side by side, one thread each (taken as threads free up), rather than one expert
    // at a time split over the team: an expert's GEMM is small (prefill 256 tokens, top-8 of 64
    // experts: ~32 rows), so its own fork and join cost more than the imbalance between experts.
    // Inside this team the GEMMs and GEMVs run single-threaded (ATen and team_size see the
    // parallel region), each on its own rows: the same bits as one expert at a time. Measured on
    // a 2-core Xeon (AMX), bench moe's layer shape: 256 tokens 23.3 -> 20.7 ms, 64 tokens 17.8 ->
    // 16.3, 1024 tokens 39.5 -> 38.9; bench moe bf16 prefill(256), the whole model: 739-805 ->
    // 940-1012 tok/s. As at::parallel_for does, every thread runs with the caller's ATen
    // thread-local state (inference mode: else an out= GEMM into an inference tensor fails on a
    // worker), and an error in any thread is raised here, after the team (one escaping an
    // OpenMP region would end the process, a server with it).
    const at::ThreadLocalState caller;
    std::exception_ptr failure;
#pragma omp parallel num_threads(static_cast<int>(team_size(e, 1)))
    {
      at::ThreadLocalStateGuard same_state(caller);
#pragma omp for schedule(dynamic, 1)
      for (int64_t j = 0; j < e; ++j) {
        try {
          one_expert(j);
        } catch (...) {
#pragma omp critical(fused_moe_failure)
          if (!failure) failure = std::current_exception();
        }
      }
    }
    if (failure) std::rethrow_exception(failure);
  }
  at::Tensor out = at::zeros({t, h}, x.options().dtype(at::kFloat));
  // (serial: pairs * h adds, small next to the projections; the rows of one token never race)
  if (dt == 0) {
    combine(out.data_ptr<float>(), y.data_ptr<float>(), r, 0, pairs, top_k, h);
  } else {
    combine(out.data_ptr<float>(), y.data_ptr<at::BFloat16>(), r, 0, pairs, top_k, h);
  }
  return out.to(x.scalar_type());
}

}  // namespace anycore::ops
