// How the native decoder stack (decoder_layer.cpp, decode_team.cpp) receives a layer: the order
// of its weights and of its variant indices. Python reads the order from here
// (`decoder_layout()`, `native_linear_max_rows()`; anycore/engine/native_executor.py), so the
// two sides cannot drift apart.
#pragma once
#include <ATen/ATen.h>
#include <torch/custom_class.h>

#include <memory>
#include <optional>
#include <vector>

namespace anycore::ops {

// weights[], in this order; each projection is (weight, W8A8 scale or None, bias or None), or
// for GGUF blocks (uint8 weight, anycore/kernels/gguf.py) (blocks, int64 [1] block type, bias or None).
// q_norm / k_norm: [head_dim] per head (Qwen3), or [heads * head_dim] over the whole projection (OLMoE).
// A sparse MLP (anycore/layers/moe.py) fills the router.. slots: router weight [E, hidden] in the
// activation dtype, the stacked experts as fused_moe / fused_moe_w8a8 take them (the scales
// given: int8 experts packed by that variant), int64 [2] (top_k, renormalize); a shared expert
// (Qwen2-MoE) fills gate_up / down and its sigmoid gate [1, hidden] shared_gate; without one
// they stay empty. Dense layers leave the sparse slots empty. clip_qkv (OLMoE's, when set): fp32 [1] c,
// q, k (after their norms) and v clamped to [-c, c].
enum WeightIndex : int {
  kInputNorm, kQkv, kQkvScale, kQkvBias, kQNorm, kKNorm, kO, kOScale, kOBias,
  kPostNorm, kGateUp, kGateUpScale, kGateUpBias, kDown, kDownScale, kDownBias,
  kRouter, kExpertsW13, kExpertsW2, kExpertsW13Scale, kExpertsW2Scale, kExpertsRouting, kSharedGate, kClipQkv, kNumWeights
};
// the slot names Python fills, in WeightIndex order
inline constexpr const char* kWeightNames[kNumWeights] = {
    "input_norm", "qkv.weight", "qkv.scale", "qkv.bias", "q_norm", "k_norm", "o.weight", "o.scale", "o.bias",
    "post_norm", "gate_up.weight", "gate_up.scale", "gate_up.bias", "down.weight", "down.scale", "down.bias",
    "router.weight", "experts.w13", "experts.w2", "experts.w13_scale", "experts.w2_scale", "experts.routing",
    "shared_gate.weight", "clip_qkv"};
// projections' variants; kLinRouter: the `linear` variant of the router and shared gate (-1: at::linear),
// kLinExperts: the fused_moe variant (float experts) or fused_moe_w8a8's (int8); -1 in dense layers
enum LinearIndex : int { kLinQkv, kLinO, kLinGateUp, kLinDown, kLinRouter, kLinExperts, kNumLinears };
enum OpIndex : int { kOpRmsNorm, kOpAddRmsNorm, kOpRotary, kOpSiluMul, kOpAttention, kNumOps };

using Weights = c10::List<std::optional<at::Tensor>>;

// Rows up to which a bf16 projection runs the native GEMV rather than at::linear (oneDNN), on
// this host (decoder_layer.cpp; the `linear` op's Python binding reads the same value).
// 16 rows (four VDPBF16PS tiles of four activation rows), except 8 on x86 hosts with AMX-BF16.
// Measured on a 2-core AMD EPYC (Zen 4 class, no AMX), the four SmolLM2 projections of 30 layers
// with every weight streamed from memory (as in a model step), native vs oneDNN, 2 threads:
// 10.1 vs 18.9 ms at 8 rows, 16.1 vs 22.9 at 12, 21.2 vs 26.8 at 16, 24.8 vs 26.6 at 20, 28.9
// vs 28.3 at 24 (1 thread at 8 rows: 18.8 vs 31.4 ms). Past 8 rows the GEMV is compute-bound
// (about 37% of VDPBF16PS peak at 16 rows), and oneDNN's bf16 GEMM on AMX tiles should win
// there: not measured, so AMX hosts keep the earlier limit of 8. Each row's result does not depend
// on how many rows share the call, so a speculative verify of up to this many tokens computes
// every row as a one-token decode does. The Arm variants use the same limit (their tiles are 4
// rows too); not timed on Arm hardware.
int64_t native_linear_max_rows();

struct TeamPlan;  // decode_team.cpp's pointers derived from a StackWeights

// Every layer's weights and variant indices for decoder_stack, converted from Python once per
// stack (torch.classes.anycore.StackWeights): passed per step as a Tensor?[] list, the 480
// entries of SmolLM2 cost ~70 us a step to convert, ~1% of a decode step.
struct StackWeights : torch::CustomClassHolder {
  Weights weights;                    // weights[kNumWeights * layer + WeightIndex]
  std::vector<int64_t> linear_impls;  // [kNumLinears * layer + LinearIndex]
  std::vector<int64_t> op_impls;      // [OpIndex]
  mutable std::shared_ptr<TeamPlan> team_plan;  // built by the first decode step that uses it

  StackWeights(Weights w, std::vector<int64_t> linear, std::vector<int64_t> ops);
};

}  // namespace anycore::ops
