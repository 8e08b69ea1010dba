// How the fused decoder ops (decoder_layer.cpp, decode_team.cpp) receive a layer: the order of
// its weights and of its variant indices. Mirrors _FusedCall in anycore/models/llama.py.
#pragma once
#include <ATen/ATen.h>
#include <torch/custom_class.h>

#include <memory>
#include <optional>
#include <vector>

namespace anycore::ops {

// weights[], in this order; each projection is (weight, W8A8 scale or None, bias or None)
enum WeightIndex : int {
  kInputNorm, kQkv, kQkvScale, kQkvBias, kQNorm, kKNorm, kO, kOScale, kOBias,
  kPostNorm, kGateUp, kGateUpScale, kGateUpBias, kDown, kDownScale, kDownBias, kNumWeights
};
enum LinearIndex : int { kLinQkv, kLinO, kLinGateUp, kLinDown, kNumLinears };
enum OpIndex : int { kOpRmsNorm, kOpAddRmsNorm, kOpRotary, kOpSiluMul, kOpAttention, kNumOps };

using Weights = c10::List<std::optional<at::Tensor>>;

constexpr int64_t kNativeLinearMaxRows = 4;  // = NATIVE_LINEAR_MAX_ROWS in kernels/dispatch.py

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
