// How the fused decoder ops (decoder_layer.cpp, decode_team.cpp) receive a layer: the order of
// its weights and of its variant indices. Mirrors _FusedCall in anycore/models/llama.py.
#pragma once
#include <ATen/ATen.h>

#include <optional>

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

}  // namespace anycore::ops
