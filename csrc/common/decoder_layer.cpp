// Every Llama-family decoder layer of a model in one call (decoder_stack): per layer pre-norm
// attention with merged QKV (optional bias, optional Q/K norm per head or over the whole
// projection), RoPE, paged KV, then a SwiGLU MLP with merged gate/up, or a sparse MoE MLP (router,
// routed experts in one fused_moe / fused_moe_w8a8 call, optional sigmoid-gated shared expert).
//
// Why: at batch 1 a decode step is ~15 small ops per layer; from Python each costs an
// interpreter round trip and a few tensor allocations, which added up to ~25% of a SmolLM2
// decode step once the GEMVs ran near memory bandwidth. Here the whole stack is one round trip.
//
// Invariant: this composes exactly the kernels of the unfused path (anycore/models/llama.py
// through anycore/kernels/dispatch.py), in the same order with the same roundings, so both
// paths give bit-identical results (tests/kernels/test_native_paths.py checks it). The only
// differences are where data goes: rotated K and V are written straight into the KV pool.
#include <cstring>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <iterator>
#include <string>
#include <vector>

#include <torch/library.h>

#include "decoder_layout.h"
#include "ops.h"

namespace anycore::ops {
namespace {

at::Tensor required(const Weights& w, int64_t i) {
  std::optional<at::Tensor> t = w.get(i);
  TORCH_CHECK(t.has_value() && t->defined(), "decoder_layer: weight #", i, " is required");
  return *t;
}

std::optional<at::Tensor> optional(const Weights& w, int64_t i) {
  std::optional<at::Tensor> t = w.get(i);
  return t.has_value() && t->defined() ? t : std::nullopt;
}

// One projection. GGUF blocks when the weight is uint8; W8A8 when it has a scale; dense otherwise, on the native GEMV only for bf16
// with at most native_linear_max_rows() rows (measured faster than oneDNN there on x86; on Arm chosen so decode runs as
// one native call, not timed: the same rule as `linear` in kernels/ops.py), ATen's GEMM (float_linear) for everything
// else or when impl < 0.
at::Tensor dense(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, int64_t impl) {
  if (impl >= 0 && x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16 && x.size(0) <= native_linear_max_rows() &&
      weight.is_contiguous())
    return linear(x, weight, bias, impl);
  return float_linear(x, weight, bias);
}

at::Tensor project(const at::Tensor& x, const Weights& w, int64_t first, int64_t impl) {
  at::Tensor weight = required(w, first);
  std::optional<at::Tensor> scale = optional(w, first + 1), bias = optional(w, first + 2);
  // GGUF blocks (uint8): the scale slot holds the block type (decoder_layout.h)
  if (weight.scalar_type() == at::kByte) return gguf_linear(x, weight, required(w, first + 1).item<int64_t>(), bias, impl);
  if (scale.has_value()) return w8a8_linear(x, weight, *scale, bias, impl);
  return dense(x, weight, bias, impl);
}

// The dense SwiGLU MLP in the gate_up / down slots: down(silu(gate) * up).
at::Tensor swiglu(const at::Tensor& x, const Weights& w, int64_t w0, const int64_t* lin, int64_t silu_impl) {
  return project(silu_and_mul(project(x, w, w0 + kGateUp, lin[kLinGateUp]), silu_impl), w, w0 + kDown, lin[kLinDown]);
}

// A sparse MoE MLP (anycore/layers/moe.py SparseMoeBlock): the routed experts of x's rows, plus
// sigmoid(shared_gate(x)) * the shared expert when the layer has one; the same ATen ops in the
// same order as the module, so the same bits.
at::Tensor sparse_mlp(const at::Tensor& x, const Weights& w, int64_t w0, const int64_t* lin, int64_t silu_impl) {
  const at::Tensor logits = dense(x, required(w, w0 + kRouter), std::nullopt, lin[kLinRouter]);
  const at::Tensor routing = required(w, w0 + kExpertsRouting);
  TORCH_CHECK(routing.scalar_type() == at::kLong && routing.numel() == 2, "experts.routing must be int64 [top_k, renormalize]");
  const int64_t top_k = routing.data_ptr<int64_t>()[0];
  const bool renormalize = routing.data_ptr<int64_t>()[1] != 0;
  const at::Tensor w13 = required(w, w0 + kExpertsW13), w2 = required(w, w0 + kExpertsW2);
  at::Tensor out;
  if (auto s13 = optional(w, w0 + kExpertsW13Scale))
    out = fused_moe_w8a8(x, logits, w13, w2, top_k, renormalize, *s13, required(w, w0 + kExpertsW2Scale), lin[kLinExperts]);
  else
    out = fused_moe(x, logits, w13, w2, top_k, renormalize, std::nullopt, std::nullopt, lin[kLinExperts]);
  if (auto gate = optional(w, w0 + kSharedGate))
    out = out + at::sigmoid(dense(x, *gate, std::nullopt, lin[kLinRouter])) * swiglu(x, w, w0, lin, silu_impl);
  return out;
}

// RMSNorm of each head_dim slice of rows [tokens, heads * head_dim] with row stride `stride`
// (Qwen3's q_norm / k_norm); returns contiguous [tokens, heads * head_dim].
at::Tensor head_norm(const at::Tensor& base, const void* src, int64_t stride, int64_t tokens, int64_t heads,
                     int64_t head_dim, const at::Tensor& w, double eps, int64_t impl) {
  const int dt = dtype_index(base);
  TORCH_CHECK(w.scalar_type() == base.scalar_type() && w.numel() == head_dim && w.is_contiguous(),
              "q/k norm weight must be contiguous [head_dim] of the activation dtype");
  at::Tensor out = at::empty({tokens, heads * head_dim}, base.options());
  const int64_t es = base.element_size();
  for (int64_t t = 0; t < tokens; ++t)
    ANYCORE_PICK(rms_norm, impl, dt)(static_cast<char*>(out.data_ptr()) + t * heads * head_dim * es,
                                     static_cast<const char*>(src) + t * stride * es, head_dim, w.data_ptr(), heads,
                                     head_dim, static_cast<float>(eps));
  return out;
}

// What every layer of one forward pass shares, checked and converted once.
struct StepInputs {
  at::Tensor slots, cos, sin;  // [T] int64, [T, D] fp32 each
  const at::Tensor &q_start_loc, &seq_lens, &slot_table;
  int64_t num_heads, num_kv_heads, head_dim;
  double eps, scale;
  // a speculative tree verify (tree_attention's mask: which new keys each new token sees); null:
  // causal attention
  const at::Tensor* tree_mask = nullptr;
};

StepInputs step_inputs(const at::Tensor& hidden, const at::Tensor& slot_mapping, const at::Tensor& cos_in,
                       const at::Tensor& sin_in, const at::Tensor& q_start_loc, const at::Tensor& seq_lens,
                       const at::Tensor& slot_table, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                       double eps, double scale) {
  TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous(), "hidden must be contiguous [tokens, hidden_size]");
  const int64_t T = hidden.size(0), D = head_dim;
  TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && D > 0 && D % 2 == 0, "bad head geometry");
  at::Tensor slots = slot_mapping.to(at::kLong).contiguous();
  TORCH_CHECK(slots.numel() == T, "slot_mapping must have one slot per token");
  at::Tensor cos = cos_in.to(at::kFloat).contiguous(), sin = sin_in.to(at::kFloat).contiguous();
  TORCH_CHECK(cos.numel() == T * D && sin.numel() == T * D, "cos/sin must be [tokens, head_dim]");
  return {slots, cos, sin, q_start_loc, seq_lens, slot_table, num_heads, num_kv_heads, head_dim, eps, scale};
}

// One layer; its weights are weights[w0 + WeightIndex], its projections' variants lin[LinearIndex].
std::tuple<at::Tensor, at::Tensor> run_layer(const at::Tensor& hidden, const std::optional<at::Tensor>& residual,
                                             const Weights& weights, int64_t w0, const int64_t* lin,
                                             c10::IntArrayRef op_impls, const at::Tensor& k_cache,
                                             const at::Tensor& v_cache, const StepInputs& in) {
  const int dt = dtype_index(hidden);
  const int64_t T = hidden.size(0), H = in.num_heads, KV = in.num_kv_heads, D = in.head_dim;
  const int64_t q_size = H * D, kv_size = KV * D, es = hidden.element_size();
  const double eps = in.eps;
  TORCH_CHECK(k_cache.scalar_type() == hidden.scalar_type() && v_cache.scalar_type() == hidden.scalar_type() &&
                  k_cache.dim() == 3 && v_cache.dim() == 3 && k_cache.size(1) == KV && k_cache.size(2) == D &&
                  v_cache.sizes() == k_cache.sizes() && k_cache.stride(1) == D && k_cache.stride(2) == 1 &&
                  v_cache.stride(1) == D && v_cache.stride(2) == 1,
              "k/v cache must be [slots, num_kv_heads, head_dim] of the activation dtype, dense per slot");

  // input norm (the first layer has no residual yet: the embedding is the residual)
  at::Tensor normed, res;
  if (residual.has_value() && residual->defined()) {
    std::tie(normed, res) =
        add_rms_norm(hidden, *residual, required(weights, w0 + kInputNorm), eps, op_impls[kOpAddRmsNorm]);
  } else {
    normed = rms_norm(hidden, required(weights, w0 + kInputNorm), eps, op_impls[kOpRmsNorm]);
    res = hidden;
  }

  // attention: qkv [T, q + 2 kv]; q/k optionally normed per head
  at::Tensor qkv = project(normed, weights, w0 + kQkv, lin[kLinQkv]);
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) == q_size + 2 * kv_size && qkv.stride(1) == 1, "qkv has the wrong width");
  const char* base = static_cast<const char*>(qkv.data_ptr());
  const void* q_src = base;
  const void* k_src = base + q_size * es;
  int64_t q_stride = qkv.stride(0), k_stride = qkv.stride(0);
  at::Tensor qn, kn;
  if (auto qw = optional(weights, w0 + kQNorm)) {
    // per head, or (a norm as wide as the projection: OLMoE) over all heads at once
    const bool whole = qw->numel() == q_size && q_size != D;
    qn = head_norm(qkv, q_src, q_stride, T, whole ? 1 : H, whole ? q_size : D, *qw, eps, op_impls[kOpRmsNorm]);
    kn = head_norm(qkv, k_src, k_stride, T, whole ? 1 : KV, whole ? kv_size : D, required(weights, w0 + kKNorm), eps,
                   op_impls[kOpRmsNorm]);
    q_src = qn.data_ptr(), k_src = kn.data_ptr();
    q_stride = q_size, k_stride = kv_size;
  }
  if (auto clip = optional(weights, w0 + kClipQkv)) {
    // OLMoE: q, k and v clamped after the norms, as torch's clamp does it (Attention.forward)
    TORCH_CHECK(clip->scalar_type() == at::kFloat && clip->numel() == 1, "clip_qkv must be fp32 [1]");
    const double c = clip->item<double>();
    if (qn.defined()) {
      qn.clamp_(-c, c), kn.clamp_(-c, c);
      qkv.narrow(1, q_size + kv_size, kv_size).clamp_(-c, c);
    } else {
      qkv.clamp_(-c, c);  // (the projection's own output: q, k and v at once)
    }
  }
  auto rotary = ANYCORE_PICK(apply_rotary, op_impls[kOpRotary], dt);
  const float* cos = in.cos.data_ptr<float>();
  const float* sin = in.sin.data_ptr<float>();
  at::Tensor q = at::empty({T, H, D}, hidden.options());
  rotary(q.data_ptr(), q_src, q_stride, cos, sin, D, T, H, D);
  // rotated K and raw V go straight to their slots in the pool
  const int64_t* slot = in.slots.data_ptr<int64_t>();
  const int64_t num_slots = k_cache.size(0);
  char* kc = static_cast<char*>(k_cache.data_ptr());
  char* vc = static_cast<char*>(v_cache.data_ptr());
  const char* v_src = base + (q_size + kv_size) * es;
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(slot[t] >= 0 && slot[t] < num_slots, "slot ", slot[t], " outside the KV pool");
    rotary(kc + slot[t] * k_cache.stride(0) * es, static_cast<const char*>(k_src) + t * k_stride * es, k_stride,
           cos + t * D, sin + t * D, D, 1, KV, D);
    std::memcpy(vc + slot[t] * v_cache.stride(0) * es, v_src + t * qkv.stride(0) * es, kv_size * es);
  }
  // (tree_attention is paged_attention's kernel with a mask: the same variant index, kernel_table.h)
  at::Tensor attn = in.tree_mask != nullptr
                        ? tree_attention(q, k_cache, v_cache, in.q_start_loc, in.seq_lens, in.slot_table,
                                         *in.tree_mask, in.scale, op_impls[kOpAttention], 0)
                        : paged_attention(q, k_cache, v_cache, in.q_start_loc, in.seq_lens, in.slot_table, in.scale,
                                          op_impls[kOpAttention], 0);
  at::Tensor o = project(attn.view({T, q_size}), weights, w0 + kO, lin[kLinO]);

  // MLP
  at::Tensor normed2, res2;
  std::tie(normed2, res2) = add_rms_norm(o, res, required(weights, w0 + kPostNorm), eps, op_impls[kOpAddRmsNorm]);
  if (optional(weights, w0 + kRouter)) return {sparse_mlp(normed2, weights, w0, lin, op_impls[kOpSiluMul]), res2};
  return {swiglu(normed2, weights, w0, lin, op_impls[kOpSiluMul]), res2};
}

}  // namespace

StackWeights::StackWeights(Weights w, std::vector<int64_t> linear, std::vector<int64_t> ops)
    : weights(std::move(w)), linear_impls(std::move(linear)), op_impls(std::move(ops)) {
  const int64_t layers = static_cast<int64_t>(weights.size()) / kNumWeights;
  TORCH_CHECK(layers > 0 && static_cast<int64_t>(weights.size()) == layers * kNumWeights, "StackWeights takes ",
              kNumWeights, " weights per layer");
  TORCH_CHECK(static_cast<int64_t>(linear_impls.size()) == layers * kNumLinears && op_impls.size() == kNumOps,
              "StackWeights takes ", kNumLinears, " linear implementation indices per layer and ", kNumOps,
              " op indices");
}

// Every layer of the model in one call: layer l reads weights[kNumWeights l ...], linear_impls[kNumLinears l ...]
// and the pools' slice l ([num_layers, slots, kv_heads, head_dim]). Same results as the layers
// op by op; what it saves is the per-layer trip through Python and the dispatcher (a per-layer
// call still cost about 30 us a layer, 6% of a SmolLM2 bf16 decode step).
// A one-token bf16 step runs in one thread team instead (decode_team.cpp, same results).
std::tuple<at::Tensor, at::Tensor> decoder_stack(
    const at::Tensor& hidden, const c10::intrusive_ptr<StackWeights>& stack, const at::Tensor& k_pool,
    const at::Tensor& v_pool, const at::Tensor& slot_mapping, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& q_start_loc, const at::Tensor& seq_lens, const at::Tensor& slot_table, int64_t num_heads,
    int64_t num_kv_heads, int64_t head_dim, double eps, double scale, const std::optional<at::Tensor>& tree_mask) {
  TORCH_CHECK(k_pool.dim() == 4 && v_pool.dim() == 4 && k_pool.size(0) == v_pool.size(0) && k_pool.size(0) > 0,
              "k/v pools must be [num_layers, slots, num_kv_heads, head_dim]");
  const int64_t layers = k_pool.size(0);
  const Weights& weights = stack->weights;
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == layers * kNumWeights, "decoder_stack: the pools have ", layers,
              " layers, the weights ", weights.size() / kNumWeights);
  // (a tree verify has several new tokens: never the decode team's one-token step)
  if (!tree_mask.has_value()) {
    if (auto out = decode_team(hidden, *stack, k_pool, v_pool, slot_mapping, cos, sin, q_start_loc, seq_lens,
                               slot_table, num_heads, num_kv_heads, head_dim, eps, scale))
      return *out;
  }
  StepInputs in = step_inputs(hidden, slot_mapping, cos, sin, q_start_loc, seq_lens, slot_table, num_heads,
                              num_kv_heads, head_dim, eps, scale);
  if (tree_mask.has_value()) in.tree_mask = &*tree_mask;
  at::Tensor h = hidden;
  std::optional<at::Tensor> res;
  for (int64_t l = 0; l < layers; ++l) {
    auto [out, r] = run_layer(h, res, weights, l * kNumWeights, stack->linear_impls.data() + l * kNumLinears,
                              stack->op_impls, k_pool.select(0, l), v_pool.select(0, l), in);
    h = std::move(out);
    res = std::move(r);
  }
  return {h, *res};
}

std::vector<std::string> decoder_layout() { return {std::begin(kWeightNames), std::end(kWeightNames)}; }

namespace {
bool has_amx_bf16() {
#if defined(__x86_64__)
  // CPUID leaf 7 (sub-leaf 0) EDX bit 22: AMX-BF16
  static const bool amx = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1u);
  }();
  return amx;
#else
  return false;
#endif
}
}  // namespace

int64_t native_linear_max_rows() { return has_amx_bf16() ? 8 : 16; }

int64_t gguf_int8_max_rows() {
#if defined(__x86_64__)
  return has_amx_bf16() ? 16 : 256;
#else
  return 16;
#endif
}

}  // namespace anycore::ops

TORCH_LIBRARY_FRAGMENT(anycore, m) {
  m.def("decoder_layout() -> str[]", &anycore::ops::decoder_layout);
  m.def("native_linear_max_rows() -> int", &anycore::ops::native_linear_max_rows);
}
